"""A run's page is made once from its records and read back after (gearfarm.web.pagecache): a
second look at a night reads none of its records, a record that arrives later makes it again,
and what is read back is what would be made; a big night's timings are summed per target with
a target's jobs one click away. (Its speed on a 5,000-job night: bench/big_night.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import event

from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config
from gearfarm.db.results import ResultsDB
from gearfarm.formats.result import CaseResult, ResultRecord
from gearfarm.hosts.net import free_port
from gearfarm.run.ledger import Ledger
from gearfarm.web import dashboard
from gearfarm.web.app import create_app
from gearfarm.web.pagecache import PageCache

RID = "night-1"
TARGETS = ("linux-a", "linux-b")
STEPS = ("build", "test-one", "test-two")
REV = "ab" * 20


def record(target: str, step: str, status: str = "passed", attempt: int = 1) -> ResultRecord:
    test = step != "build"
    return ResultRecord(
        job_id=f"{RID}:{target}:{step}", run_id=RID, target=target, kind="test" if test else "build", step=step,
        name=step.removeprefix("test-") if test else None, rev=REV, status=status, worker="w1",  # type: ignore[arg-type]
        attempt=attempt, started_at=100.0, finished_at=103.0, timings={"queue_wait": 0.5, "test": 2.0},
        host={"hostname": f"host-{target}"},
        cases=[CaseResult(classname=step, name=f"case_{i}", status="failed" if status == "failed" and i == 0
                          else "passed") for i in range(3)] if test else [])


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[tuple[Any, ResultsDB, Ledger, Config]]:
    """A run whose jobs all ran but one (linux-b's test-two, to come), and a dashboard on it."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = ResultsDB(url)
    db.create_run(RID, REV, list(TARGETS), [f"{RID}:{t}:{s}" for t in TARGETS for s in STEPS], created_at=90.0)
    ledger = Ledger(db)
    for t in TARGETS:
        for s in STEPS:
            if (t, s) != ("linux-b", "test-two"):
                assert ledger.apply(record(t, s, "failed" if (t, s) == ("linux-a", "test-one") else "passed"),
                                    "collect") == "applied"
    db.finish_run(RID, "finished")  # a running run's page shows its wall time so far: made each time
    cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                 farm=FarmConfig(state_dir=str(tmp_path / "state")))
    yield create_app(cfg, db).test_client(), db, ledger, cfg
    db.engine.dispose()


def records_read(db: ResultsDB) -> list[str]:
    """The statements that read job records (jobs.record), appended to as they run."""
    seen: list[str] = []

    def look(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "jobs.record" in statement or "json_remove(jobs.record" in statement:
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", look)
    return seen


def test_a_second_look_at_a_run_reads_none_of_its_records_and_a_late_one_makes_it_again(
        farm: tuple[Any, ResultsDB, Ledger, Config]) -> None:
    client, db, ledger, _cfg = farm
    reads = records_read(db)
    first = client.get(f"/run/{RID}").get_data(as_text=True)
    assert reads, "the first look makes the page from the records"
    assert 'data-cell="linux-b/test-two" title="expected, no result">missing' in first and "Missing jobs" in first
    reads.clear()
    for path in (f"/run/{RID}", f"/api/run/{RID}"):
        assert client.get(path).status_code == 200
    assert reads == [], f"a look at an unchanged run read its records again: {reads}"
    # The job that had not reported does, and a failed one is delivered again as passed
    # (attempt 2, which the ledger ranks first): the page is made again, with both.
    assert ledger.apply(record("linux-b", "test-two"), "collect") == "applied"
    assert ledger.apply(record("linux-a", "test-one", "passed", attempt=2), "collect") == "applied"
    again = client.get(f"/run/{RID}").get_data(as_text=True)
    assert reads, "a record came in and the page was read back as it was"
    assert 'data-cell="linux-b/test-two">✔ passed' in again and "Missing jobs" not in again
    api = client.get(f"/api/run/{RID}").get_json()
    assert api["matrix"]["linux-a"]["test-one"]["status"] == "passed"
    assert {j["job_id"] for j in api["jobs"]} == {f"{RID}:{t}:{s}" for t in TARGETS for s in STEPS}


def test_what_a_run_page_reads_back_is_what_it_would_make(farm: tuple[Any, ResultsDB, Ledger, Config]) -> None:
    client, db, _ledger, cfg = farm
    client.get(f"/api/run/{RID}")  # made and kept
    kept = client.get(f"/api/run/{RID}").get_json()
    made = dashboard.run(db, cfg, RID)
    assert made is not None
    assert kept == json.loads(json.dumps(made.as_dict())), "the page read back differs from the page made"
    assert all("cases" not in j for j in kept["jobs"]) and len(kept["job_timings"]) == 5


def test_a_big_nights_timings_are_summed_per_target_and_a_targets_jobs_listed_when_asked(
        farm: tuple[Any, ResultsDB, Ledger, Config], monkeypatch: pytest.MonkeyPatch) -> None:
    client, _db, _ledger, _cfg = farm
    monkeypatch.setattr(dashboard, "TIMING_ROWS", 3)  # five jobs: a "big" night
    html = client.get(f"/run/{RID}").get_data(as_text=True)
    summed = html[html.index('<table id="target-timings">'):]
    summed = summed[:summed.index("</table>")]
    assert summed.count("<tr") == 3 and 'href="?target=linux-a#timings-table">linux-a</a>' in summed
    # linux-a: three jobs of 3 s each, one failed.
    row = summed[summed.index("linux-a</a>"):]
    assert row.startswith("linux-a</a></td><td>3</td><td class=\"failed\">1</td><td>9.0 s</td>"), row[:200]
    assert 'id="timings-table"' not in html
    one = client.get(f"/run/{RID}?target=linux-b").get_data(as_text=True)
    rows = one[one.index('<table id="timings-table">'):]
    rows = rows[:rows.index("</table>")]
    assert rows.count("<tr><td>linux-b</td>") == 2 and "linux-a" not in rows
    assert len(client.get(f"/api/run/{RID}").get_json()["job_timings"]) == 5  # the JSON has every job's


def test_a_big_nights_page_shows_a_target_whose_jobs_spent_nothing_outside_their_stages(
        farm: tuple[Any, ResultsDB, Ledger, Config], monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's "other" (its time in no stage) under 5 ms is not shown; when that was every job of
    a target, its summed row had no "other" at all, and the big night's page answered 500
    (`bench/scale.py` at one host, whose jobs' farm part became that short)."""
    client, _db, ledger, _cfg = farm
    monkeypatch.setattr(dashboard, "TIMING_ROWS", 3)  # five jobs: a "big" night
    for s in ("build", "test-one"):
        quick = record("linux-b", s, attempt=2).model_copy(update={"timings": {"test": 3.0}})
        assert ledger.apply(quick, "collect") == "applied"
    got = client.get(f"/run/{RID}")
    assert got.status_code == 200, got.get_data(as_text=True)[-500:]
    summed = got.get_data(as_text=True)
    summed = summed[summed.index('<table id="target-timings">'):]
    row = summed[summed.index("linux-b</a>"):]
    assert row.startswith("linux-b</a></td><td>2</td><td>0</td><td>6.0 s</td>"), row[:200]
    assert row[:row.index("</tr>")].endswith("<td></td>"), "linux-b's jobs had no time outside their stages"


def test_a_kept_page_decodes_only_what_it_shows_and_the_api_writes_its_big_parts_unread(
        farm: tuple[Any, ResultsDB, Ledger, Config], monkeypatch: pytest.MonkeyPatch) -> None:
    """A 5,000-job night's /api/run decoded and encoded its 7 MB again at every look, 0.1-0.2 s
    of the dashboard's CPU on this machine, and /run and /tests decoded what their kept HTML
    already shows (docs/speed.md, twenty-fifth round)."""
    client, _db, _ledger, _cfg = farm
    monkeypatch.setattr(dashboard, "TIMING_ROWS", 3)  # five jobs: a "big" night
    monkeypatch.setattr(dashboard, "TESTS_COLUMNS", 1)
    paths = (f"/run/{RID}?target=linux-b", f"/api/run/{RID}", "/tests", "/api/tests")
    first = {p: client.get(p).get_data() for p in paths}  # made and kept
    decoded: list[Any] = []
    real = orjson.loads
    monkeypatch.setattr(orjson, "loads", lambda b: decoded.append(real(b)) or decoded[-1])

    def look(path: str) -> list[Any]:
        decoded.clear()
        body = client.get(path).get_data()
        assert body == first[path], f"{path} read back differs from what was made"
        return list(decoded)

    heads = look(f"/run/{RID}?target=linux-b")
    assert [type(x) for x in heads] == [dict, list] and "headline" in heads[0] and "matrix" not in heads[0], heads
    assert {t["target"] for t in heads[1]} == {"linux-b"}, "the page decoded another target's timings"
    assert [set(x) >= {"headline", "counts"} for x in look(f"/api/run/{RID}")] == [True], \
        "the JSON decoded the matrix, the timings or the records it writes out as they were kept"
    for path in ("/tests", "/api/tests"):
        got = look(path)
        assert len(got) == 1 and "found" in got[0] and "tests" not in got[0], (path, got)
    api = orjson.loads(first[f"/api/run/{RID}"])
    assert api["matrix"]["linux-b"]["test-one"]["status"] == "passed" and len(api["job_timings"]) == 5


def test_the_page_cache_holds_at_most_its_budget_dropping_the_least_recently_read() -> None:
    cache = PageCache(budget=3000)
    doc = {"page": {"x": "y" * 900}}
    for name in ("a", "b", "c"):
        cache.put((name,), "v1", doc)
    assert cache.get(("a",), "v1", ("page",)) == doc  # read: now the most recent
    cache.put(("d",), "v1", doc)
    assert cache.size <= 3000
    assert cache.get(("b",), "v1", ("page",)) is None and cache.get(("a",), "v1", ("page",)) == doc
    assert cache.get(("a",), "v2", ("page",)) is None  # another version of the run: not this one
    cache.put(("huge",), "v1", {"page": "z" * 5000})  # over the whole budget: not kept at all
    assert cache.get(("huge",), "v1", ("page",)) is None and cache.size <= 3000


def test_a_running_runs_page_is_made_each_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = ResultsDB(url)
    db.create_run(RID, REV, ["linux-a"], [f"{RID}:linux-a:build"], created_at=90.0)
    assert Ledger(db).apply(record("linux-a", "build"), "collect") == "applied"
    cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                 farm=FarmConfig(state_dir=str(tmp_path / "state")))
    client = create_app(cfg, db).test_client()
    reads = records_read(db)
    walls = []
    for _ in range(2):
        walls.append(client.get(f"/api/run/{RID}").get_json()["wall_seconds"])
    assert len(reads) >= 2 and walls[1] > walls[0], "a running run's page was kept: its wall time stood still"
    cases: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda _c, _k, statement, *_: cases.append(statement) if "FROM cases" in statement else None)
    assert client.application.extensions["gearfarm.warm"]() == 0
    assert cases == [], "making pages ahead read a running night's cases, to keep nothing"
    db.engine.dispose()


def test_the_tests_page_sums_many_targets_and_reads_the_cases_again_only_when_a_run_changed(
        farm: tuple[Any, ResultsDB, Ledger, Config], monkeypatch: pytest.MonkeyPatch) -> None:
    client, db, ledger, _cfg = farm
    monkeypatch.setattr(dashboard, "TESTS_COLUMNS", 1)  # two targets: "many"
    reads: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda _c, _k, statement, *_: reads.append(statement) if "FROM cases" in statement else None)
    html = client.get("/tests").get_data(as_text=True)
    assert reads
    row = html[html.index('<tr data-test="one/case_0">'):]
    row = row[:row.index("</tr>")]
    assert '<td class="failed">1: linux-a</td>' in row and "<td>100 %</td><td>2</td>" in row, row
    assert "linux-b</th>" not in html  # no column per target
    reads.clear()
    assert client.get("/tests").status_code == 200 and client.get("/api/tests").status_code == 200
    assert reads == [], "the tests of unchanged runs were read again"
    assert ledger.apply(record("linux-a", "test-one", "passed", attempt=2), "collect") == "applied"
    row = client.get("/api/tests").get_json()["tests"]
    assert reads and not any(t["failing"] for t in row), "a run changed and the tests page did not"


def test_the_front_and_runs_pages_read_an_ended_runs_jobs_once_and_again_when_one_changed(
        farm: tuple[Any, ResultsDB, Ledger, Config]) -> None:
    client, db, ledger, _cfg = farm
    reads: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda _c, _k, statement, *_: reads.append(statement) if "FROM jobs" in statement else None)
    latest = {t["target"]: t["latest"] for t in client.get("/api/status").get_json()["projects"][0]["targets"]}
    assert reads and latest["linux-a"]["state"] == "failed" and latest["linux-b"]["state"] == "missing"
    reads.clear()
    for path in ("/", "/api/status", "/runs", "/api/runs"):
        assert client.get(path).status_code == 200
    assert reads == [], "the front page or the runs page read an unchanged ended run's jobs again"
    assert ledger.apply(record("linux-b", "test-two"), "collect") == "applied"
    latest = {t["target"]: t["latest"] for t in client.get("/api/status").get_json()["projects"][0]["targets"]}
    assert reads and latest["linux-b"]["state"] == "passed", "a record came in and the front page did not show it"
    assert client.get("/api/runs").get_json()["runs"][0]["result"] == "failed"  # linux-a's test-one still


def test_the_newest_ended_runs_pages_are_made_ahead_so_the_first_look_reads_nothing(
        farm: tuple[Any, ResultsDB, Ledger, Config]) -> None:
    client, db, _ledger, _cfg = farm
    assert client.application.extensions["gearfarm.warm"]() == 1  # `gearfarm web` does it every 20 s
    reads = records_read(db)
    cases: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda _c, _k, statement, *_: cases.append(statement) if "FROM cases" in statement else None)
    html = client.get(f"/run/{RID}").get_data(as_text=True)
    assert 'data-cell="linux-a/test-one"' in html and client.get("/tests").status_code == 200
    assert reads == [] and cases == [], "the first look made what was made ahead"
    assert client.application.extensions["gearfarm.warm"]() == 1 and reads == []  # kept: only checked
