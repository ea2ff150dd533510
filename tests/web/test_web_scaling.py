"""The run page and compare cost the same on a long history as on a short one: the work the
database does for them (SQLite's virtual-machine steps, counted by its progress handler, a
figure that repeats exactly where wall time does not) must not grow with the number of past
runs. bench/web_speed.py times the pages on 1,000 runs; this catches the next page that reads
the whole history in CI, on two small databases of the bench's own shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event

from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config
from gearfarm.db.results import ResultsDB
from gearfarm.hosts.net import free_port
from gearfarm.report import publisher
from gearfarm.web import dashboard
from gearfarm.web.app import create_app
from tests.farmkit import bench_module

SHORT, LONG = 36, 108
# What a page may grow by from SHORT to three times as many runs: B-tree depth and the like.
GROWTH = 1.25


class Steps:
    """Counts SQLite VM steps on every connection of an engine (in units of 100)."""

    def __init__(self, db: ResultsDB) -> None:
        self.count = 0

        def on_connect(conn: Any, _record: Any) -> None:
            conn.set_progress_handler(self._tick, 100)

        event.listen(db.engine, "connect", on_connect)
        db.engine.dispose()  # connections made before the listener do not count: none are kept

    def _tick(self) -> int:
        self.count += 1
        return 0

    def of(self, fn: Callable[[], Any]) -> int:
        before = self.count
        fn()
        return self.count - before


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Any, Steps, list[str]]]:
    bench = bench_module("web_speed")
    out = {}
    for runs in (SHORT, LONG):
        where = tmp_path_factory.mktemp(f"history{runs}")
        url = f"sqlite:///{where / 'results.db'}"
        db = ResultsDB(url)
        run_ids = bench.populate(db, runs)
        for rid in (run_ids[-1], run_ids[len(run_ids) // 2]):  # their reports' verdicts, as published
            run = db.get_run(rid)
            assert run is not None
            publisher.classify(db, run, db.jobs(rid))
        cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                     farm=FarmConfig(state_dir=str(where / "state")))
        app = create_app(cfg, db)
        out[runs] = (app.test_client(), Steps(db), run_ids)
    return out


@pytest.mark.parametrize("page", ["/run/{last}", "/api/run/{last}", "/run/{middle}",
                                  "/compare?a={middle}&b={last}", "/api/compare?a={middle}&b={last}",
                                  "/tests?q=case_01", "/hosts", "/run/{last}/step/linux-t00/test-unit", "/perf",
                                  "/test?name=unit/case_01", "/api/test?name=unit/case_01", "/tests"])
def test_a_page_costs_the_same_on_three_times_the_history(histories: dict[int, tuple[Any, Steps, list[str]]],
                                                          page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The test pages read a fixed number of the newest runs (200 and 30): fewer here, so that
    # both histories are longer than what they read, as 1,000 nights are.
    monkeypatch.setattr(dashboard, "TEST_RUNS", 12)
    monkeypatch.setattr(dashboard, "TESTS_RUNS", 12)
    cost = {}
    for runs, (client, steps, run_ids) in histories.items():
        path = page.format(last=run_ids[-1], middle=run_ids[len(run_ids) // 2])

        def get(path: str = path, client: Any = client) -> None:
            resp = client.get(path)
            assert resp.status_code == 200, resp.data[:500]
        get()  # the first fetch warms what is cached per process (git log, the catalog)
        cost[runs] = steps.of(get)
    assert cost[SHORT] > 0
    assert cost[LONG] <= cost[SHORT] * GROWTH, (
        f"{page}: {cost[SHORT] * 100} SQLite steps on {SHORT} runs, {cost[LONG] * 100} on {LONG}: the page does "
        "work that grows with the history")
