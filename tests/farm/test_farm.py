"""The embedded farm's own life: a start that fails leaves nothing running, and a stop ends
every process it started (gearmand, MinIO, the collector, every worker slot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearfarm.formats import catalog
from gearfarm.hosts import process
from gearfarm.run.farm import EmbeddedFarm, FarmError

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_start_stops_what_it_started(tmp_path: Path) -> None:
    # Workers whose Python cannot start (a broken install, as far as the farm can tell).
    farm = EmbeddedFarm(tmp_path / "state", ROOT, worker_env={"PYTHONHOME": str(tmp_path / "no-python")})
    started: list[int] = []
    original = farm.spawn

    def spawn(name: str, args: list[str]) -> None:
        original(name, args)
        started.append(farm.procs[name].pid)  # type: ignore[attr-defined]

    farm.spawn = spawn  # type: ignore[method-assign]
    with pytest.raises(FarmError, match="did not register") as err:
        farm.start(catalog.load_file(ROOT / "jobs" / "catalog.toml"), ["linux-x86_64"])
    assert "Python" in str(err.value), "the error should show the dead worker's log"
    assert started, "the farm should have spawned workers"
    servers = [farm.gearmand, farm.minio]
    assert all(s is not None for s in servers)
    # Nothing the failed start made is left alive: not the workers, not gearmand, not MinIO.
    assert [pid for pid in started if process.start_time(pid) is not None] == []
    assert farm.gearmand is not None and farm.gearmand.pid is None
    assert farm.minio is not None and farm.minio.proc is None
    assert not (tmp_path / "state" / "farm.json").exists()


def test_stop_ends_every_process(tmp_path: Path) -> None:
    farm = EmbeddedFarm(tmp_path / "state", ROOT, slots=2)
    farm.start(catalog.load_file(ROOT / "jobs" / "catalog.toml"), ["linux-x86_64"], perf=True)
    pids = [p.pid for p in farm.procs.values()]  # type: ignore[attr-defined]
    assert sorted(farm.procs) == ["collector", "perf", "slot-1", "slot-2"]
    assert farm.gearmand is not None and farm.minio is not None and farm.minio.proc is not None
    pids += [farm.gearmand.pid or 0, farm.minio.proc.pid]
    farm.stop()
    assert [pid for pid in pids if process.start_time(pid) is not None] == []
