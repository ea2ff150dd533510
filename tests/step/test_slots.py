"""What a worker slot takes from its host for its jobs (gearfarm/step/sandbox.py): a uid of its
own for its whole life, which no other process of the host (another slot, another farm's) holds
at once, from a lock directory only root can write; and its jobs' cgroups, or, where the host
gives it none, a line in its log saying so, or a refusal to start when [farm] job_limits =
"required"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from gearfarm.step import sandbox as sandbox_mod
from gearfarm.step.sandbox import SandboxError, slot_uid

ROOT = Path(__file__).resolve().parents[2]
FIRST = 2_000_000_100

TAKE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gearfarm.step.sandbox import SandboxError, slot_uid
    try:
        uid = slot_uid(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
        assert slot_uid(0, 1, Path("/nonexistent")) == uid  # the slot's for its life: asked again, the same
        print(uid, flush=True)
    except SandboxError as e:
        print("refused:", e, flush=True)
    sys.stdin.read()  # held until the test lets go
""")


def _slot(locks: Path, count: int) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-c", TAKE, str(FIRST), str(count), str(locks)], cwd=ROOT, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid locks are root's")
def test_each_slot_takes_a_uid_no_other_process_of_the_host_holds(tmp_path: Path) -> None:
    locks = tmp_path / "job-uids"
    slots = [_slot(locks, 3) for _ in range(3)]
    try:
        assert sorted(int(said) for _, said in slots) == [FIRST, FIRST + 1, FIRST + 2], slots
        extra, said = _slot(locks, 3)
        assert said.startswith("refused: every job uid from 2000000100 to 2000000102") and "job_uids" in said
        extra.communicate("")
        # A slot that ends lets its uid go: the next one takes it.
        gone, uid = slots.pop(1)
        gone.communicate("")
        slots.append(_slot(locks, 3))
        assert slots[-1][1] == uid
    finally:
        for p, _ in slots:
            p.communicate("")


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid locks are root's")
def test_a_lock_directory_another_user_could_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker asks once for its life; pytest's process may have asked already (a sandbox made by
    # an earlier test): this one asks as a new process would.
    monkeypatch.setattr(sandbox_mod, "_slot", None)
    locks = tmp_path / "job-uids"
    locks.mkdir()
    locks.chmod(0o777)
    with pytest.raises(SandboxError, match=r"job-uids holds the host's job uid locks but is owned by uid 0 with "
                                           r"mode 777: another user could take or fake them"):
        slot_uid(FIRST, 3, locks)


UNBOUNDED = textwrap.dedent("""
    import logging, sys
    from gearfarm.config import Config, FarmConfig
    from gearfarm.step.sandbox import SandboxError, for_config
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    cfg = Config(farm=FarmConfig(state_dir=sys.argv[1], sandbox="none", job_limits=sys.argv[2]))
    try:
        box = for_config(cfg)
        print("started, cgroups:", box.cgroups)
    except SandboxError as e:
        print("refused:", e)
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the worker's start as another user, which needs root")
@pytest.mark.parametrize("mode", ["if-available", "required"])
def test_a_worker_that_cannot_make_cgroups_says_so_or_refuses_when_limits_are_required(
        tmp_path: Path, mode: str) -> None:
    """A worker that is not root and has no delegated cgroup (here: nobody) cannot bound its
    jobs: it says so at start and runs them unbounded, or refuses to start."""
    home = Path(tempfile.mkdtemp(prefix="gearfarm-nobody-"))  # where nobody can reach it (not under root's 0700)
    try:
        os.chown(home, 65534, 65534)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            UNBOUNDED, str(home / "state"), mode], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "GEARFARM_CACHE": str(home / "cache"), "HOME": str(home)})
    finally:
        shutil.rmtree(home)
    assert p.returncode == 0, p.stderr
    if mode == "required":
        assert "refused: [farm] job_limits = \"required\", and cannot make job cgroups under" in p.stdout, p.stdout
    else:
        assert "WARNING jobs run without process, memory and CPU limits: cannot make job cgroups under" in p.stdout
        assert "run the worker as root, or in a cgroup delegated to it" in p.stdout
        assert "started, cgroups: None" in p.stdout, p.stdout
