"""The dashboard's live page, self-service runs and cancel, in Debian's chromium against a
running embedded farm (real gearmand, MinIO and workers): a logged-in user starts a run of a
new revision with a suite that would take a minute, watches it on the live page, and cancels
it; the suite's command is stopped within seconds, the jobs end as cancelled, and the nightly
that owned the run reports and exits. Without an account nothing can be started or cancelled."""

from __future__ import annotations

import http.client as http_client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gearfarm.formats import catalog as catalog_mod
from gearfarm.hosts import process
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import TARGET, add_user, api_call, commit, edit_catalog, gearfarm, make_repo, start_web

SLEEPY = """
[suites.sleepy]
description = "a suite that takes a minute: something to cancel"
argv = ["sleep", "60"]
timeout = 300
"""


@dataclass
class Live:
    url: str
    farm: EmbeddedFarm
    repo: Path
    token: str

    def call(self, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
        return api_call(self.url, path, body, token)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    base = tmp_path_factory.mktemp("live")
    repo = make_repo(base / "repo")
    cat = repo / "jobs" / "catalog.toml"
    cat.write_text(cat.read_text() + SLEEPY)
    edit_catalog(repo, 'suites = ["unit", "model", "recovery"]', 'suites = ["unit", "model", "recovery", "sleepy"]',
                 "a sleepy suite")
    farm = EmbeddedFarm(base / "state", repo)
    proc = None
    try:
        farm.start(catalog_mod.load_file(cat), [TARGET])
        p = gearfarm("nightly", "--config", str(farm.config_path), "--targets", TARGET, "--suites", "unit",
                     "--benchmarks", "none", "--run-id", "l1", timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        token = add_user(farm.config_path, "carol")
        proc, url = start_web(farm.config_path, base / "web.log")
        yield Live(url, farm, repo, token)
    finally:
        if proc is not None:
            process.stop(proc, timeout=10)
        farm.stop()


def _sleepers() -> list[int]:
    """Processes running the sleepy suite's command (`sleep 60`)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and process.cmdline(int(d.name)) == ["sleep", "60"]:
            out.append(int(d.name))
    return out



def test_the_live_page_shows_gearmand_functions_with_their_workers(live: Live, browser) -> None:  # type: ignore[no-untyped-def]
    page = browser.new_page()
    page.goto(live.url + "/live")
    table = page.locator("table.functions").inner_text()
    for fn in (f"build:{TARGET}", f"test:{TARGET}", "collect"):
        row = page.locator("table.functions tr", has_text=fn).first
        assert int(row.locator("td").nth(3).inner_text()) >= 1, table  # workers registered
    assert page.locator("meta[http-equiv=refresh]").count() == 0  # nothing running: no reloading
    page.close()


def test_nothing_is_started_or_cancelled_without_an_account(live: Live) -> None:
    assert live.call("/api/submit", {"project": "engine", "targets": [TARGET]})[0] == 403
    assert live.call("/api/submit", {"project": "engine"}, token="wrong")[0] == 403
    assert live.call("/api/run/l1/cancel", {})[0] == 403
    code, body = live.call("/api/submit", {"project": "engine", "rev": "--upload-pack=evil"}, token=live.token)
    assert code == 400 and "revision" in body["error"]
    code, body = live.call("/api/submit", {"project": "nope"}, token=live.token)
    assert code == 400 and "no project 'nope'" in body["error"]
    code, body = live.call("/api/run/l1/cancel", {}, token=live.token)
    assert code == 409 and "finished" in body["error"]  # a finished run has nothing to cancel
    req = urllib.request.Request(live.url + "/submit", data=b"project=engine",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 403  # no CSRF token


def test_a_self_service_run_starts_real_jobs_shows_live_and_cancel_stops_them(live: Live, browser) -> None:  # type: ignore[no-untyped-def]
    rev = commit(live.repo, "a revision to try from the dashboard")
    page = browser.new_page()
    page.goto(live.url + "/login")
    page.fill("input[name=name]", "carol")
    page.fill("input[name=token]", live.token)
    page.click("button[type=submit]")
    page.goto(live.url + "/submit")
    form = page.locator("form.submit[data-project=engine]")
    form.locator("input[name=rev]").fill(rev)
    for box in form.locator("input[name=targets]").all():
        box.set_checked(box.get_attribute("value") == TARGET)
    for box in form.locator("input[name=suites]").all():
        box.set_checked(box.get_attribute("value") == "sleepy")
    form.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert "/live" in page.url
    run_id = page.url.rsplit("#run-", 1)[1]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}-engine-by-carol", run_id)

    # The run appears, and its suite starts running on a real worker.
    job = f"{run_id}:{TARGET}:test-sleepy"
    deadline = time.monotonic() + 240
    while True:
        page.goto(f"{live.url}/live")
        cell = page.locator(f"tr[data-job='{job}'] td.state")
        if cell.count() and cell.inner_text() == "running":
            break
        assert time.monotonic() < deadline, page.inner_text("main")
        time.sleep(1)
    assert page.locator(f"tr[data-job='{run_id}:{TARGET}:build'] td.state").inner_text() == "passed"
    assert page.locator("meta[http-equiv=refresh]").count() == 1  # the page follows the run by itself
    started = time.time()
    assert _sleepers(), "the suite's command is not running"
    # /hosts: the farm's workers (a build and a test worker on this host, at least two), each with
    # the targets it registered, and the one running the suite names its step.
    page.goto(f"{live.url}/hosts")
    workers = page.locator("#hosts div.worker")
    assert workers.count() >= 2, page.inner_text("main")
    texts = [workers.nth(i).inner_text() for i in range(workers.count())]
    assert all(TARGET in text for text in texts), texts
    assert any("build" in text.split(":", 1)[-1] for text in texts) and any("test" in text for text in texts), texts
    running = page.locator("#hosts a.running")
    assert running.count() == 1 and running.inner_text() == f"{TARGET}/test-sleepy", page.inner_text("main")

    page.goto(f"{live.url}/live")
    page.locator(f"#run-{run_id} form.cancel-run button").click()
    page.wait_for_load_state()
    assert "was cancelled by carol" in page.inner_text(f"#run-{run_id}")
    deadline = time.monotonic() + 60
    while True:
        code, run = live.call(f"/api/run/{run_id}")
        if code == 200 and run["state"] != "running":
            break
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    sleepy = next(j for j in run["jobs"] if j["step"] == "test-sleepy")
    assert sleepy["status"] == "cancelled"
    assert sleepy["finished_at"] - started < 20  # stopped within seconds, not after sleep's 60
    assert run["matrix"][TARGET]["build"]["status"] == "passed"
    assert "1 cancelled" in run["headline"]
    # The worker stopped the command itself, within a heartbeat or two (not just the ledger's
    # record): the command is gone long before its minute, and the worker's log says why.
    deadline = time.monotonic() + 20
    while _sleepers():
        assert time.monotonic() < deadline, "the suite's command outlived the cancel"
        time.sleep(0.2)
    assert time.time() - started < 20
    logs = "".join(p.read_text(errors="replace") for p in (live.farm.state / "logs").glob("*.log"))
    assert f"({job}) was cancelled: stopping it" in logs
    # The nightly that owned the run ended; the live page lists it as exited.
    deadline = time.monotonic() + 60
    while True:
        page.goto(f"{live.url}/live")
        text = page.inner_text("main")
        if "exited" in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.5)
    page.close()


def test_the_dashboard_behind_the_farms_tls_answers_only_verified_https(live: Live, tmp_path: Path) -> None:
    import ssl
    from urllib.parse import urlparse

    from gearfarm.hosts.tls import Stunnel, client_context, create_ca, create_server_cert

    ca = create_ca(tmp_path / "ca")
    server = create_server_cert(ca, ["127.0.0.1"], tmp_path / "web.crt", tmp_path / "web.key")
    other = create_ca(tmp_path / "other")  # a CA that is not the farm's
    web = urlparse(live.url)
    with Stunnel(tmp_path / "stunnel", (web.hostname or "", web.port or 0), server.cert, server.key) as st:
        host, port = st.address
        with urllib.request.urlopen(f"https://{host}:{port}/api/live", context=client_context(ca.cert),
                                    timeout=30) as r:
            assert r.status == 200 and "gearmand" in json.loads(r.read())
        with pytest.raises(urllib.error.URLError) as e:
            urllib.request.urlopen(f"https://{host}:{port}/api/status", context=client_context(other.cert), timeout=30)
        assert isinstance(e.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((urllib.error.URLError, ConnectionError, http_client.RemoteDisconnected)):
            urllib.request.urlopen(f"http://{host}:{port}/api/status", timeout=30)  # plaintext gets no page


def test_cancelling_one_job_stops_it_and_lets_the_rest_of_the_run_finish(live: Live) -> None:
    rev = commit(live.repo, "a revision whose sleepy suite is cancelled alone")
    code, got = live.call("/api/submit", {"project": "engine", "rev": rev, "targets": [TARGET],
                                          "suites": ["unit", "sleepy"], "benchmarks": "none"}, token=live.token)
    assert code == 200, got
    run_id = got["run_id"]
    job = f"{run_id}:{TARGET}:test-sleepy"
    deadline = time.monotonic() + 240
    while True:
        code, state = live.call("/api/live")
        jobs = {j["job_id"]: j["state"] for r in state["runs"] if r["run_id"] == run_id for j in r["jobs"]}
        if jobs.get(job) == "running":
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    assert live.call(f"/api/run/{run_id}/cancel", {"job": f"{run_id}:{TARGET}:nope"}, token=live.token)[0] == 400
    code, got = live.call(f"/api/run/{run_id}/cancel", {"job": job}, token=live.token)
    assert code == 200, got
    deadline = time.monotonic() + 90
    while True:
        code, run = live.call(f"/api/run/{run_id}")
        if code == 200 and run["state"] != "running":
            break
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    steps = {j["step"]: j["status"] for j in run["jobs"]}
    assert steps == {"build": "passed", "test-unit": "passed", "test-sleepy": "cancelled"}
    assert run["headline"] == "1 cancelled"
    assert "the job was cancelled by carol" in next(j for j in run["jobs"] if j["step"] == "test-sleepy")["message"]
