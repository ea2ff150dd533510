"""Take the dashboard's screenshots in docs/screenshots/ (`make screenshots`): six real
nightlies on an embedded farm (the history tests/web/test_web.py uses: a unit test broken and
inserts made slower by the fifth commit), `gearfarm web` over them, a triage, a self-service
run in progress for the live page, and each view in Debian's chromium. Takes ~2 minutes."""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gearfarm.hosts import process  # noqa: E402
from tests.farmkit import TARGET, add_user, commit, six_nights, start_web  # noqa: E402

OUT = Path(__file__).resolve().parent


def call(url: str, token: str, body: dict) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="gf-shots-") as d:
        base = Path(d)
        print("six nightlies …", flush=True)
        farm, repo, _revs = six_nights(base)
        proc = None
        try:
            token = add_user(farm.config_path, "alice")
            proc, url = start_web(farm.config_path, base / "web.log")
            regs = json.loads(urllib.request.urlopen(url + "/api/regressions?kind=performance").read())["regressions"]
            call(f"{url}/api/regression/{regs[0]['id']}", token,
                 {"state": "investigating", "note": "bisecting the insert path"})
            series = json.loads(urllib.request.urlopen(url + "/api/perf").read())["series"][0]
            q = "&".join(f"{k}={series[k]}" for k in ("project", "target", "host_class", "benchmark", "metric"))
            commit(repo, "night 7: try the fix")
            run_id = call(f"{url}/api/submit", token, {"project": "engine", "targets": [TARGET], "suites": ["unit"],
                                                        "benchmarks": ["iibench-quick"]})["run_id"]
            views = [("status", "/"), ("run", "/run/w5"), ("log", f"/run/w5/step/{TARGET}/test-unit#L12"),
                     ("tests", "/tests?q=limits"),
                     ("test-history", "/test?name=unit/limits_and_bad_arguments"), ("performance", "/perf"),
                     ("series", f"/perf/series?{q}"), ("compare", "/compare?a=w4&b=w5"),
                     ("compare-pick", "/compare"), ("regressions", "/regressions"),
                     ("regression", f"/regression/{regs[0]['id']}"), ("submit", "/submit")]
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url + "/login")
                page.fill("input[name=name]", "alice")
                page.fill("input[name=token]", token)
                page.click("button[type=submit]")
                deadline = time.monotonic() + 300
                while True:  # the live page while the self-service run's jobs run
                    page.goto(url + "/live")
                    if page.locator("td.state.running").count() or time.monotonic() > deadline:
                        break
                    time.sleep(1)
                page.screenshot(path=str(OUT / "live.png"), full_page=True)
                page.goto(url + "/hosts")  # its workers, one of them running the self-service run's step
                page.screenshot(path=str(OUT / "hosts.png"), full_page=True)
                for name, path in views:
                    page.goto(url + path)
                    if name == "series":
                        page.locator("svg.series circle.pt").nth(4).hover()
                    if name == "log":
                        page.fill("#log-search", "limits_and_bad_arguments")
                    page.screenshot(path=str(OUT / f"{name}.png"), full_page=name not in ("log", "run"))
                    print(f"  {name}.png", flush=True)
                call(f"{url}/api/run/{run_id}/cancel", token, {})
                browser.close()
        finally:
            if proc is not None:
                process.stop(proc, timeout=10)
            farm.stop()
    print(f"screenshots in {OUT}")


if __name__ == "__main__":
    main()
