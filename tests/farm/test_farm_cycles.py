"""No farm process outlives its farm's stop (issue #76, case 11): start/stop cycles of the
embedded farm (real gearmand, MinIO, the collector, worker slots), each with a tiny night, each
stopped while one of its slots is being restarted by the farm's supervisor, either by the
farm's own process or by `gearfarm farm stop` from another one while that supervisor still runs.
After every stop, no process of the farm is left: none below this test's process and none
anywhere whose command line names the cycle's own state directory (a slot re-parented away
from the test is found so).

Before the change `gearfarm farm stop` SIGTERMed the processes its state file listed while the
supervisor restarted every one that died (writing the file anew, not atomically), then removed
the file: the restarted slots and collector were left, their gearmand gone, logging "lost
gearmand … reconnecting" for ever, which this test saw in the first cycle stopped that way.

GEARFARM_CYCLES sets the count (default 4: make test; 50 for the issue's full check), which
prints each cycle's seconds."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import descendants, gearfarm
from tests.projects import CATALOG_TINY, _init

CYCLES = int(os.environ.get("GEARFARM_CYCLES", "4"))
TINY = CATALOG_TINY


def _naming(state: Path) -> dict[int, list[str]]:
    """Live processes whose command line names ``state`` (this cycle's own temporary directory):
    the farm's, wherever they were re-parented."""
    found = {}
    mark = str(state).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{name}/cmdline").read_bytes()
            st = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if mark in raw and st[st.rindex(b")") + 2:][:1] not in (b"Z", b"X"):
            found[int(name)] = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]
    return found


def _left(state: Path, before: set[int]) -> dict[int, list[str]]:
    """The processes this test started since ``before`` (its children then) that still live,
    and those anywhere that name the cycle's state directory."""
    return {pid: argv for pid, argv in {**descendants([os.getpid()]), **_naming(state)}.items() if pid not in before}


@pytest.mark.timeout(120 + 120 * CYCLES)
def test_no_farm_process_outlives_a_stop_made_while_a_slot_restarts(tmp_path: Path) -> None:
    repo = tmp_path / "tiny"
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": TINY})
    (tmp_path / "no-repo").mkdir()
    cat = catalog_mod.parse(TINY, "tiny")
    before = set(descendants([os.getpid()]))
    seconds = []
    for n in range(CYCLES):
        t0 = time.monotonic()
        state = tmp_path / f"state-{n}"
        farm = EmbeddedFarm(state, tmp_path / "no-repo", slots=2,
                            projects=[ProjectConfig(name="tiny", repo=str(repo))])
        try:
            farm.start([cat])
            night = gearfarm("nightly", "--config", str(farm.config_path), "--project", "tiny", timeout=300)
            assert night.returncode == 0, night.stdout + night.stderr
            # A slot dies; the supervisor (a poll a second) restarts it while the farm is stopped.
            os.kill(farm.procs["slot-1"].pid, signal.SIGKILL)  # type: ignore[attr-defined]
            time.sleep(0.2 * (n % 6))
            if n % 2:
                # From another process, as `gearfarm farm stop` after `nightly --keep`, while this
                # process's supervisor still runs.
                stopped = gearfarm("farm", "stop", "--state-dir", str(state), timeout=120)
                assert stopped.returncode == 0 and "stopped:" in stopped.stdout, stopped.stdout + stopped.stderr
                # What a supervisor restarted before the stop read the state file was in it.
                left = _left(state, before)
                assert not left, f"cycle {n}: left after gearfarm farm stop: {left}"
        finally:
            farm.stop()
        left = _left(state, before)
        assert not left, f"cycle {n}: left after the farm's stop: {left}"
        assert not (state / "farm.json").exists()
        seconds.append(time.monotonic() - t0)
    print(f"\n{CYCLES} start/night/stop cycles: {sum(seconds):.0f}s, each {min(seconds):.1f}-{max(seconds):.1f}s "
          f"(mean {sum(seconds) / len(seconds):.1f}s); no farm process left after any stop")


@pytest.mark.timeout(600)
def test_a_kept_farms_workers_exit_once_their_gearmand_is_gone_for_good(tmp_path: Path) -> None:
    """`nightly --keep` leaves the farm without its process; every process it started is in the
    state file (its supervisor ended first). Its gearmand killed (no stop to say so), the slots
    and the collector, their parent and their gearmand gone, exit after [farm] orphan_wait (30 s
    on the embedded farm) instead of logging "reconnecting" for ever; `farm stop` ends the rest."""
    import json

    from gearfarm.run.farm import ORPHAN_WAIT

    repo = tmp_path / "tiny"
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": TINY})
    state = tmp_path / "state"
    try:
        night = gearfarm("nightly", "--repo", str(repo), "--state-dir", str(state), "--slots", "2", "--keep",
                         timeout=300)
        assert night.returncode == 0, night.stdout + night.stderr
        recorded = json.loads((state / "farm.json").read_text())["pids"]
        assert set(recorded) == {"gearmand", "minio", "collector", "slot-1", "slot-2"}, recorded
        workers = {n: pid for n, pid in recorded.items() if n in ("collector", "slot-1", "slot-2")}
        running = _naming(state)
        assert set(workers.values()) <= set(running), (workers, running)
        os.kill(recorded["gearmand"], signal.SIGKILL)
        gone_at = time.monotonic()
        while set(workers.values()) & set(_naming(state)):
            assert time.monotonic() - gone_at < ORPHAN_WAIT + 60, \
                f"the kept farm's workers outlived their gearmand: {_naming(state)}"
            time.sleep(0.5)
        print(f"\nworkers exited {time.monotonic() - gone_at:.0f}s after their gearmand was killed")
        log = (state / "logs" / "slot-1.log").read_text()
        assert "no gearmand has answered for" in log, log[-2000:]
    finally:
        gearfarm("farm", "stop", "--state-dir", str(state), timeout=120)
    assert not _naming(state), _naming(state)
