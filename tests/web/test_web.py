"""The dashboard in a real browser (Debian's chromium driven by Playwright) against the data
of real nightlies on real gearmand and MinIO: six nights of an engine repository in which the
fifth commit breaks a unit test and makes iiBench ~20 % slower (instructions, so the change is
certain). The farm is stopped before the dashboard starts, as on the morning after an embedded
nightly: every log must come from the copies on disk, not from the MinIO that is gone."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gearfarm.hosts import process
from tests.farmkit import TARGET, add_user, browser_login, six_nights, start_web

BROKEN_TEST = "unit/limits_and_bad_arguments"
RED = "rgb(247, 179, 179)"


@dataclass
class Site:
    url: str
    state: Path
    config: Path
    revs: dict[str, str]
    tokens: dict[str, str]

    def get(self, path: str, token: str | None = None, data: bytes | None = None,
            content_type: str = "application/json") -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=data)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("web")
    farm, _repo, revs = six_nights(base)
    farm.stop()  # the morning after: MinIO and gearmand are gone
    tokens = {name: add_user(farm.config_path, name) for name in ("alice", "bob")}
    proc, url = start_web(farm.config_path, base / "web.log")
    try:
        yield Site(url, farm.state, farm.config_path, revs, tokens)
    finally:
        process.stop(proc, timeout=10)



@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    ctx = browser.new_context()
    pg = ctx.new_page()
    yield pg
    ctx.close()


def login(page, site: Site, name: str) -> None:  # type: ignore[no-untyped-def]
    browser_login(page, site.url, name, site.tokens[name])


def _regression_id(site: Site, kind: str) -> int:
    code, body = site.get(f"/api/regressions?kind={kind}")
    assert code == 200
    regs = json.loads(body)["regressions"]
    assert len(regs) == 1, regs
    return int(regs[0]["id"])


# ---------------------------------------------------------------------------------- status

def test_status_shows_the_failing_stage_in_red_and_a_log_line_is_two_clicks_away(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/")
    cell = page.locator(f"td[data-target='{TARGET}']")
    assert cell.inner_text().strip() == "✘ failed: test-unit"  # in words and a mark, not colour alone
    assert cell.evaluate("e => getComputedStyle(e).backgroundColor") == RED
    # The strip: six nights, oldest first, four green then two red.
    strip = page.locator("table.status .strip a")
    assert [strip.nth(i).get_attribute("class") for i in range(strip.count())] == ["passed"] * 4 + ["failed"] * 2
    assert [strip.nth(i).inner_text() for i in range(strip.count())] == ["✔"] * 4 + ["✘"] * 2

    cell.locator("a").click()  # 1: the run
    page.wait_for_load_state()
    assert page.url.endswith("/run/w6")
    unit = page.locator(f"td[data-cell='{TARGET}/test-unit']")
    assert unit.evaluate("e => getComputedStyle(e).backgroundColor") == RED
    unit.locator("a").click()  # 2: its step's page, the log from the copy on disk (MinIO stopped with the farm)
    page.wait_for_load_state()
    assert "empty index name accepted" in page.inner_text("#log")
    assert page.url.endswith(f"/run/w6/step/{TARGET}/test-unit")
    page.click("text=raw")  # and the raw log a link away
    page.wait_for_load_state()
    assert page.url.endswith(f"/run/w6/log/{TARGET}/test-unit")
    assert "empty index name accepted" in page.inner_text("body")


def test_a_log_lines_link_opens_the_page_at_that_line_and_search_finds_lines(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    base = f"{site.url}/run/w5/step/{TARGET}/test-unit"
    page.goto(base)
    lines = page.locator("#log tr").count()
    assert lines > 15, lines
    page.set_viewport_size({"width": 1000, "height": 300})  # a short window: the line is below its fold
    n = lines - 1  # far down the page: the browser must scroll to it
    page.locator(f"#L{n} td.ln a").click()
    assert page.url == f"{base}#L{n}"
    page.goto("about:blank")
    page.goto(f"{base}#L{n}")  # the shared link, opened afresh
    top = page.evaluate(f"document.getElementById('L{n}').getBoundingClientRect().top")
    assert 0 <= top < page.evaluate("window.innerHeight"), top
    assert page.locator(f"#L{n}").evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 243, 176)"
    page.fill("#log-search", BROKEN_TEST.split("/")[-1])
    assert page.locator("#log tr.hit").count() >= 1
    assert "line" in page.inner_text("#log-hits")
    assert BROKEN_TEST.split("/")[-1] in page.locator("#log tr.hit").first.inner_text()


def test_the_static_report_links_the_logs_copied_beside_it(site: Site) -> None:
    run_dir = site.state / "runs" / "w5"
    html = (run_dir / "report.html").read_text()
    links = set(re.findall(r'href="([^"]+)"', html))
    assert f"logs/{TARGET}/test-unit/log.txt" in links
    assert not any("X-Amz-Signature" in link for link in links)  # no presigned URL to a dead MinIO
    for link in links:
        if not link.startswith(("http", "#", "mailto")):
            assert (run_dir / link).is_file(), link  # every relative link resolves
    assert "empty index name accepted" in (run_dir / "logs" / TARGET / "test-unit" / "log.txt").read_text()


# ------------------------------------------------------------------------------------- run

def test_run_page_has_the_new_failure_its_log_tail_the_change_set_and_timings(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/run/w5")
    new = page.locator("div.failure.new")
    assert new.count() == 1 and BROKEN_TEST in new.locator("h3").inner_text()
    assert "empty index name accepted" in new.locator("pre.tail").inner_text()
    changes = page.locator("#changes + table").inner_text()
    assert "night 5: break limits_and_bad_arguments" in changes and site.revs["w5"][:10] in changes
    assert "night 4" not in changes  # only what changed since the previous run
    timings = page.locator("#timings-table").inner_text()
    assert "build" in timings and "test-unit" in timings
    assert page.locator("#regressions + ul li").count() == 2  # the new failure and the slowdown

    page.goto(site.url + "/run/w6")
    known = page.locator("#known + ul").inner_text()
    assert BROKEN_TEST in known and "w5" in known
    assert page.locator("div.failure.new").count() == 0


def test_test_history_shows_the_test_across_runs_with_its_flakiness(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/run/w5")
    page.locator("div.failure.new h3 a").click()
    page.wait_for_load_state()
    rows = page.locator("#test-grid tr td:nth-child(4)")
    statuses = [re.search(r"passed|failed", rows.nth(i).inner_text()).group(0)  # type: ignore[union-attr]
                for i in range(rows.count())]
    assert statuses == ["failed", "failed", "passed", "passed", "passed", "passed"]  # newest first
    assert rows.nth(1).inner_text().startswith("◆")  # w5: where it changed
    assert "2 failures in 6 runs" in page.inner_text("main") and "not flaky" in page.inner_text("main")
    # Found by name on /tests, and its page has every target as a column.
    page.goto(site.url + "/tests?q=" + BROKEN_TEST.split("/")[1][:6])
    page.locator(f"#tests tr[data-test='{BROKEN_TEST}'] a").click()
    page.wait_for_load_state()
    heads = page.locator("#test-grid th")
    assert [heads.nth(i).inner_text() for i in range(heads.count())][3:] == [TARGET]


# ----------------------------------------------------------------------------- performance

def test_the_series_plot_marks_the_change_point_and_hovering_a_point_names_its_run(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/perf")
    page.get_by_role("link", name="instructions").click()
    page.wait_for_load_state()
    mark = page.locator("svg.series g.mark.regression")
    assert mark.count() == 1
    assert "+2" in mark.get_attribute("data-tip") or "+1" in mark.get_attribute("data-tip")
    points = page.locator("svg.series circle.pt")
    assert points.count() == 6
    # The mark sits between night 4 and night 5 (index 3.5 of 0..5).
    xs = [float(points.nth(i).get_attribute("cx")) for i in range(6)]
    line_x = float(mark.locator("line").get_attribute("x1"))
    assert xs[3] < line_x < xs[4]
    points.nth(4).hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    assert "w5" in tip.inner_text() and site.revs["w5"][:12] in tip.inner_text()
    assert page.locator("svg.ab line.ci").count() >= 1  # the nights' A/B intervals


def test_the_performance_index_shows_a_sparkline_and_the_latest_value_with_its_unit(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/perf")
    row = page.locator("#perf-index tr[data-series='iibench-quick/instructions']")
    assert row.count() == 1
    latest = row.locator("td.latest").inner_text()
    assert latest.endswith("instructions") and float(latest.split()[0]) > 1e6, latest
    spark = row.locator("td.spark svg.trend polyline")
    assert spark.count() == 1 and len(spark.get_attribute("points").split()) == 6  # six nights
    assert "▼" in row.inner_text()  # lower is better
    page.select_option("#perf-filter select[name=benchmark]", "iibench-quick")
    page.click("#perf-filter button[type=submit]")
    page.wait_for_url("**/perf?*benchmark=iibench-quick*")
    assert page.locator("#perf-index tr[data-series]").count() >= 1


def test_the_run_page_names_the_built_commit_its_author_and_subject(site: Site) -> None:
    code, body = site.get("/api/run/w5")
    built = json.loads(body)["built"]
    assert code == 200 and built["rev"] == site.revs["w5"]
    assert built["subject"] == "night 5: break limits_and_bad_arguments, slow down inserts"
    assert built["author"] == "gearfarm-test"
    code, html = site.get("/run/w5")
    assert b"<b>night 5: break limits_and_bad_arguments, slow down inserts</b> \xc2\xb7 gearfarm-test" in html


def test_compare_view_shows_the_slowdown_and_the_test_that_changed(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    # Picked from the lists: B is the latest run (w6), A the one before; pick w4 and w5 instead.
    page.goto(site.url + "/compare")
    assert page.locator("#pick-b").input_value() == "w6" and page.locator("#pick-a").input_value() == "w5"
    page.select_option("#pick-a", "w4")
    page.select_option("#pick-b", "w5")
    page.click("form.picker button[type=submit]")
    page.wait_for_url("**/compare?a=w4&b=w5")
    row = page.locator("tr", has_text="instructions")
    cell = row.locator("td").nth(5)
    assert cell.get_attribute("class") == "regression"
    assert 15 < float(cell.inner_text().replace("%", "").strip()) < 35
    # The planted slowdown: "different", its interval in red beside it.
    assert row.get_attribute("data-verdict") == "different"
    assert "regression" in (row.locator("td.interval").get_attribute("class") or "")
    assert "%" in row.locator("td.interval").inner_text()
    assert "worse: different" in row.locator("td.verdict").inner_text()
    differs = page.locator("h2:has-text('Tests whose status differs') + table").inner_text()
    assert BROKEN_TEST in differs and "✔ passed" in differs and "✘ failed" in differs  # icon and word, not colour alone
    # A run against itself: every figure "same", and no cell coloured.
    page.goto(site.url + "/compare?a=w5&b=w5")
    verdicts = page.locator("#figures tr[data-verdict]")
    assert verdicts.count() >= 1
    assert {verdicts.nth(i).get_attribute("data-verdict") for i in range(verdicts.count())} == {"same"}
    assert page.locator("#figures .regression, #figures .improvement").count() == 0


# ------------------------------------------------------------------------ triage and /api

def test_triage_survives_a_reload_and_shows_for_another_user(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    rid = _regression_id(site, "performance")
    alice = browser.new_context().new_page()
    login(alice, site, "alice")
    alice.goto(f"{site.url}/regression/{rid}")
    alice.select_option("select[name=state]", "investigating")
    alice.fill("input[name=note]", "bisecting the insert path")
    alice.click("#triage-form button")
    alice.wait_for_load_state()
    alice.reload()
    assert "investigating" in alice.locator("#triage-state").inner_text()
    bob = browser.new_context().new_page()
    login(bob, site, "bob")
    bob.goto(f"{site.url}/regressions?kind=performance")
    assert bob.locator(f"tr[data-regression='{rid}'] td.triage").inner_text() == "investigating (alice)"
    bob.goto(f"{site.url}/regression/{rid}")
    assert bob.locator("#triage-by").inner_text() == "alice"
    assert bob.locator("#triage-note").inner_text() == "bisecting the insert path"
    alice.context.close()
    bob.context.close()


def test_unauthorized_or_forged_triage_is_refused_and_changes_nothing(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    rid = _regression_id(site, "failure")
    body = json.dumps({"state": "wontfix", "note": "x"}).encode()
    assert site.get(f"/api/regression/{rid}", data=body)[0] == 403  # no token
    assert site.get(f"/api/regression/{rid}", token="not-a-token", data=body)[0] == 403
    # A form post with no CSRF token (what a third-party page could make a browser send).
    code, _ = site.get(f"/regression/{rid}", data=b"state=wontfix", content_type="application/x-www-form-urlencoded")
    assert code == 403
    # A logged-in browser whose form lost its CSRF token is refused too.
    pg = browser.new_context().new_page()
    login(pg, site, "bob")
    pg.goto(f"{site.url}/regression/{rid}")
    pg.evaluate("document.querySelector('#triage-form input[name=csrf_token]').value = 'forged'")
    pg.select_option("select[name=state]", "wontfix")
    pg.click("#triage-form button")
    pg.wait_for_load_state()
    assert "refused" in pg.inner_text("#error")
    pg.context.close()
    assert json.loads(site.get(f"/api/regression/{rid}")[1])["regression"]["state"] == "untriaged"
    # The same change with a token is accepted, and recorded with its author.
    code, got = site.get(f"/api/regression/{rid}", token=site.tokens["bob"],
                         data=json.dumps({"state": "fixed", "note": "reverted"}).encode())
    assert code == 200, got
    reg = json.loads(got)
    assert (reg["regression"]["state"], reg["regression"]["state_by"]) == ("fixed", "bob")
    assert [e["state"] for e in reg["trail"]] == ["fixed"]


def test_every_page_has_its_json_under_api_and_the_feed_is_atom(site: Site) -> None:
    status = json.loads(site.get("/api/status")[1])
    (proj,) = status["projects"]
    assert proj["latest"]["run_id"] == "w6" and proj["targets"][0]["latest"]["stage"] == "test-unit"
    run = json.loads(site.get("/api/run/w5")[1])
    assert [n["test"] for n in run["new"]] == [BROKEN_TEST] and run["changes"][0]["rev"] == site.revs["w5"]
    assert json.loads(site.get(f"/api/test?name={BROKEN_TEST}")[1])["targets"][0]["failures"] == 2
    assert len(json.loads(site.get("/api/runs")[1])["runs"]) == 6
    (series,) = json.loads(site.get("/api/perf")[1])["series"]
    q = "&".join(f"{k}={series[k]}" for k in ("project", "target", "host_class", "benchmark", "metric"))
    got = json.loads(site.get(f"/api/perf/series?{q}")[1])
    assert len(got["nights"]) == 6 and got["changes"][0]["first_bad_rev"] == site.revs["w5"]
    assert site.get("/api/run/nope")[0] == 404
    code, feed = site.get("/feed.atom")
    assert code == 200
    root = ET.fromstring(feed)
    ns = {"a": "http://www.w3.org/2005/Atom"}
    titles = [e.findtext("a:title", namespaces=ns) for e in root.findall("a:entry", ns)]
    assert len(titles) == 2 and any(BROKEN_TEST in t for t in titles) and any("instructions" in t for t in titles)


def test_the_dashboard_answers_with_no_farm_and_says_what_is_missing(site: Site) -> None:
    code, body = site.get(f"/run/w5/log/{TARGET}/test-nope")
    assert code == 404 and b"no copy on disk" in body
    # Builds are for accounts unless [web] public_artifacts says otherwise.
    code, body = site.get(f"/run/w5/artifact/{TARGET}/build")
    assert code == 403 and b"log in to download builds" in body
    code, body = site.get(f"/run/w5/artifact/{TARGET}/build", token=site.tokens["alice"])
    assert code == 503 and b"artifacts are not copied to disk" in body
    # A path component that is not a run, target or step name reads nothing outside the runs.
    assert site.get(f"/run/%2E%2E/log/{TARGET}/test-unit")[0] == 400
    assert site.get(f"/run/w5/log/{TARGET}/test-unit?file=../../farm.toml")[0] == 400


def test_self_service_on_the_stopped_embedded_farm_says_how_to_start_it(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    """A run started here is a nightly on this config's farm: with the embedded farm stopped
    (it stops after its nightly unless run with --keep) the form says so and how to start it,
    its buttons are off, and a request is refused with the same words instead of starting a
    nightly that cannot submit."""
    start = f"./nightly.bash --keep --state-dir {site.state}"
    login(page, site, "alice")
    page.goto(site.url + "/submit")
    notice = page.locator("#farm-down").inner_text()
    assert notice.startswith("Runs started here need the farm running: the embedded farm in") and start in notice
    assert "gearmand at 127.0.0.1:" in notice and "S3 (MinIO) at" in notice and "do not answer" in notice, notice
    assert "gearfarm farm stop" in notice, notice
    assert page.locator("form.submit button[type=submit]").first.is_disabled()
    code, body = site.get("/api/submit", token=site.tokens["alice"], data=json.dumps({"project": "engine"}).encode())
    assert code == 503 and start in json.loads(body)["error"], body
    assert not list((site.state / "web").glob("*.log"))  # no nightly was started
    # Without an account the refusal is about the account, as before, and the page offers no
    # form to fill in: only the way to log in.
    assert site.get("/api/submit", data=b"{}")[0] == 403
    code, body = site.get("/submit")
    assert code == 200 and b'class="submit"' not in body and b"Log in</a> to start a run" in body


# ------------------------------------------------------------- figures in every night's mail

def test_a_quiet_nights_report_and_mail_carry_every_figure_with_its_trend(site: Site) -> None:
    import email
    from email import policy

    from gearfarm.perf.trend import BLOCKS

    run_dir = site.state / "runs" / "w4"
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["performance"] == []  # nothing moved that night ...
    (fig,) = [f for f in rep["perf_figures"] if f["metric"] == "instructions"]  # ... yet its figure is there
    assert len(fig["trend"]) == 4 and fig["trend"][-1] == fig["value"] and fig["pairs"] == 3
    assert 'class="trend"' in (run_dir / "report.html").read_text()
    msg = email.message_from_bytes((run_dir / "report.eml").read_bytes(), policy=policy.default)
    html = msg.get_body(("html",)).get_content()
    text = msg.get_body(("plain",)).get_content()
    spark = re.search(f"[{BLOCKS}]{{4}}", html)
    assert "Tonight's figures" in html and spark and spark.group(0) in text
    assert 'name="viewport"' in html  # laid out for a phone
    # Night 5's figure shows the step: its last night is the top of its trend.
    w5 = json.loads((site.state / "runs" / "w5" / "report.json").read_text())
    (fig5,) = [f for f in w5["perf_figures"] if f["metric"] == "instructions"]
    assert fig5["change"] > 0.15 and fig5["ci_low"] is not None


def test_trend_blocks_scale_to_the_nights_shown() -> None:
    from gearfarm.perf.trend import blocks

    assert blocks([1.0, 2.0, 3.0, 4.0]) == "▁▃▆█"
    assert blocks([5.0, 5.0, 5.0]) == "▄▄▄"  # flat is the middle, not a fall
    assert blocks([1.0, None, 2.0]) == "▁ █"
    assert blocks([]) == ""


def test_the_run_page_plots_the_curves_the_benchmark_recorded_while_it_ran(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/run/w5")
    chart = page.locator("div.curve[data-benchmark=iibench-quick] svg")
    assert chart.count() == 1 and "insert rate by rows inserted" in chart.get_attribute("aria-label")
    lines = chart.locator("g.line")
    assert lines.count() == 2  # tonight's build and the baseline, from the first pair
    names = sorted(lines.nth(i).get_attribute("data-line") for i in range(2))
    assert names[0].startswith("baseline") and names[1] == "tonight"
    assert all(lines.nth(i).locator("circle.pt").count() == 20 for i in range(2))  # 4000 rows, a point per 200
    run = json.loads(site.get("/api/run/w5")[1])
    (curve,) = run["curves"]
    xs = [x for x, _ in curve["lines"][0]["points"]]
    assert xs == sorted(xs) and xs[-1] == 4000


def test_curves_are_read_from_the_benchmarks_json_lines_one_line_per_split_value() -> None:
    from gearfarm.formats.catalog import Benchmark, Curve
    from gearfarm.step.runner import curves_of

    bench = Benchmark(name="oltp", argv=["x"], metrics={"tps": "higher"},
                      metrics_pattern='"(?P<metric>tps)":(?P<value>[0-9.]+)',
                      curves=[Curve(title="tps", x="second", y="tps", split="threads")])
    out = "\n".join([
        'warming up', '{"type":"interval","phase":"prepare","rows":5,"seconds":0.1}',
        '{"type":"interval","threads":1,"second":1,"tps":100.0}', '{"type":"interval","threads":1,"second":2,"tps":90}',
        '{"type":"interval","threads":4,"second":1,"tps":300.5}', '{not json', '{"type":"summary","tps":97}',
        # JSON lines may say NaN and Infinity, which no record keeps: such points are left out.
        '{"type":"interval","threads":4,"second":2,"tps":NaN}',
        '{"type":"interval","threads":4,"second":3,"tps":-Infinity}'])
    (c,) = curves_of(bench, out, "baseline")
    assert c.variant == "baseline" and c.split_name == "threads"
    assert c.lines == {"1": [(1.0, 100.0), (2.0, 90.0)], "4": [(1.0, 300.5)]}


def test_the_runs_page_lists_every_run_newest_first_with_its_result(site: Site, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(site.url + "/runs")
    rows = page.locator("main table tr")
    got = [(rows.nth(i).locator("td").nth(0).inner_text(), rows.nth(i).locator("td").nth(4).inner_text())
           for i in range(1, rows.count())]
    assert got == [("w6", "failed"), ("w5", "failed")] + [(f"w{n}", "passed") for n in (4, 3, 2, 1)]
    rows.nth(2).locator("a").first.click()
    page.wait_for_load_state()
    assert page.url.endswith("/run/w5")


def test_a_removed_accounts_session_and_token_stop_working(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    from tests.farmkit import gearfarm

    site.tokens["dave"] = add_user(site.config, "dave")
    pg = browser.new_context().new_page()
    login(pg, site, "dave")
    rid = _regression_id(site, "failure")
    pg.goto(f"{site.url}/regression/{rid}")
    assert pg.locator("#triage-form").count() == 1
    assert gearfarm("web", "--config", str(site.config), "user", "remove", "dave").returncode == 0
    pg.reload()
    assert pg.locator("#triage-form").count() == 0 and pg.locator("header a.me").inner_text() == "log in"
    body = json.dumps({"state": "wontfix"}).encode()
    assert site.get(f"/api/regression/{rid}", token=site.tokens["dave"], data=body)[0] == 403
    pg.context.close()
