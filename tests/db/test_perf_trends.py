"""perf_trends, the run page's reading of every series' last nights at once, gives each series
exactly what its own window (perf_series) gives: also for a series that missed nights, whose
window reaches further back than the project's last nights."""

from __future__ import annotations

from pathlib import Path

from gearfarm.db.results import ResultsDB, SampleRow
from tests.farmkit import bench_module


def test_trends_of_all_series_at_once_equal_each_series_own_window(tmp_path: Path) -> None:
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    run_ids = bench_module("web_speed").populate(db, 10)
    # One series skipped two of the last nights (its benchmark failed there): its window of 4
    # must reach back past them.
    gap = ("linux-t01", "bench-class", "oltp", "tps")
    with db.writing() as conn:
        conn.execute(SampleRow.__table__.delete().where(
            SampleRow.run_id.in_(run_ids[-3:-1]), SampleRow.target == gap[0], SampleRow.benchmark == gap[2],
            SampleRow.metric == gap[3]))
    last = db.get_run(run_ids[-1])
    assert last is not None
    keys = db.perf_keys(last.run_id)
    assert gap in keys and len(keys) == 100
    trends = db.perf_trends("engine", keys, last.created_at, 4)
    for key in keys:
        own = [v["new"] for _, _, v in db.perf_series("engine", *key, last.created_at, 4)]
        assert trends[key] == own, key
        assert len(own) == 4
    nights = [rid for rid, _, _ in db.perf_series("engine", *gap, last.created_at, 4)]
    assert nights == [run_ids[-6], run_ids[-5], run_ids[-4], run_ids[-1]]
