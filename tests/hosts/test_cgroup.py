"""Each job command's cgroup (gearfarm/hosts/cgroup.py) on this host's kernel: the command is in
its group from its first instruction (its supervisor writes it in before exec), the group's
limits hold and the one reached is named, the group is emptied and removed when the command
ends, and a worker that starts removes what a dead one left. In both layouts: cgroup v1 (this
machine's pids, memory and cpu hierarchies) and v2 (its unified hierarchy, which has no
controllers here but has cgroup.procs and cgroup.kill). Every group made here is under the
test's own cgroup and removed by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.hosts import cgroup, process

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root (or a delegated cgroup)")
ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


@pytest.fixture
def tree() -> Iterator[cgroup.Tree]:
    t = cgroup.detect(1)
    existed = {root: root.is_dir() for root in t.roots.values()}
    yield t
    t.release()
    assert all(not root.exists() or existed[root] for root in t.roots.values())


def test_a_command_is_in_its_group_from_its_first_instruction_and_the_group_goes_after(
        tree: cgroup.Tree, tmp_path: Path) -> None:
    group = tree.group(cgroup.Limits(32, 64 * MiB, 50))
    log = tmp_path / "log"
    # The command's first instruction is the shell reading its own cgroup: already the group's.
    rc, _ = process.run_logged(["cat", "/proc/self/cgroup"], log, 30, cgroup=group.procs())
    assert rc == 0, log.read_text()
    said = log.read_text()
    for controller, d in group.dirs.items():
        assert f":{controller}:" in said and said.split(f":{controller}:")[1].split("\n")[0].endswith(
            "/" + "/".join(d.parts[-3:])), said
    assert (group.dirs["pids"] / "pids.max").read_text().strip() == "32"
    assert int((group.dirs["memory"] / "memory.limit_in_bytes").read_text()) == 64 * MiB
    assert (group.dirs["cpu"] / "cpu.shares").read_text().strip() == str(50 * 1024 // 100)
    group.close()
    assert not any(d.exists() for d in group.dirs.values())


def test_the_limit_reached_is_named_with_the_peaks(tree: cgroup.Tree, tmp_path: Path) -> None:
    bomb = tree.group(cgroup.Limits(processes=16))
    rc, _ = process.run_logged(["sh", "-c", "for i in $(seq 40); do sleep 5 & done; wait"], tmp_path / "bomb", 60,
                               cgroup=bomb.procs())
    used = bomb.usage()
    bomb.close()
    assert used.reached == "process limit 16 reached" and used.processes_peak == 16, used
    hog = tree.group(cgroup.Limits(memory=64 * MiB))
    rc, _ = process.run_logged([sys.executable, "-c", "b = bytearray(1 << 30)"], tmp_path / "hog", 60,
                               cgroup=hog.procs())
    used = hog.usage()
    hog.close()
    assert rc == -9 and used.reached == "memory limit 64 MiB reached", (rc, used)
    assert used.memory_peak is not None and used.memory_peak <= 64 * MiB
    fine = tree.group(cgroup.Limits(16, 64 * MiB))
    process.run_logged(["true"], tmp_path / "fine", 60, cgroup=fine.procs())
    assert fine.usage().reached == ""
    fine.close()


def test_a_group_that_cannot_be_joined_runs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log"
    rc, _ = process.run_logged(["sh", "-c", "echo $((6 * 7))"], log, 30, cgroup=["/nonexistent/cgroup.procs"])
    assert rc == 127 and "42" not in log.read_text()
    assert "cannot start the job in its cgroup" in log.read_text(), log.read_text()


def test_a_starting_worker_empties_and_removes_what_a_dead_one_left(tree: cgroup.Tree) -> None:
    # A worker that died mid-job: its owner name, and a process of its job still in its group.
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{dead.pid}-1-{process.boot_id()[:12]}"
    left = [root / name / "0" for root in tree.roots.values()]
    for d in left:
        d.mkdir(parents=True)
    orphan = subprocess.Popen(["sleep", "300"])
    try:
        for d in left:
            (d / "cgroup.procs").write_text(str(orphan.pid))
        mine = tree.group(cgroup.Limits())  # a live worker's (this process's) group stays
        removed = tree.sweep()
        assert sorted(removed) == sorted(d.parent for d in left)
        assert orphan.wait(10) == -9
        assert all(not d.parent.exists() for d in left) and all(d.exists() for d in mine.dirs.values())
        mine.close()
    finally:
        orphan.kill()
        orphan.wait()


V2 = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from gearfarm.hosts import cgroup, process
    tree = cgroup.detect(2)
    group = tree.group(cgroup.Limits(8))
    log = Path(sys.argv[1])
    rc, _ = process.run_logged(["sh", "-c", "cat /proc/self/cgroup; sleep 300 & sleep 300 & echo started"], log, 60,
                               cgroup=group.procs())
    here = Path("/proc/self/cgroup").read_text()
    procs = group.members()
    group.close()
    print(json.dumps({"rc": rc, "dir": str(group.dirs[""]), "gone": not group.dirs[""].exists(), "procs": procs,
                      "worker": here, "root": str(tree.roots[""])}))
    tree.release()
""")


def test_v2_the_worker_leaves_its_group_for_a_leaf_and_its_jobs_are_killed_whole(tmp_path: Path) -> None:
    """v2 (this machine's unified hierarchy): the worker moves itself to a leaf of its own (a
    group whose children have controllers holds no process), the command joins its group before
    exec, and closing the group kills what the command left (cgroup.kill) and removes it."""
    unified = next((m for m in [cgroup._mounts()[1]] if m is not None), None)
    if unified is None:
        pytest.skip("no cgroup2 mount")
    log = tmp_path / "log"
    p = subprocess.run([sys.executable, "-c", V2, str(log)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    base = cgroup._place(unified, cgroup._own()[""])
    try:
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got["rc"] == 0 and got["gone"], (got, log.read_text())
        rel = "/" + os.path.relpath(got["dir"], unified[0])
        assert f"0::{rel}\n" in log.read_text(), log.read_text()
        assert f"0::/{os.path.relpath(base / cgroup.WORKERS, unified[0])}/" in got["worker"]
        # The reaper killed the command's two sleeps; cgroup.kill would have, had it not.
        assert got["procs"] == []
    finally:
        for d in (base / cgroup.TOP, base / cgroup.WORKERS):
            for sub in sorted((Path(x) for x, _, _ in os.walk(d)), key=lambda q: len(q.parts), reverse=True):
                deadline = time.monotonic() + 10
                while sub.exists():
                    try:
                        sub.rmdir()
                    except OSError:
                        assert time.monotonic() < deadline, f"{sub} stays"
                        time.sleep(0.1)
