"""A step's log as a page (/run/<run>/step/<target>/<step>): numbered lines with #L<n>
anchors, the step's host, status and duration, its commands, where the output was capped, the
run's other steps on the target, a raw link; ANSI escapes stripped and the job's text escaped.
The run page's matrix links here. (In Chromium, on real nightlies: tests/web/test_web.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config
from gearfarm.db.results import ResultsDB
from gearfarm.hosts.net import free_port
from gearfarm.web.app import create_app
from tests.farmkit import bench_module

LOG = ("gearfarm test of engine for linux-t00 at abc on host-0\n"
       "$ make -s test\n"
       "\x1b[1;31mFAIL\x1b[0m unit/case_05 <script>window.name='ran'</script>\n"
       "\n*** 1234 bytes of output dropped here (log capped at 1 MiB: [farm] log_limit) ***\n"
       "last line\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, str]:
    where = tmp_path_factory.mktemp("steps")
    url = f"sqlite:///{where / 'results.db'}"
    db = ResultsDB(url)
    run_ids = bench_module("web_speed").populate(db, 3)
    rid = run_ids[-1]
    log = where / "state" / "runs" / rid / "logs" / "linux-t00" / "test-unit" / "log.txt"
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                 farm=FarmConfig(state_dir=str(where / "state")))
    return create_app(cfg, db).test_client(), rid


def test_a_step_page_numbers_the_lines_and_says_what_ran_where(site: tuple[Any, str]) -> None:
    client, rid = site
    resp = client.get(f"/run/{rid}/step/linux-t00/test-unit")
    assert resp.status_code == 200 and resp.content_type.startswith("text/html")
    html = resp.get_data(as_text=True)
    assert '<tr id="L1"><td class="ln"><a href="#L1">1</a>' in html and 'id="L6"' in html and 'id="L7"' not in html
    assert "\x1b" not in html and "FAIL unit/case_05" in html
    assert "<script>window.name" not in html and "&lt;script&gt;window.name=" in html
    assert re.search(r'<a href="#L2">line 2</a> <code>make -s test</code>', html)
    assert '<tr id="L5" class="capped">' in html and 'href="#L5">output capped at line 5</a>' in html
    assert "host-0" in html and re.search(r"<span class=\"badge (passed|failed)\">(✔ passed|✘ failed)</span>", html)
    assert f'href="/run/{rid}/log/linux-t00/test-unit">raw</a>' in html
    assert f'href="/run/{rid}/step/linux-t00/build">build' in html  # the target's other steps
    assert f'href="/run/{rid}">' in html  # back to the run
    # Its record (made as before files were bound to records) names no sha256: said, not hidden.
    assert 'id="log-unchecked"' in html and "unchecked" in html


def test_the_run_matrix_links_each_step_page_and_unknown_steps_are_404(site: tuple[Any, str]) -> None:
    client, rid = site
    html = client.get(f"/run/{rid}").get_data(as_text=True)
    assert f'href="/run/{rid}/step/linux-t00/test-unit"' in html
    assert client.get(f"/run/{rid}/step/linux-t00/test-nope").status_code == 404
    assert client.get("/run/nosuch/step/linux-t00/build").status_code == 404
    assert client.get(f"/run/{rid}/step/..%2F..%2Fx/build").status_code in (400, 404)


def test_the_api_index_lists_every_endpoint_with_its_page(site: tuple[Any, str]) -> None:
    client, rid = site
    index = client.get("/api/").get_json()
    paths = {e["path"]: e for e in index["endpoints"]}
    assert {"/api/status", "/api/runs", "/api/run/<run_id>", "/api/compare", "/api/submit"} <= set(paths)
    assert paths["/api/run/<run_id>"]["page"] == "/run/<run_id>" and paths["/api/status"]["page"] == "/"
    assert paths["/api/submit"]["methods"] == ["POST"] and "Bearer" in index["auth"]
    status = client.get("/").get_data(as_text=True)
    assert '<a href="/api/">/api/</a>' in status


def test_the_run_pages_timings_account_for_every_jobs_time_and_name_its_host(site: tuple[Any, str]) -> None:
    client, rid = site
    data = client.get(f"/api/run/{rid}").get_json()
    clocked = ("lookup", "source", "download", "verify", "build", "upload", "test")
    for j in data["job_timings"]:
        parts = sum(j.get(k, 0.0) for k in clocked) + (j["other"] or 0.0)
        assert abs(parts - j["duration"]) < 0.01, j
        assert j["host"]
    assert [k for k, _ in data["timing_columns"]] == ["queue_wait", "build", "test"]  # no always-empty column
    html = client.get(f"/run/{rid}").get_data(as_text=True)
    assert "<th>queued</th>" in html and "<th>export</th>" not in html and "queue_wait" not in html


def test_tests_lists_and_finds_tests_with_their_status_per_target(site: tuple[Any, str]) -> None:
    client, rid = site
    every = client.get("/api/tests").get_json()
    assert every["found"] == 20 and len(every["targets"]) == 10
    found = client.get("/api/tests?q=CASE_07").get_json()  # any case
    assert [t["test"] for t in found["tests"]] == ["unit/case_07"]
    cell = found["tests"][0]["targets"]["linux-t00"]
    assert cell["runs"] == 3 and cell["last"] in ("passed", "failed") and cell["mean_seconds"] == 0.01
    html = client.get("/tests?q=case_07").get_data(as_text=True)
    assert 'href="/test?name=unit/case_07"' in html and html.count("<td class=") == 10
    assert "No test matches “nothing-like-this”" in client.get("/tests?q=nothing-like-this").get_data(as_text=True)
    run = client.get(f"/run/{rid}").get_data(as_text=True)
    assert re.search(r'<span class="cases" title="test cases passed of all">\d+/20</span>', run)  # per suite


def test_the_performance_index_shows_latest_values_units_sparklines_and_filters(site: tuple[Any, str]) -> None:
    client, _rid = site
    data = client.get("/api/perf").get_json()
    assert len(data["series"]) == 100 and data["benchmarks"] == ["compress", "iibench-betree", "oltp"]
    tps = next(s for s in data["series"] if (s["target"], s["benchmark"], s["metric"]) == ("linux-t00", "oltp", "tps"))
    assert tps["unit"] == "tx/s" and tps["higher_is_better"] and 900 < tps["latest"] < 1200
    assert len(tps["trend"]) == 3 and all(v is not None for v in tps["trend"])
    p99 = next(s for s in data["series"] if s["metric"] == "p99_ms_t4")
    assert p99["unit"] == "ms" and p99["higher_is_better"] is False
    only = client.get("/api/perf?target=linux-t03&benchmark=oltp").get_json()["series"]
    assert {(s["target"], s["benchmark"]) for s in only} == {("linux-t03", "oltp")} and len(only) == 3
    html = client.get("/perf?target=linux-t03&benchmark=oltp").get_data(as_text=True)
    row = html[html.index('data-series="oltp/tps"'):]
    row = row[:row.index("</tr>")]
    assert '<span class="unit">tx/s</span>' in row and "<svg" in row and "▲" in row


def test_a_series_page_names_its_unit_and_machine_and_draws_no_empty_ab_chart(site: tuple[Any, str]) -> None:
    client, _rid = site
    q = "project=engine&target=linux-t00&host_class=bench-class&benchmark=oltp&metric=p99_ms_t4"
    data = client.get(f"/api/perf/series?{q}").get_json()
    assert data["unit"] == "ms"
    html = client.get(f"/perf/series?{q}").get_data(as_text=True)
    assert "oltp p99_ms_t4 (ms)" in html and "p99_ms_t4 (ms)</text>" in html  # the y axis says its unit
    assert "A/B: tonight" in html  # these nights have pairs
    # A first night has no pairs (no last good build yet): no A/B chart of nothing, a sentence.
    from gearfarm.web import dashboard

    first = {**data, "nights": [dict(data["nights"][0], ab_change=None, ab_low=None, ab_high=None)], "changes": [],
             "annotations": []}
    top, bottom = dashboard.series_charts(first)
    assert "<svg" in top and bottom == ""


def test_a_tests_page_has_a_column_per_target_with_times_and_status_changes(site: tuple[Any, str]) -> None:
    client, rid = site
    data = client.get("/api/test?name=unit/case_05").get_json()
    assert len(data["columns"]) == 10 and [r["run_id"] for r in data["grid"]][0] == rid  # newest first
    cells = data["grid"][0]["cells"]
    assert set(cells) == set(data["columns"]) and all(c["seconds"] == 0.01 for c in cells.values())
    oldest = data["grid"][-1]["cells"]
    assert not any(c["changed"] for c in oldest.values())  # nothing before the first run to change from
    for col in data["columns"]:  # a change is marked exactly where the status flips
        seq = [r["cells"][col]["status"] for r in reversed(data["grid"])]
        marks = [r["cells"][col]["changed"] for r in reversed(data["grid"])]
        assert marks == [False] + [(a == "failed") != (b == "failed") for a, b in zip(seq, seq[1:], strict=False)]
    html = client.get("/test?name=unit/case_05").get_data(as_text=True)
    assert html.count("<th>linux-t0") == 10 and "0.0 s" in html
