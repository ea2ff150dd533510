"""Tests of gearfarm.hosts.process and gearfarm.step.reaper with real processes, no mocks: a job's whole
process tree dies with the job and with its worker (even on kill -9 of the worker), exit codes
and timeouts come back exactly, a dead worker's job directories are swept, and stopping a farm
from its state file kills only the processes it can prove it started."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gearfarm.config import Config, FarmConfig
from gearfarm.hosts import process
from gearfarm.run.farm import STATE_FILE, EmbeddedFarm, stop_from_state
from gearfarm.step.sandbox import SandboxError, for_config

ROOT = Path(__file__).resolve().parents[2]


def new_marker() -> str:
    """A sleep duration no other process on the host has in its argv: it names one test's tree."""
    return f"300.{random.randrange(10**9):09d}"


def with_marker(marker: str) -> list[int]:
    """Live (non-zombie) processes with ``marker`` as an argument."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in args and process.start_time(int(name)) is not None:
            found.append(int(name))
    return found


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def marker() -> Iterator[str]:
    m = new_marker()
    yield m
    # A failing test must not leave its sleeps behind: kill them by pid (the marker is ours).
    for pid in with_marker(m):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# Commands whose trees have grandchildren, and how many sleeps each runs: children in the
# command's process group, one that left it (setsid), one daemonised (double fork + setsid).
TREES = {
    "children and a setsid child": ("sleep {m} & sleep {m} & setsid sleep {m} & wait", 3),
    "a daemonised grandchild": ('(setsid sh -c "sleep {m} & sleep {m} &" &); sleep {m}', 3),
}

WORKER = """
import sys
from pathlib import Path
from gearfarm.hosts.process import run_logged
print(run_logged(sys.argv[2:], Path(sys.argv[1]), 600), flush=True)
"""


@pytest.mark.parametrize("tree", TREES)
def test_kill_9_of_the_worker_kills_the_jobs_whole_tree(tree: str, marker: str, tmp_path: Path) -> None:
    script, count = TREES[tree]
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "job.log"), "sh", "-c",
                               script.format(m=marker)], cwd=ROOT)
    try:
        assert wait_until(lambda: len(with_marker(marker)) == count, 10), \
            f"the job did not start its {count} sleeps: {with_marker(marker)}"
    finally:
        worker.kill()
        worker.wait()
    assert wait_until(lambda: not with_marker(marker), 5), \
        f"processes of the job outlived its kill -9'd worker: {with_marker(marker)}"


def test_timeout_kills_the_whole_tree(marker: str, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    script = f'sleep {marker} & setsid sleep {marker} & (setsid sh -c "sleep {marker} &" &); sleep {marker}'
    t0 = time.monotonic()
    assert process.run_logged(["sh", "-c", script], log, 1) == (None, True)
    assert time.monotonic() - t0 < 6
    # The reaper reports only once the tree is dead and reaped: nothing may be left now.
    assert with_marker(marker) == []
    assert log.read_text().endswith("\n*** killed after the catalog timeout of 1s ***\n")


def test_a_cancelled_commands_tree_stops_and_its_wait_sleeps_until_then(marker: str, tmp_path: Path) -> None:
    """A slot waits for its command on the supervisor's report and the job's cancel flag together:
    the waiting thread sleeps until one of them speaks (a wake-up every 0.25 s to look at a flag
    was CPU that grew with the job's length), and a cancel stops the command's whole tree."""
    import threading

    log = tmp_path / "job.log"
    flag, ended, tid = process.CancelFlag(), [], []

    def job() -> None:
        tid.append(threading.get_native_id())
        token = process.CANCEL.set(flag)
        try:
            process.run_logged(["sh", "-c", f"sleep {marker} & setsid sleep {marker} & wait"], log, 60)
        except process.Cancelled as e:
            ended.append((time.monotonic(), str(e)))
        finally:
            process.CANCEL.reset(token)

    def switches() -> int:
        status = Path(f"/proc/self/task/{tid[0]}/status").read_text()
        return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]

    waiter = threading.Thread(target=job)
    with flag:
        waiter.start()
        assert wait_until(lambda: len(with_marker(marker)) == 2, 10)
        time.sleep(0.3)
        before = switches()
        time.sleep(2.0)
        woke = switches() - before
        cancelled_at = time.monotonic()
        flag.set()
        waiter.join(10)
    assert woke <= 1, f"the waiting thread woke {woke} times in 2 s of a command that said nothing"
    assert ended and ended[0][0] - cancelled_at < 2 and "the job was cancelled" in ended[0][1], ended
    assert with_marker(marker) == []
    assert log.read_text().endswith("*** cancelled: the command and everything it started were stopped ***\n")
    flag.set()  # the job is over and its flag closed: a late cancel only sets it
    assert flag.is_set() and flag.fileno() == -1


def test_leftovers_of_a_command_that_exited_are_killed(marker: str, tmp_path: Path) -> None:
    # The pause lets setsid leave the group before the shell exits (else killpg alone finds it).
    script = f"sleep {marker} & setsid sleep {marker} & sleep 0.3"
    assert process.run_logged(["sh", "-c", script], tmp_path / "job.log", 60) == (0, False)
    assert with_marker(marker) == []


def test_daemons_get_sigterm_before_sigkill(marker: str, tmp_path: Path) -> None:
    """Processes that left the command's group (wineserver: it saves the wine registry on
    SIGTERM) are asked to stop first; those that ignore it are killed after the grace."""
    flag = tmp_path / "flushed"
    polite = f"setsid sh -c 'trap \"echo yes > {flag}; exit 0\" TERM; sleep {marker} & wait' &"
    deaf = f"setsid sh -c 'trap \"\" TERM; sleep {marker} & wait' &"
    t0 = time.monotonic()
    assert process.run_logged(["sh", "-c", f"{polite} {deaf} sleep 0.3"], tmp_path / "job.log", 60) == (0, False)
    took = time.monotonic() - t0
    assert flag.read_text() == "yes\n"
    assert with_marker(marker) == []
    grace = float(re.search(r"#define TERM_GRACE ([0-9.]+)", process.REAPER.read_text())[1])  # the supervisor's
    assert grace <= took < grace + 4, \
        f"the SIGTERM-deaf daemon was killed after {took:.1f}s, not after the grace"


@pytest.mark.parametrize(("argv", "code"), [
    (["true"], 0),
    (["sh", "-c", "exit 3"], 3),
    (["sh", "-c", "kill -TERM $$"], -signal.SIGTERM),
    (["sh", "-c", "kill -KILL $$"], -signal.SIGKILL),
    (["no-such-command-gearfarm"], 127),
])
def test_exit_codes_come_back_exactly(argv: list[str], code: int, tmp_path: Path) -> None:
    assert process.run_logged(argv, tmp_path / "job.log", 60) == (code, False)


def test_command_gets_its_output_log_env_cwd_and_no_stdin(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("header\n")
    work = tmp_path / "work"
    work.mkdir()
    # A C locale on purpose: the reaper is Python, which would add LC_CTYPE=C.UTF-8 (PEP 538)
    # to its own environment; the command must get exactly the one given.
    env = {"PATH": os.environ["PATH"], "LANG": "C", "GEARFARM_TEST": "a b"}
    argv = ["sh", "-c", "cat; echo out; echo err >&2; pwd; env"]
    assert process.run_logged(argv, log, 60, cwd=work, env=env) == (0, False)
    lines = log.read_text().splitlines()
    assert lines[:5] == ["header", "$ " + " ".join(argv), "out", "err", str(work)]
    assert re.fullmatch(r"--- exit status 0 after \d+\.\d s ---", lines[-1])  # how it ended, last
    assert set(lines[5:-1]) - {f"PWD={work}"} == {f"{k}={v}" for k, v in env.items()}
    process.run_logged(["sh", "-c", "kill -ABRT $$"], log, 60)
    assert re.search(r"\n--- killed by SIGABRT after \d+\.\d s ---\n$", log.read_text())
    assert process.run_logged(["no-such-command-gearfarm"], log, 60) == (127, False)
    assert log.read_text().endswith("cannot start no-such-command-gearfarm: [Errno 2] No such file or "
                                    "directory: 'no-such-command-gearfarm'\n")


THREAD_STARTS_JOB = """
import os, subprocess, threading, time
from gearfarm.hosts.process import reaper_command, reaper_input
status_r, status_w = os.pipe()
def start():
    # The thread that forks the reaper is its PDEATHSIG parent; it exits while the job runs.
    reaper = subprocess.Popen([*reaper_command(), str(os.getpid()), str(status_w), "60"],
                              stdin=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True)
    reaper.stdin.write(reaper_input(["sleep", os.environ["MARKER"]], os.environ))
    reaper.stdin.close()
    time.sleep(1)  # long enough for the reaper to have armed PDEATHSIG
threading.Thread(target=start).start()
time.sleep(300)
"""


def test_the_job_survives_the_exit_of_the_thread_that_started_it(marker: str) -> None:
    """The kernel sends PDEATHSIG when the *thread* that forked the reaper exits; the reaper
    must then see that the worker process lives on, and keep the job running."""
    worker = subprocess.Popen([sys.executable, "-c", THREAD_STARTS_JOB], cwd=ROOT, env=dict(os.environ, MARKER=marker))
    try:
        assert wait_until(lambda: len(with_marker(marker)) == 1, 10)
        time.sleep(2)  # the thread has exited by now
        assert len(with_marker(marker)) == 1, "the job died with the thread that started it"
    finally:
        worker.kill()
        worker.wait()
    assert wait_until(lambda: not with_marker(marker), 5), "the job outlived its worker"


JOB_DIR_OWNER = """
import sys, time
from pathlib import Path
from gearfarm.hosts.process import job_dir
with job_dir(Path(sys.argv[1]), "test-") as d:
    (d / "scratch").write_text("left behind")
    print(d, flush=True)
    time.sleep(300)
"""


def test_a_daemons_log_past_its_size_is_rotated_when_the_next_process_starts(tmp_path: Path) -> None:
    """The embedded farm appends each night's worker to the same logs/<name>.log: without a
    rotation the state directory grows without bound (measured by bench/soak.py)."""
    log = tmp_path / "slot-1.log"
    with log.open("wb") as f:
        f.truncate(process.SPAWN_LOG_ROTATE + 1)  # sparse: a full log without writing one
    process.spawn([sys.executable, "-c", "print('second life')"], log).wait()
    assert (tmp_path / "slot-1.log.1").stat().st_size == process.SPAWN_LOG_ROTATE + 1
    assert log.read_text() == "second life\n"
    process.spawn([sys.executable, "-c", "print('third')"], log).wait()  # small: appended to
    assert log.read_text() == "second life\nthird\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slot-1.log", "slot-1.log.1"]


def test_sweep_removes_the_job_dirs_of_dead_workers_only(tmp_path: Path) -> None:
    root = tmp_path / "work"
    dead = subprocess.Popen([sys.executable, "-c", JOB_DIR_OWNER, str(root)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert dead.stdout is not None
    left = Path(dead.stdout.readline().strip())
    dead.kill()
    dead.wait()
    assert (left / "scratch").exists()
    assert left.parent.parent == root and left.parent.name.startswith(f"{dead.pid}-")
    # A pid that is alive but is another process now (here: ours, with another start time).
    start, boot = process.start_time(os.getpid()), process.boot_id()[:12]
    assert start is not None
    me = f"{os.getpid()}-{start}-{boot}"
    recycled = root / f"{os.getpid()}-{start - 1}-{boot}"
    recycled.mkdir()
    (root / "not-an-owner").mkdir()
    with process.job_dir(root, "live-") as live:
        assert live.parent == root / me and live.name.startswith("live-")
        (live / "f").write_text("in use")
        removed = process.sweep_work_dirs(root)
        assert sorted(removed) == sorted([left.parent, recycled])
        assert not left.parent.exists() and not recycled.exists()
        assert (live / "f").exists() and (root / "not-an-owner").exists()
    assert not live.exists()
    assert process.sweep_work_dirs(root) == []
    assert process.sweep_work_dirs(tmp_path / "absent") == []
    assert (root / me).is_dir()
    process.release_work_dir(root)  # a clean exit leaves nothing for the next sweep
    assert not (root / me).exists()


def test_a_job_dir_left_for_later_goes_when_the_next_command_starts_not_a_benchmarks(tmp_path: Path) -> None:
    """A finished job's dir left for later (the record goes first: workers.base) is removed once
    the next command is on its way; not by a benchmark's command, which measures the host, but
    by the worker's idle chores (tidy) or its clean exit, which leaves nothing behind."""
    root, log = tmp_path / "work", tmp_path / "log.txt"
    with process.job_dir(root, "first-", later=True) as first:
        (first / "sub").mkdir()
        (first / "sub" / "f").write_text("x")
    assert first.is_dir() and process.untidy()  # left for later
    token = process.TIDY.set(False)
    try:
        assert process.run_logged(["sh", "-c", f"test -d {first}"], log, 30) == (0, False)  # a benchmark's
    finally:
        process.TIDY.reset(token)
    assert first.is_dir()
    # The next command runs while the dir goes, and sees it go.
    gone = f"for i in $(seq 100); do test -d {first} || exit 0; sleep 0.05; done; exit 1"
    assert process.run_logged(["sh", "-c", gone], log, 30) == (0, False)
    assert not first.exists() and not process.untidy()
    with process.job_dir(root, "second-", later=True) as second:
        pass
    with process.job_dir(root, "now-") as now:
        pass
    assert second.is_dir() and not now.exists()
    process.tidy()
    assert not second.exists()
    with process.job_dir(root, "third-", later=True) as third:
        pass
    process.release_work_dir(root)
    assert not third.exists() and not third.parent.exists()


def test_stop_from_state_kills_only_the_processes_it_started(marker: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    farm = EmbeddedFarm(state, tmp_path)
    # Ours: a group leader with a child in its group (as a worker or MinIO), and one process
    # that leads no group (its group is this test's: killing that would kill us).
    leader = process.spawn(["sh", "-c", f"sleep {marker} & wait"], tmp_path / "leader.log")
    follower = subprocess.Popen(["sleep", marker])
    # Not ours: processes that now hold pids the state file names.
    other = new_marker()
    strangers = [subprocess.Popen(["sleep", other], start_new_session=True) for _ in range(3)]
    try:
        farm.procs = {"worker": leader, "collector": follower}
        assert wait_until(lambda: len(with_marker(marker)) == 2, 10)
        farm._record()
        data = json.loads((state / STATE_FILE).read_text())
        assert data["procs"]["worker"]["pgid"] == leader.pid
        late_start = dict(process.identity(strangers[0].pid) or {}, start=1)
        other_cmd = dict(process.identity(strangers[1].pid) or {}, cmdline=["gearmand", "--port", "4730"])
        data["pids"].update({"recycled": strangers[0].pid, "other-command": strangers[1].pid,
                             "old-state-file": strangers[2].pid, "gone": 2**22 + 1})
        data["procs"].update({"recycled": late_start, "other-command": other_cmd,
                              "gone": {"pid": 2**22 + 1, "start": 1, "boot": process.boot_id(), "cmdline": []}})
        (state / STATE_FILE).write_text(json.dumps(data))
        t0 = time.monotonic()
        stopped = stop_from_state(state)
        assert time.monotonic() - t0 < 5, "SIGTERM must go to all at once, not one wait per process"
        assert sorted(stopped) == ["collector", "worker"]
        assert sorted(stopped.skipped) == ["old-state-file", "other-command", "recycled"]
        assert wait_until(lambda: not with_marker(marker), 2), "the leader's group was not stopped"
        assert all(s.poll() is None for s in strangers), "a process the farm did not start was killed"
        assert not (state / STATE_FILE).exists()
    finally:
        for p in (leader, follower, *strangers):
            p.kill()
            p.wait()


def test_stop_from_state_kills_what_ignores_sigterm(marker: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    farm = EmbeddedFarm(state, tmp_path)
    # SIG_IGN is inherited: both the shell and its sleep ignore SIGTERM.
    stubborn = process.spawn(["sh", "-c", f"trap '' TERM; sleep {marker} & wait"], tmp_path / "stubborn.log")
    try:
        farm.procs = {"worker": stubborn}
        assert wait_until(lambda: len(with_marker(marker)) == 1, 10)
        farm._record()
        t0 = time.monotonic()
        assert stop_from_state(state, timeout=1.0) == ["worker"]
        assert time.monotonic() - t0 < 4
        assert stubborn.wait(2) == -signal.SIGKILL
        assert wait_until(lambda: not with_marker(marker), 2)
    finally:
        stubborn.kill()
        stubborn.wait()


def test_reaper_overhead_per_job(tmp_path: Path) -> None:
    """Not a limit, a measurement (-s shows it): what the reaper adds to a job."""
    log = tmp_path / "job.log"
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        process.run_logged(["true"], log, 60)
        times.append(time.perf_counter() - t0)
    times.sort()
    bare = []
    for _ in range(20):
        t0 = time.perf_counter()
        subprocess.run(["true"], stdin=subprocess.DEVNULL)
        bare.append(time.perf_counter() - t0)
    bare.sort()
    print(f"\nrun_logged(['true']) median {times[10] * 1000:.1f} ms; a bare Popen of true {bare[10] * 1000:.1f} ms")
    assert times[10] < 1.0


def test_the_supervisor_is_built_once_per_source_and_a_host_without_a_compiler_is_told_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job supervisor is C, compiled by the worker on first use into the cache under its
    source's sha256: built once, used as long as the source is the same, built again when it
    changes; a host without a C compiler, or a source that does not build, gets an error that
    says what to do, and a worker refuses to start with it (sandbox.for_config)."""
    monkeypatch.setenv("GEARFARM_CACHE", str(tmp_path / "cache"))
    process.reaper_command.cache_clear()
    try:
        (built,) = process.reaper_command()
        assert Path(built).parent == tmp_path / "cache" / "bin" and os.access(built, os.X_OK)
        first = Path(built).stat().st_mtime_ns
        process.reaper_command.cache_clear()
        assert process.reaper_command() == [built] and Path(built).stat().st_mtime_ns == first, "built twice"
        assert process.run_logged(["true"], tmp_path / "log", 10) == (0, False)

        changed = tmp_path / "reaper.c"
        source = process.REAPER.read_text() + "\n/* changed */\n"
        changed.write_text(source)
        monkeypatch.setattr(process, "REAPER", changed)
        process.reaper_command.cache_clear()
        (again,) = process.reaper_command()
        assert again != built and os.access(again, os.X_OK)

        changed.write_text("int main(void) { return x; }\n")
        process.reaper_command.cache_clear()
        with pytest.raises(process.ReaperError, match=r"(?s)cannot build the job supervisor .*x.? undeclared"):
            process.reaper_command()
        assert [p.name for p in (tmp_path / "cache" / "bin").iterdir() if p.name.startswith(".")] == []

        changed.write_text(source)
        (tmp_path / "cache" / "bin").chmod(0o777)  # another user could swap the binary
        process.reaper_command.cache_clear()
        with pytest.raises(process.ReaperError, match=r"directory .*/bin is owned by uid \d+ with mode 777"):
            process.reaper_command()
        (tmp_path / "cache" / "bin").chmod(0o755)

        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv("GEARFARM_CACHE", str(tmp_path / "a-file"))  # a cache that cannot be a directory
        process.reaper_command.cache_clear()
        with pytest.raises(process.ReaperError, match=r"into .*a-file/bin .*point \$GEARFARM_CACHE"):
            process.reaper_command()
        monkeypatch.setenv("GEARFARM_CACHE", str(tmp_path / "cache"))

        monkeypatch.setattr(process, "REAPER_CC", ("no-such-cc-gearfarm", *process.REAPER_CC[1:]))
        process.reaper_command.cache_clear()
        with pytest.raises(process.ReaperError, match=r"no C compiler \(no-such-cc-gearfarm\).*build-essential"):
            process.reaper_command()
        cfg = Config(farm=FarmConfig(repo=str(tmp_path), state_dir=str(tmp_path / "state"), sandbox="none"))
        with pytest.raises(SandboxError, match="no C compiler"):
            for_config(cfg)
    finally:
        process.reaper_command.cache_clear()


def test_a_job_handed_over_in_part_runs_nothing(tmp_path: Path) -> None:
    """The supervisor runs a job only as process.reaper_input wrote it whole: a job cut short
    (the worker died while handing it over), one whose counts do not fit, or none at all runs
    nothing and reports nothing; the whole one runs."""
    ran = tmp_path / "ran"
    whole = process.reaper_input(["touch", str(ran)], {"PATH": "/usr/bin:/bin"})

    def supervise(job: bytes) -> bytes:
        status_r, status_w = os.pipe()
        try:
            reaper = subprocess.Popen([*process.reaper_command(), str(os.getpid()), str(status_w), "60"],
                                      stdin=subprocess.PIPE, pass_fds=(status_w,))
            os.close(status_w)
            reaper.communicate(job, timeout=60)
            assert reaper.returncode == 0
            return os.read(status_r, 4096)
        finally:
            os.close(status_r)

    for torn in (whole[:len(whole) // 2], whole[:-1], b"-1\0touch\0", b"99999999\0touch\0", b"x" * 64, b""):
        assert supervise(torn) == b"", torn
        assert not ran.exists(), f"{torn!r} ran"
    assert supervise(whole) == b"exit 0" and ran.exists()
