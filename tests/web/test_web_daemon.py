"""The dashboard as the long-running daemon a lab keeps for months: what it holds open is fixed
when it starts, not by the busiest moment it has lived through. The 200-night soak saw its
descriptors step from 10-11 to 12-13 one night and stay there: the first night on which pages
overlapped made the database pool open one more connection (on SQLite the file and its WAL)
and keep it, as a leak would look."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

from gearfarm.db.results import ResultsDB
from gearfarm.hosts import process
from tests.farmkit import bench_module, settled_descriptors, start_web


def _populate(url: str, runs: int) -> list[str]:
    db = ResultsDB(url)
    try:
        return bench_module("web_speed").populate(db, runs)
    finally:
        db.engine.dispose()


def test_the_dashboards_descriptors_do_not_grow_when_pages_overlap(db_url: str, tmp_path: Path) -> None:
    """On SQLite a connection is the file and its WAL; on PostgreSQL a socket."""
    url = db_url
    runs = _populate(url, 12)
    config = tmp_path / "farm.toml"
    config.write_text(f'[database]\nurl = "{url}"\n\n[farm]\nstate_dir = "{tmp_path / "state"}"\n\n'
                      # Nothing listens there: the pages asked for read the database only.
                      '[s3]\nendpoint = "http://127.0.0.1:9"\n')
    proc, base = start_web(config, tmp_path / "web.log")
    try:
        before = settled_descriptors(proc.pid)
        pages = ["/", "/runs", f"/run/{runs[-1]}", f"/api/run/{runs[-2]}", "/tests", "/hosts",
                 f"/compare?a={runs[3]}&b={runs[-1]}"]
        answered: list[int] = []

        def ask(page: str) -> None:
            with urllib.request.urlopen(base + page, timeout=60) as r:
                r.read()
                answered.append(r.status)

        for _ in range(3):  # 21 requests at once, three times: more than the server's threads
            threads = [threading.Thread(target=ask, args=(p,)) for p in pages * 3]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert answered == [200] * 63
        assert settled_descriptors(proc.pid) == before
    finally:
        process.stop(proc, timeout=10)
