"""How the farm's own cost grows with the lab and the night (issue #38): N simulated hosts
(network namespaces, one address each, one or two worker slots), two gearmand, MinIO, PostgreSQL
and the collector outside them, and a synthetic project made here whose catalog has J jobs a
night. Its suites sleep for durations drawn from a real nightly's spread, write a JUnit file of
many cases and leave small outputs, so what the night costs beyond those sleeps is the farm's.

The spread (``REAL_SECONDS``) is the engine's own nightly (jobs/catalog.toml): its build and
suites timed natively on this machine (`make -C engine` 2.07 s; gfe-suite unit 0.58 s, model
6.68 s, recovery 0.35 s, November 2026) and its Windows suites under wine as docs/speed.md gives
them (unit 1.7 s, model 8-12 s). Each job draws one of them, times a jitter of ±20 %, times
--time-scale (default 0.5: median about 0.6 s, the longest suite about 6 s).

Jobs: J = targets × (build + suites), --per-target jobs a target (default 50, so 2 targets at
J = 100 and 100 at 5,000; a build's payload lists at most 64 suites). The bound is
farm_speed's lower_bound over the jobs' own command seconds (their records' build/test
timings) with one core per slot: the longest chain (a build then its longest suite) or the
total work over the slots, whichever is longer.

Per configuration it prints one markdown table and the line ``farm cost: X ms per job``, where
the farm's cost per job is, from what the farm records (result records' timings, the ledger's
deliveries table), the mean per job of

* dispatch: from the moment both the job and a slot were free (submitted, and the slot's previous
  job finished) to the job's start (its payload checked: its claim is asked from then on, while
  the job is prepared); it holds the previous record's sealing and spooling and gearmand handing
  out the job;
* S3: the record's lookup, download, verify, upload and export timings;
* other in-job: the job's started→finished span less its command and S3 (catalog, job dir,
  the rest of the claim's wait, log upload);
* collector + ledger: the record's finish to the ledger's `applied` row;
* report: the report's build time (publisher.publish, timed here after the night) over J.

The same sum is printed for two groups of jobs: those whose farm time (from the moment they and
their slot were free to their record applied) met no second in which the machine's cores were
saturated (idle under 5 %, from /proc/stat each second) and those that met one: on two cores a
lab of 128 slots starts a burst of jobs whenever a build releases its suites, and waits for the
cores, which 64 real hosts would not share. And again for the jobs whose farm time met no second
in which some task waited for a core 10 % of it or more (the kernel's pressure stall
information, /proc/pressure/cpu) and those that met one: a burst of 16 starts (8 hosts) queues
for the cores within a second that leaves them idle part of it, which the idle share misses.

Beside them, the cores' speed that night (the CPU of one fixed piece of Python work, timed each
second): on this shared VM the same work's CPU moved by a third between runs minutes apart, and
every figure above with it, so runs are compared at like speeds.

With no --hosts/--jobs it runs the whole table (N in 1, 8, 32, 64, J in 100, 1000, 5000).
Root only (network namespaces). Every namespace, process and temp dir it makes goes, also on
failure.

    .venv/bin/python bench/scale.py --hosts 8 --jobs 1000 [--slots 2] [--time-scale 0.5]
    .venv/bin/python bench/scale.py            # the whole table
    ... --nights 2       a night before the measured one, on the same lab: its history (durations,
                         the report's past), as a farm has every night but its first
    ... --profile DIR    the nightly, the collector, every worker slot and the report's build
                         under cProfile (DIR/nightly.prof, collector.prof, worker-PID.prof,
                         report.prof)
    ... --nice 10        the simulated hosts' workers and jobs at niceness 10: in a lab the farm's
                         daemons (nightly, collector, gearmand, MinIO, PostgreSQL) have a host of
                         their own; here they share two cores with 128 worker slots
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# gearfarm.workers and gearfarm.s3 live in top-level folders (pyproject's package-dir): an
# editable install of another checkout maps them to that checkout's. Every process the bench
# starts (and the bench itself) takes them from this one.
THIS_CHECKOUT = """
import importlib.util, pathlib, sys
import gearfarm
for _name in ("workers", "s3"):
    _dir = pathlib.Path(gearfarm.__file__).resolve().parent.parent / _name
    _spec = importlib.util.spec_from_file_location("gearfarm." + _name, _dir / "__init__.py",
                                                   submodule_search_locations=[str(_dir)])
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)
    setattr(gearfarm, _name, _mod)
"""
exec(THIS_CHECKOUT)

from farm_speed import Job, lab, lower_bound, pct  # noqa: E402
from web_speed import fetch  # noqa: E402

from gearfarm.hosts import process  # noqa: E402
from gearfarm.hosts.net import free_port, wait_port  # noqa: E402

# A real nightly's jobs (see the module's docstring): seconds, and where each comes from.
REAL_SECONDS = {
    "build": [2.07],  # make -C engine, native (the cross builds are of the same order)
    "test": [0.58, 0.35, 6.68,  # linux-x86_64 unit, recovery, model
             0.58, 0.35, 6.68,  # linux-i686 (static, run natively): as linux-x86_64
             1.7, 10.0],  # windows-x86_64 under wine: unit 1.7 s, model 8-12 s (docs/speed.md)
}
HOSTS = (1, 8, 32, 64)
JOBS = (100, 1000, 5000)
RUN_ID = "scale"
CASES = 40  # JUnit cases per suite

BUILD_SH = """#!/bin/sh
# build.sh TARGET: sleep this target's drawn build seconds, leave the suite script and its table.
set -e
secs=$(awk -v t="$1" '$1 == t && $2 == "build" { print $3 }' durations.txt)
sleep "$secs"
mkdir -p out
cp suite.sh out/suite.sh
awk -v t="$1" '$1 == t' durations.txt > out/durations.txt
"""

SUITE_SH = """#!/bin/sh
# suite.sh JUNIT SUITE: sleep this suite's drawn seconds, write a JUnit file of its cases.
set -e
here=$(dirname "$0")
secs=$(awk -v s="$2" '$2 == s { print $3 }' "$here/durations.txt")
sleep "$secs"
{
  echo '<?xml version="1.0" encoding="UTF-8"?>'
  echo "<testsuite name=\\"$2\\" tests=\\"$3\\">"
  i=0
  while [ "$i" -lt "$3" ]; do
    echo "<testcase classname=\\"$2\\" name=\\"case_$i\\" time=\\"0.001\\"/>"
    i=$((i + 1))
  done
  echo '</testsuite>'
} > "$1"
"""


# `gearfarm` under cProfile, its stats written to $SCALE_PROFILE also when it ends with os._exit
# (gearfarm.cli.common.exit_now: the nightly after its report, the collector on SIGTERM). Every
# thread has a profiler of its own (cProfile follows only the thread that enabled it, and the
# collector's work is done in its handler threads); their stats are summed at exit.
PROFILED = """
import cProfile, os, pstats, threading
out, _exit, profs = os.environ["SCALE_PROFILE"].replace("{pid}", str(os.getpid())), os._exit, [cProfile.Profile()]
def _thread_profile(*_):
    prof = cProfile.Profile()
    profs.append(prof)
    prof.enable()
def _dump_and_exit(code):
    for p in list(profs):
        p.disable()
    stats = pstats.Stats(profs[0])
    for p in profs[1:]:
        try:
            stats.add(p)
        except (TypeError, ValueError):  # a thread's profiler that saw nothing
            pass
    stats.dump_stats(out)
    _exit(code)
os._exit = _dump_and_exit
threading.setprofile(_thread_profile)
profs[0].enable()
"""
RUN = """
import runpy, sys
sys.argv = ["gearfarm", *sys.argv[1:]]
runpy.run_module("gearfarm.cli", run_name="__main__")
"""


def gearfarm_cli(profile: Path | None = None, out: str | None = None) -> list[str]:
    """How to run `gearfarm` from this checkout: under cProfile when asked, its stats to ``out``
    (else $SCALE_PROFILE; "{pid}" in either is the process's pid)."""
    dest = f"import os\nos.environ['SCALE_PROFILE'] = {out!r}\n" if profile and out else ""
    return [sys.executable, "-c", THIS_CHECKOUT + (dest + PROFILED if profile else "") + RUN]


def layout(jobs: int, per_target: int) -> tuple[int, int]:
    """(targets, suites per target) for about ``jobs`` jobs, ``per_target`` jobs a target."""
    targets = max(1, round(jobs / per_target))
    return targets, max(1, round(jobs / targets) - 1)


def make_project(dest: Path, targets: int, suites: int, scale: float, seed: int = 38) -> dict[tuple[str, str], float]:
    """A git repository of a synthetic project (build.sh, suite.sh, the drawn durations and a
    catalog of ``targets`` × (build + ``suites``)); returns the drawn seconds per (target, step)."""
    from tests.farmkit import GIT, commit

    rng = random.Random(seed)
    names = [f"linux-s{i:03d}" for i in range(targets)]
    suite_names = [f"s{i:03d}" for i in range(suites)]
    drawn: dict[tuple[str, str], float] = {}
    lines = []
    for t in names:
        for step, kind in [("build", "build")] + [(s, "test") for s in suite_names]:
            secs = round(rng.choice(REAL_SECONDS[kind]) * rng.uniform(0.8, 1.2) * scale, 3)
            drawn[t, step] = secs
            lines.append(f"{t} {step} {secs}\n")
    dest.mkdir(parents=True)
    (dest / "durations.txt").write_text("".join(lines))
    (dest / "build.sh").write_text(BUILD_SH)
    (dest / "suite.sh").write_text(SUITE_SH)
    cat = ['schema = 2\n', '[build]\nargv = ["sh", "build.sh", "{target}"]\noutputs = ["out/suite.sh", '
           '"out/durations.txt"]\ntimeout = 300\n']
    listed = ", ".join(f'"{s}"' for s in suite_names)
    cat += [f'[targets.{t}]\nsuites = [{listed}]\n' for t in names]
    cat += [f'[suites.{s}]\nargv = ["sh", "{{root}}/out/suite.sh", "{{junit}}", "{s}", "{CASES}"]\ntimeout = 300\n'
            for s in suite_names]
    (dest / "jobs").mkdir()
    (dest / "jobs" / "catalog.toml").write_text("\n".join(cat))
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    commit(dest, "synthetic project for bench/scale.py")
    return drawn


SLOTS = "worker slots, their own processes (CPU summed, largest RSS)"


@dataclass
class Usage:
    """CPU seconds and peak RSS (MiB) of one process (or several: summed CPU, largest peak)."""

    cpu: float = 0.0
    rss: float = 0.0

    def add(self, cpu: float, rss: float) -> None:
        self.cpu += cpu
        self.rss = max(self.rss, rss)


def proc_usage(pid: int, children: bool = True) -> Usage:
    """A live process's CPU so far (its own, and with ``children`` its reaped children's: a
    worker's suites, a PostgreSQL's ended backends) and its peak RSS (VmHWM), from /proc."""
    hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime, stime, then cutime, cstime
    return Usage(sum(int(f) for f in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK"), hwm)


def tree_usage(pid: int) -> Usage:
    """``proc_usage`` of a process and of its live descendants: CPU summed, the largest peak."""
    children: dict[int, list[int]] = defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                children[int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])].append(int(d.name))
    total, todo = Usage(), [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            u = proc_usage(p)
            total.add(u.cpu, u.rss)
        todo += children.get(p, [])
    return total


@dataclass
class Night:
    hosts: int
    slots: int
    jobs: int
    wall: float
    exit: int
    earlier: list[float] = field(default_factory=list)  # the walls of the nights before it
    began: float = 0.0  # when the nightly started (the epoch)
    usage: dict[str, Usage] = field(default_factory=dict)
    report_seconds: float = 0.0
    copy_seconds: float = 0.0  # of report_seconds: the job files copied to disk (gearfarm.report.joblog)
    pages: dict[str, float] = field(default_factory=dict)
    collect_queue: list[int] = field(default_factory=list)  # `collect` jobs waiting in the gearmands, each second
    drawn: dict[tuple[str, str], float] = field(default_factory=dict)  # (target, step) -> its sleep's seconds
    stolen: float = 0.0  # CPU seconds the hypervisor gave other guests while the night ran (/proc/stat)
    probe: list[float] = field(default_factory=list)  # CPU ms of one fixed piece of work, each second (speed_probe)
    # (epoch, the cores' idle share, the share some task waited for a core), each second
    idle: list[tuple[float, float, float]] = field(default_factory=list)


def steal_seconds() -> float:
    """CPU seconds this VM's cores have waited for the hypervisor since boot (/proc/stat's
    `steal`): on a shared host the same code's farm cost moved ±20 % between runs, and what
    other guests took is one reason a reader can check."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


PROBE_LOOP = 50_000


def probe_ms() -> float:
    """CPU ms (of this thread: waits for a core or the interpreter lock do not count) of one
    fixed piece of Python work."""
    t0 = time.thread_time_ns()
    n = 0
    for i in range(PROBE_LOOP):
        n += i * i % 7
    return (time.thread_time_ns() - t0) / 1e6


@contextlib.contextmanager
def every_second(sample: Callable[[], None]) -> Iterator[None]:
    """``sample()`` each second, in a thread, while in the block."""
    import threading

    done = threading.Event()

    def loop() -> None:
        while not done.wait(1.0):
            sample()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()


def speed_probe(into: list[float]) -> contextlib.AbstractContextManager[None]:
    """The machine's speed while in the block: probe_ms each second. On this shared VM the same
    code's commands took 7.1 to 9.5 CPU s for the same work from one run to the next, and every
    figure of a night moves with it; a run's probe says how fast the cores were, beside the
    hypervisor's steal, which stayed 0 while they slowed."""
    return every_second(lambda: into.append(probe_ms()))


# A second whose cores were idle less than this was saturated (idle_sampler).
SATURATED = 0.05


# A second in which some task waited for a core this share of it or more met a queue for the
# cores (idle_sampler, the kernel's pressure stall information).
CONTENDED = 0.10


def psi_cpu_us() -> int | None:
    """Microseconds since boot in which at least one runnable task waited for a core
    (/proc/pressure/cpu, `some total`); None where the kernel has no PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def idle_sampler(into: list[tuple[float, float, float]]) -> contextlib.AbstractContextManager[None]:
    """Each second while in the block, (its end, the share of it the machine's cores were idle
    (/proc/stat), the share of it some task waited for a core (PSI; 0 without it)). At 64 hosts
    the lab's 128 slots share two cores: when a target's build releases its suites, every idle
    slot starts a job in the same second, and for some seconds no core is idle (vmstat: 30-70
    runnable, 0 % idle), while between those bursts half of them are. A burst of 16 starts (8
    hosts) is over within a second, and leaves cores idle in it, but its starts waited for the
    cores all the same: the stall share sees it, the idle share does not. What a job's farm time
    is made of differs by which it met, so the report gives each (``saturated_split``)."""
    def read() -> tuple[int, int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v[:8]), v[3] + v[4], psi_cpu_us() or 0  # user..steal; idle + iowait; stalled µs

    last = [read(), time.monotonic()]

    def sample() -> None:
        (total, idle, stall), now = read(), time.monotonic()
        (t0, i0, s0), m0 = last
        last[:] = [(total, idle, stall), now]
        if total > t0:
            into.append((time.time(), (idle - i0) / (total - t0), (stall - s0) / 1e6 / max(now - m0, 1e-3)))

    return every_second(sample)


def queue_sampler(addresses: list[tuple[str, int]], into: list[int]) -> contextlib.AbstractContextManager[None]:
    """Samples, every second while in the block, how many `collect` jobs (records, claims,
    beats) wait in the gearmands for a collector thread: a queue that grows is a collector that
    does not keep up, a lag that grows without one is the workers' (their outbox)."""
    from gearfarm.formats.job import COLLECT_FUNCTION
    from gearfarm.gearman import admin
    from gearfarm.gearman.errors import ProtocolError

    def sample() -> None:
        waiting = 0
        for host, port in addresses:
            with contextlib.suppress(OSError, ProtocolError):
                st = admin.status(host, port).get(COLLECT_FUNCTION)
                waiting += max(0, st.queued - st.running) if st else 0
        into.append(waiting)

    return every_second(sample)


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, int]]:
    """A throw-away PostgreSQL (tests/pg.py): a database's URL in it, and the postmaster's pid."""
    from tests.pg import PostgresServer

    server = PostgresServer().start()
    assert server.dir is not None
    where = server.dir
    postmaster = int((where / "data" / "postmaster.pid").read_text().split()[0])
    try:
        yield server.create_database("scale"), postmaster
    finally:
        try:
            server.stop()
        finally:
            # Checked, not trusted: this bench once left servers running (stop() after a nightly
            # on a loaded machine, cause not found), so what stop() leaves is killed here.
            with contextlib.suppress(OSError):  # gone, or a zombie (its parent may never reap it)
                if Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    print(f"(PostgreSQL {postmaster} outlived its stop: killed)", file=sys.stderr)
                    os.kill(postmaster, signal.SIGKILL)
            shutil.rmtree(where, ignore_errors=True)


def run_nightly(config: Path, profile: Path | None, run_id: str) -> tuple[float, int, Usage, float]:
    """The nightly, start to exit: wall seconds, exit status, its CPU and peak RSS (wait4), and
    when it started (the epoch, as the records' times)."""
    argv = gearfarm_cli(profile) + ["nightly", "--config", str(config), "--run-id", run_id]
    env = dict(os.environ, SCALE_PROFILE=str(profile / "nightly.prof")) if profile else None
    log = config.parent / "nightly.log"
    began, t0 = time.time(), time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                env=env)
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        except BaseException:  # the bench is stopped: so is its nightly
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1) or b"Traceback" in log.read_bytes():
        raise RuntimeError(f"the nightly failed ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return wall, proc.returncode, Usage(ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024), began


def build_report(config: Path, profile: Path | None = None, run_id: str = RUN_ID) -> tuple[float, float]:
    """Seconds to build the night's report again from the database's records, and of them the
    copies of its job files to disk; with ``profile``, under cProfile (DIR/report.prof). The
    clock times publisher.publish alone, as the nightly calls it: with its S3 client and the
    night's records already in hand (gearfarm.night.sequence). Making a boto3 client (40-80 ms)
    and reading the records again were in it before, half of a 100-job night's figure, and
    are the cost of a `gearfarm report` command, not of the farm's night."""
    import cProfile

    from gearfarm.config import load
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import joblog, publisher
    from gearfarm.s3.store import ArtifactStore

    cfg = load(config)
    db = ResultsDB(cfg.database.url)
    run = db.get_run(run_id)
    assert run is not None
    copying = [0.0]
    copy_all = joblog.copy_all

    def timed(*args: Any, **kwargs: Any) -> list[str]:
        t = time.perf_counter()
        try:
            return copy_all(*args, **kwargs)
        finally:
            copying[0] += time.perf_counter() - t

    joblog.copy_all = timed  # type: ignore[assignment]
    store, records = ArtifactStore(cfg.s3, retry_for=5), {run_id: db.jobs(run_id, cases=False)}
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    try:
        with prof or contextlib.nullcontext():
            publisher.publish(cfg, db, store, [run], records, send_mail=False, write_mail=False)
    finally:
        joblog.copy_all = copy_all  # type: ignore[assignment]
    took = time.perf_counter() - t0
    if prof is not None and profile is not None:
        prof.dump_stats(profile / "report.prof")
    db.engine.dispose()
    return took, copying[0]


def dashboard(config: Path, base: Path, step: tuple[str, str], before: str, repeat: int = 3,
              run_id: str = RUN_ID, first: dict[str, float] | None = None) -> dict[str, float]:
    """The worst of ``repeat`` answers (ms) of each dashboard page about the night, after one
    (the comparison with the night ``before``), whose time goes into ``first`` when given: a
    fresh dashboard's first look at an ended night makes what the later ones read back."""
    port = free_port()
    proc = process.spawn(gearfarm_cli() + ["web", "--config", str(config), "--listen",
                          f"127.0.0.1:{port}"], base / "web.log", cwd=ROOT)
    try:
        if not wait_port("127.0.0.1", port, 60):
            raise RuntimeError("the dashboard did not start: " + (base / "web.log").read_text()[-2000:])
        # Timed once it has made the night's pages ahead, as it does after each night: a look
        # during those seconds shares the process with the making.
        deadline = time.monotonic() + 300
        while "pages made ahead" not in (base / "web.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        pages = ["/", "/runs", f"/run/{run_id}", f"/api/run/{run_id}", f"/run/{run_id}/step/{step[0]}/{step[1]}",
                 f"/compare?a={before}&b={run_id}", "/live", "/tests", "/hosts"]
        out = {}
        for path in pages:
            status, took, _ = fetch(conn, path)
            answers = [fetch(conn, path) for _ in range(repeat)]
            statuses = sorted({status, *(a[0] for a in answers)})
            if statuses != [200]:
                # Said with the dashboard's own account (its traceback), which goes with the
                # bench's directory: a 500 seen once at 1 × 1,000 was found this way (a target
                # whose every job spent under 5 ms outside its stages).
                print(f"dashboard {path} answered {statuses}; its log ends:\n"
                      + (base / "web.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            out[f"{path} ({'/'.join(map(str, statuses))})"] = max(a[1] for a in answers)
            if first is not None:
                first[f"{path} ({status})"] = took
        return out
    finally:
        process.stop(proc, timeout=10)


def measure(hosts: int, jobs: int, slots: int, scale: float, per_target: int, tmp: Path, profile: Path | None,
            nights: int = 1, collector_threads: int | None = None, nice: int = 0) -> None:
    """One configuration: ``nights`` nightlies on one lab (the earlier ones are the later ones'
    history: durations, baselines, the report's past), the last one measured."""
    targets, suites = layout(jobs, per_target)
    repo = tmp / "project"
    drawn = make_project(repo, targets, suites, scale)
    names = [f"linux-s{i:03d}" for i in range(targets)]
    if profile:
        profile.mkdir(parents=True, exist_ok=True)
        os.environ["SCALE_PROFILE"] = str(profile / "collector.prof")  # the collector's; the nightly's its own
    with postgres() as (db_url, postmaster), lab(hosts, tmp / "lab", names, repo=repo, slots=slots, perf=False,
                                                 servers=2, db_url=db_url, settle=120 + 2 * hosts * slots,
                                                 cli=(["nice", "-n", str(nice)] if nice else [])
                                                 + gearfarm_cli(profile, str(profile / "worker-{pid}.prof")
                                                                if profile else None),
                                                 collector_cli=gearfarm_cli(profile),
                                                 farm={"collector_threads": collector_threads}
                                                 if collector_threads else None) as lb:
        earlier = []
        for i in range(nights - 1):
            earlier.append(run_nightly(lb.config, None, f"{RUN_ID}-{i + 1}")[0])

        def daemons() -> dict[str, Usage]:
            named = [("collector", lb.collector.pid), ("MinIO", lb.minio.pid)] + \
                    [(f"gearmand {i + 1}", gm.pid) for i, gm in enumerate(lb.gearmands)]
            got = {name: proc_usage(pid) for name, pid in named if pid is not None}
            got["PostgreSQL (all its processes)"] = tree_usage(postmaster)
            # A slot's own Python apart from its jobs' commands (sandbox, supervisor, the script):
            # which of the two the workers' share of the cores is.
            slots, commands = Usage(), Usage()
            for w in lb.workers:
                own, u = proc_usage(w.pid, children=False), tree_usage(w.pid)
                slots.add(own.cpu, own.rss)
                commands.add(u.cpu - own.cpu, 0.0)
            got[SLOTS] = slots
            got["their jobs' commands (supervisor, sandbox, script; CPU summed, RSS not sampled)"] = commands
            return got

        before = daemons()
        queue: list[int] = []
        probe: list[float] = []
        stolen = steal_seconds()
        idle: list[tuple[float, float, float]] = []
        with queue_sampler([gm.address for gm in lb.gearmands], queue), speed_probe(probe), idle_sampler(idle):
            wall, code, nightly_usage, began = run_nightly(lb.config, profile, RUN_ID)
        night = Night(hosts, slots, jobs, wall, code, earlier, began=began, collect_queue=queue,
                      drawn=drawn, stolen=steal_seconds() - stolen,
                      probe=probe, idle=idle)
        night.usage["nightly"] = nightly_usage
        for name, u in daemons().items():  # tonight's CPU; the peak RSS is the process's
            night.usage[name] = Usage(u.cpu - before[name].cpu, u.rss)
        night.report_seconds, night.copy_seconds = build_report(lb.config, profile)
        night.pages = dashboard(lb.config, tmp, (names[0], "test-s000"), f"{RUN_ID}-{nights - 1}" if nights > 1
                                else RUN_ID)
        report(night, db_url, targets, suites, scale)
        from gearfarm.config import FarmConfig
        print(f"(collector threads: {collector_threads or FarmConfig().collector_threads}; workers at nice {nice})")


def bound_of(recs: list, slots: int) -> tuple[float, float, float]:
    """A night's bound: each job's own command seconds (its record's), one core per slot."""
    own: list[Job] = []
    for r in recs:
        if r.started_at is not None and r.finished_at is not None:
            c = r.timings.get("build", r.timings.get("test", 0.0))
            own.append((r.kind, r.target, c, c, 0.0, 0.0))
    return lower_bound(own, slots)


def report(night: Night, db_url: str, targets: int, suites: int, scale: float) -> None:
    from gearfarm.db.results import ResultsDB

    db = ResultsDB(db_url)
    recs = db.jobs(RUN_ID)
    applied = {d.job_id: d.at for d in db.deliveries(RUN_ID) if d.outcome == "applied"}
    slots = night.hosts * night.slots
    # The nights before: their bounds too (a first night has no durations to order by).
    earlier = [bound_of(db.jobs(f"{RUN_ID}-{i + 1}"), slots)[0] for i in range(len(night.earlier))]
    db.engine.dispose()
    n = len(recs)
    ran = [r for r in recs if r.started_at is not None and r.finished_at is not None]
    command = {r.job_id: r.timings.get("build", r.timings.get("test", 0.0)) for r in ran}
    s3_stages = ("lookup", "download", "verify", "upload", "export")
    bound, path, work = bound_of(ran, slots)
    # Dispatch: from the moment both the job and its slot were free to its start.
    by_slot: dict[tuple[str, str], list] = defaultdict(list)
    for r in ran:
        by_slot[r.host.get("hostname", ""), r.worker.rsplit("-", 1)[-1]].append(r)
    dispatch = []
    free_at: dict[str, float] = {}  # each job's moment both it and its slot were free
    for rs in by_slot.values():
        rs.sort(key=lambda r: r.started_at)
        prev_end = 0.0
        for r in rs:
            free_at[r.job_id] = min(r.started_at, max(r.submitted_at or r.started_at, prev_end))
            dispatch.append(r.started_at - free_at[r.job_id])
            prev_end = r.finished_at
    # What the slots spent the night's wall on, on average (all the lab's slots, those that ran
    # nothing too): where a wall above its bound went.
    cmd, part, waits = "commands", "the farm's part of its jobs (started → finished, beyond the command)", \
        "dispatch (a job queued for it, not yet started)"
    first, between = "idle before its first job", "idle between jobs (none queued for it)"
    tail, end = "idle after its last job, while others ran theirs", \
        "idle after the night's last job (its last records, the report)"
    spent = dict.fromkeys((cmd, part, waits, first, between, tail, end), 0.0)
    last = max((r.finished_at for r in ran), default=night.began)
    for rs in by_slot.values():
        prev_end = night.began
        for r in rs:
            free = max(r.submitted_at or r.started_at, prev_end)
            spent[between if prev_end > night.began else first] += max(0.0, min(r.started_at, free) - prev_end)
            spent[waits] += max(0.0, r.started_at - free)
            spent[cmd] += command[r.job_id]
            spent[part] += max(0.0, r.finished_at - r.started_at - command[r.job_id])
            prev_end = r.finished_at
        spent[tail] += max(0.0, last - prev_end)
    spent[first] += (last - night.began) * (slots - len(by_slot))  # slots that ran nothing
    spent[end] = max(0.0, night.began + night.wall - last) * slots
    # The worker's admission (its checks and claim: the record's `admit`), from the job handed
    # over; the claim is asked while the job is prepared, so it spans dispatch and in-job.
    admit = [r.timings.get("admit", 0.0) for r in ran]
    s3 = [sum(r.timings.get(k, 0.0) for k in s3_stages) for r in ran]
    other = [max(0.0, r.finished_at - r.started_at - command[r.job_id] - s) for r, s in zip(ran, s3, strict=True)]
    lag = [applied[r.job_id] - r.finished_at for r in ran if r.job_id in applied]
    # A command's seconds beyond its drawn sleep: the supervisor's and the sandbox's start and
    # end (gearfarm/step/reaper.c, sandbox.py) and the script's own few programs. The farm's,
    # though its records count it as the job's (and so does the bound). Not of a build that
    # reused last night's artifact: it ran no command.
    beyond = [command[r.job_id] - night.drawn[r.target, r.step.removeprefix("test-")]
              for r in ran if (r.target, r.step.removeprefix("test-")) in night.drawn and not r.reused_artifact]
    times = sorted(applied.values())
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0

    def ms(xs: list[float]) -> float:
        return 1000 * statistics.fmean(xs) if xs else 0.0

    parts = {"dispatch (incl. the previous record's sealing and spooling)": ms(dispatch),
             "S3 (lookup, download, verify, upload, export)": ms(s3),
             "other in-job (catalog, job dir, the claim's wait, log upload)": ms(other),
             "collector + ledger (finished → applied)": ms(lag),
             "report (build time ÷ jobs)": 1000 * (night.report_seconds - night.copy_seconds) / max(n, 1)}
    cost = sum(parts.values())
    spans = [(free_at[r.job_id], applied[r.job_id],
              (r.started_at - free_at[r.job_id], s, o, applied[r.job_id] - r.finished_at))
             for r, s, o in zip(ran, s3, other, strict=True) if r.job_id in applied]
    saturated = [t for t, f, _ in night.idle if f < SATURATED]
    contended = [t for t, _, w in night.idle if w >= CONTENDED]
    calm, busy_jobs = saturated_split(spans, saturated)
    quiet, queued = saturated_split(spans, contended)
    print(f"\n## {night.hosts} hosts × {night.slots} slots, {n} jobs ({targets} targets × (build + {suites} suites), "
          f"{CASES} cases a suite, time scale {scale})\n")
    print("| figure | value |\n|---|---|")
    rows = [("nights before this one (their walls s ÷ bounds s)",
             ", ".join(f"{w:.1f} ÷ {b:.1f} = {w / b:.2f}" for w, b in zip(night.earlier, earlier, strict=True))
             or "none"),
            ("nightly exit status", f"{night.exit}"), ("jobs recorded / applied", f"{n} / {len(applied)}"),
            ("bound: longest chain s", f"{path:.1f}"), ("bound: work ÷ slots s", f"{work:.1f}"),
            ("night's wall s", f"{night.wall:.1f}"), ("**wall ÷ bound**", f"**{night.wall / bound:.2f}**"),
            ("dispatch latency p50 / p99 ms", f"{1000 * pct(dispatch, 0.5):.0f} / {1000 * pct(dispatch, 0.99):.0f}"),
            ("admission (checks, claim; asked while the job is prepared) p50 / p99 ms, mean",
             f"{1000 * pct(admit, 0.5):.0f} / {1000 * pct(admit, 0.99):.0f}, {ms(admit):.1f}"),
            ("a command's seconds beyond its sleep (supervisor, sandbox, the script) p50 / mean ms",
             f"{1000 * pct(beyond, 0.5):.0f} / {ms(beyond):.1f}" if beyond else "-"),
            ("records applied per second (first to last applied)", f"{rate:.1f}"),
            ("collector + ledger lag p50 / p99 ms", f"{1000 * pct(lag, 0.5):.0f} / {1000 * pct(lag, 0.99):.0f}"
             if lag else "-"),
            ("`collect` jobs waiting in gearmand, sampled each second: mean / max",
             f"{statistics.fmean(night.collect_queue):.1f} / {max(night.collect_queue)}"
             if night.collect_queue else "-")]
    rows += [(f"a slot's night, mean s: {k}", f"{v / slots:.1f}") for k, v in spent.items()]
    rows += [(f"farm cost: {k}, ms per job", f"{v:.1f}") for k, v in parts.items()]
    share = parts["report (build time ÷ jobs)"]
    rows += [("seconds of the night the cores were saturated (idle < 5 %)",
              f"{len(saturated)} of {len(night.idle)}" if night.idle else "-"),
             (f"seconds in which some task waited for a core ≥ {CONTENDED:.0%} of it (PSI cpu some); "
              "the night's mean share", f"{len(contended)} of {len(night.idle)}; "
              f"{statistics.fmean(w for _, _, w in night.idle):.1%}" if night.idle else "-")]

    def split(v: list[tuple[float, ...]]) -> str:
        if not v:
            return "- (0)"
        means = [1000 * statistics.fmean(c) for c in zip(*v, strict=True)]
        return f"{sum(means) + share:.1f} ({' + '.join(f'{m:.1f}' for m in means)} + {share:.1f}; {len(v)})"

    rows += [(f"farm cost of the jobs that {k}, ms per job (jobs)", split(v))
             for k, v in (("met no saturated second", calm), ("met one", busy_jobs),
                          ("met no second of tasks waiting for a core", quiet), ("met one", queued))]
    rows += [(f"{k}: CPU s / peak RSS MiB", f"{u.cpu:.1f} / {u.rss:.0f}") for k, u in night.usage.items()]
    busy = sum(u.cpu for u in night.usage.values())
    rows += [("CPU of all of the above ÷ (cores × wall)",
              f"{busy / (len(os.sched_getaffinity(0)) * night.wall):.2f} ({busy:.0f} CPU s)"),
             ("the cores' speed: CPU ms of one fixed piece of Python work, each second, p50 (p10-p90)",
              f"{pct(night.probe, 0.5):.2f} ({pct(night.probe, 0.1):.2f}-{pct(night.probe, 0.9):.2f})"
              if night.probe else "-"),
             ("CPU stolen by the hypervisor (other guests) ÷ (cores × wall)",
              # /proc/stat's first line sums every core of the machine, not only this process's
              f"{night.stolen / ((os.cpu_count() or 1) * night.wall):.3f} ({night.stolen:.1f} s)"),
             ("CPU ms per job (all of the above, the jobs' own commands included)", f"{1000 * busy / max(n, 1):.0f}"),
             ("nightly CPU ms per job", f"{1000 * night.usage['nightly'].cpu / max(n, 1):.1f}"),
             ("worker slots' own CPU ms per job", f"{1000 * night.usage[SLOTS].cpu / max(n, 1):.1f}"),
             ("report build s (then its job files copied to disk s)",
              f"{night.report_seconds - night.copy_seconds:.2f} ({night.copy_seconds:.2f})")]
    rows += [(f"dashboard `{p}` worst ms", f"{v:.0f}") for p, v in night.pages.items()]
    for k, v in rows:
        print(f"| {k} | {v} |")
    print(f"\nfarm cost: {cost:.1f} ms per job")


def saturated_split(spans: list[tuple[float, float, tuple[float, ...]]], seconds: list[float]
                    ) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """Each job's farm time (``spans``: from the moment it and its slot were free, to its record
    applied, and its parts: dispatch, S3, other in-job, lag) split by whether it met one of
    ``seconds`` (the ends of seconds of saturated or contended cores: idle_sampler). On two
    cores a burst of 128 job starts is a queue for the cores that a lab's 64 hosts, each with its
    own, would not have; the jobs that met none cost what the farm's own work does."""
    calm: list[tuple[float, ...]] = []
    met: list[tuple[float, ...]] = []
    for a, z, parts in spans:
        # A sample at t covers the second (t - 1, t].
        (met if any(a < t and t - 1 < z for t in seconds) else calm).append(parts)
    return calm, met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, help="simulated hosts (default: 1, 8, 32, 64)")
    ap.add_argument("--jobs", type=int, help="jobs a night (default: 100, 1000, 5000)")
    ap.add_argument("--slots", type=int, default=2, choices=(1, 2), help="worker slots a host (default 2)")
    ap.add_argument("--time-scale", type=float, default=0.5, help="times the real spread's seconds (default 0.5)")
    ap.add_argument("--per-target", type=int, default=50, help="jobs a target (default 50; at most 65)")
    ap.add_argument("--profile", type=Path,
                    help="the nightly, the collector, the worker slots and the report under cProfile (DIR/*.prof)")
    ap.add_argument("--nights", type=int, default=1,
                    help="nightlies per configuration, the last measured (the others are its history; default 1)")
    ap.add_argument("--nice", type=int, default=0,
                    help="run the simulated hosts' workers (and their jobs) at this niceness: on one machine "
                         "they share the cores with the farm's own daemons, which in a lab have a host of "
                         "their own (default 0: all alike)")
    ap.add_argument("--collector-threads", type=int,
                    help="[farm] collector_threads of the lab (default: the farm's default)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, databases) after the run")
    args = ap.parse_args()
    # Stopped with SIGTERM, it unwinds: every namespace, process and temp dir it made goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    if os.geteuid() != 0:
        sys.exit("bench/scale.py needs root (network namespaces)")
    configs = [(h, j) for j in ([args.jobs] if args.jobs else JOBS) for h in ([args.hosts] if args.hosts else HOSTS)]
    print(f"# gearfarm at scale, {time.strftime('%Y-%m-%d %H:%M')}, {len(os.sched_getaffinity(0))} cores, "
          f"load {os.getloadavg()[0]:.2f}")
    for hosts, jobs in configs:
        tmp = Path(tempfile.mkdtemp(prefix="gf-scale-"))
        try:
            measure(hosts, jobs, args.slots, args.time_scale, args.per_target, tmp, args.profile, args.nights,
                    args.collector_threads, args.nice)
        finally:
            if args.keep:
                print(f"(kept {tmp})")
            else:
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
