"""The farm's own speed against its floors (issue #13), printed as ratios in one run.

Sections (all by default; --only picks some):

* dispatch: foreground jobs one by one through a local gearmand, p50/p99 round trip and jobs/s,
  and the worker's CPU per job: gearfarm's client and worker against libgearman's (a small C
  client and worker, bench/gearman_peer.c, built here against libgearman-dev), and the two
  mixed pairs, which say on which side the time goes.
* transfer: a 100 MiB artifact up to and down from one MinIO, gearfarm's store (boto3, as the
  workers call it) against MinIO's own `mc cp`.
* codec: the archive codec (zstd) against gzip, the one before it, on the engine's build outputs
  and the project's source: pack and unpack times and sizes.
* startstop: the embedded farm's start (gearmand, MinIO, probes, every worker registered) and
  stop (every process gone), with the default catalog's four targets and the benchmarks.
* nightly: the whole nightly (`gearfarm nightly`, start and stop included) against its lower
  bound, for the default four targets and for --targets linux-x86_64. The bound comes from the
  same jobs run alone (a nightly with one worker slot, so no job overlaps another): the longest
  chain of jobs (a build, then its longest suite or its benchmarks), or the work spread over the
  cores, whichever is longer; a benchmark counts as holding every core (it has the host to
  itself, issue #12). --nightly-repeat pairs per variant, taking turns, and their median. The
  nightly starts from the job durations the one-slot run measured on this host, as a farm's
  nightly does from the night before's (gearfarm/run/priority.py).
* scale: the same nightly with 1, 2 and 4 targets.
* hosts: the nightly on a lab of 1, 2 and 4 simulated hosts (network namespaces, root only)
  sharing this machine's cores, one build-and-test slot each: what more hosts cost.

Figures, not pass/fail. The bench holds the host lock exclusive (gearfarm/hosts/hostlock.py) while it
measures, so other farm jobs on this host wait (and so does a detector bench holding it shared).

Run: .venv/bin/python bench/farm_speed.py [--only dispatch,transfer,codec,startstop,nightly,scale,hosts]
     [--jobs N] [--repeat N] [--hosts 1,2,4] [--host-targets T,...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gearfarm.gearman import Client, Worker  # noqa: E402
from gearfarm.hosts.gearmand import Gearmand  # noqa: E402
from gearfarm.hosts.hostlock import HostLock  # noqa: E402
from gearfarm.hosts.minio_server import MinioServer  # noqa: E402

SECTIONS = ("dispatch", "transfer", "codec", "startstop", "nightly", "scale", "hosts")
FUNCTION = "bench-echo"
FIRST = 100


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------ dispatch

def build_peer(tmp: Path) -> Path:
    exe = tmp / "gearman_peer"
    cmd = ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", str(ROOT / "bench" / "gearman_peer.c"),
           "-lgearman", "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cannot build the libgearman peer (apt-get install libgearman-dev, or make setup):\n{proc.stderr}")
    return exe


def serve_echo(host: str, port: int, function: str) -> None:
    """--serve-echo: gearfarm's worker, in a process of its own like the farm's."""
    worker = Worker([(host, port)], "bench-echo-worker")
    worker.register(function, lambda job: job.data)
    stop = threading.Event()
    worker.stop_on_signals(stop)
    worker.work(stop)


def start_worker(kind: str, peer: Path, host: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    if kind == "libgearman":
        argv = [str(peer), "worker", host, str(port), f"{FUNCTION}-{kind}", "0"]
    else:
        argv = [sys.executable, __file__, "--serve-echo", f"{host}:{port}:{FUNCTION}-{kind}"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def client_round_trips(kind: str, peer: Path, host: str, port: int, function: str, n: int,
                       client: Client) -> list[float]:
    """Microseconds per foreground job, one in flight."""
    if kind == "libgearman":
        out = subprocess.run([str(peer), "client", host, str(port), function, str(n)], capture_output=True,
                             text=True, check=True).stdout
        return [float(x) for x in out.split()]
    lat: list[float] = []
    for i in range(n):
        data = b"%d" % i
        t0 = time.perf_counter()
        got = client.submit(function, data, f"py-{time.time_ns()}-{i}", timeout=10)
        lat.append((time.perf_counter() - t0) * 1e6)
        assert got == data
    return lat


def dispatch(n: int, rounds: int = 10) -> None:
    """The four client/worker pairs take turns, `rounds` times n/rounds jobs each: this VM's
    speed moves by 20-40 % over minutes, and interleaving keeps every pair in the same mix of
    fast and slow moments (measured one pair after another, libgearman's own p50 came out at
    148 µs in one run and 283 µs in the next). The rounds are long (1,000 jobs by default) because
    the first jobs after a pause are not the steady state (three busy processes on two cores take
    a few hundred jobs to settle); the last column shows those first jobs on their own."""
    print(f"\n## Dispatch: {n} foreground jobs one by one per pair (in {rounds} interleaved rounds), echo of a "
          "few bytes, gearmand on loopback with the farm's persistent queue")
    pairs = [("libgearman", "libgearman"), ("gearfarm", "gearfarm"), ("gearfarm", "libgearman"),
             ("libgearman", "gearfarm")]
    lat: dict[tuple[str, str], list[float]] = {pr: [] for pr in pairs}
    first: dict[tuple[str, str], list[float]] = {pr: [] for pr in pairs}  # each round's first FIRST jobs
    cpu: dict[tuple[str, str], float] = {pr: 0.0 for pr in pairs}
    wall: dict[tuple[str, str], float] = {pr: 0.0 for pr in pairs}
    with tempfile.TemporaryDirectory(prefix="gf-bench-") as d:
        tmp = Path(d)
        peer = build_peer(tmp)
        with Gearmand(tmp / "gearmand", queue_db=tmp / "gearmand" / "queue.db") as server:
            host, port = server.address
            workers = {k: start_worker(k, peer, host, port, tmp / f"worker-{k}.log")
                       for k in ("libgearman", "gearfarm")}
            try:
                with Client([(host, port)]) as client:
                    for c, w in pairs:  # warm-up: every worker up and every path taken once
                        client_round_trips(c, peer, host, port, f"{FUNCTION}-{w}", 50, client)
                    for _ in range(rounds):
                        for c, w in pairs:
                            cpu0, t0 = cpu_seconds(workers[w].pid), time.perf_counter()
                            got = client_round_trips(c, peer, host, port, f"{FUNCTION}-{w}", n // rounds, client)
                            lat[c, w] += got
                            first[c, w] += got[:FIRST]
                            wall[c, w] += time.perf_counter() - t0
                            cpu[c, w] += cpu_seconds(workers[w].pid) - cpu0
            finally:
                for p in workers.values():
                    p.terminate()
                    p.wait(10)
    base = pairs[0]
    print(f"| client | worker | p50 µs | p99 µs | jobs/s | worker CPU µs/job | p50 ÷ libgearman's "
          f"| p50 of each round's first {FIRST} ÷ libgearman's |")
    print("|---|---|---|---|---|---|---|---|")
    row = {}
    for pr in pairs:
        k = len(lat[pr])
        row[pr] = (pct(lat[pr], 0.5), pct(lat[pr], 0.99), k / wall[pr], cpu[pr] / k * 1e6)
        p50, p99, rate, per = row[pr]
        print(f"| {pr[0]} | {pr[1]} | {p50:.0f} | {p99:.0f} | {rate:.0f} | {per:.0f} | "
              f"{p50 / pct(lat[base], 0.5):.2f} | {pct(first[pr], 0.5) / pct(first[base], 0.5):.2f} |")
    ours, theirs = row[pairs[1]], row[base]
    print(f"\ngearfarm's dispatch p50 = {ours[0] / theirs[0]:.2f}× libgearman's, p99 {ours[1] / theirs[1]:.2f}×, "
          f"throughput {ours[2] / theirs[2]:.2f}×, worker CPU per job {ours[3] / max(theirs[3], 1e-9):.2f}× "
          "(CPU from /proc in clock ticks: coarse); "
          f"over the first {FIRST} jobs of each round, p50 {pct(first[pairs[1]], 0.5) / pct(first[base], 0.5):.2f}×")


# ------------------------------------------------------------------------------------ transfer

def transfer(size_mib: int, repeat: int) -> None:
    from gearfarm.s3.store import ArtifactStore

    print(f"\n## Transfer: a {size_mib} MiB incompressible artifact to and from MinIO on loopback, best of {repeat}")
    mc = _mc()
    with tempfile.TemporaryDirectory(prefix="gf-bench-") as d:
        tmp = Path(d)
        src = tmp / "artifact.bin"
        with src.open("wb") as f:
            for _ in range(size_mib):
                f.write(os.urandom(1 << 20))
        with MinioServer(tmp / "minio") as minio:
            cfg = minio.s3_config()
            store = ArtifactStore(cfg)
            scheme, rest = cfg.endpoint.split("://", 1)
            env = dict(os.environ, MC_HOST_bench=f"{scheme}://{cfg.access_key}:{cfg.secret_key}@{rest}",
                       MC_CONFIG_DIR=str(tmp / "mc"))

            def best_of_interleaved(ours: Callable[[int], Path | None],
                                    theirs: Callable[[int], Path | None]) -> tuple[float, float]:
                """Best of ``repeat`` each, taking turns (this VM's speed moves over minutes); a
                downloaded file is removed before the next run, so neither side pays for the
                other's dirty pages being written back."""
                times: tuple[list[float], list[float]] = ([], [])
                for i in range(repeat):
                    # Who goes first alternates: the first read of an object MinIO has just written
                    # comes from the disk (it writes with O_DIRECT), later ones from the page cache.
                    for side in (0, 1) if i % 2 == 0 else (1, 0):
                        fn = (ours, theirs)[side]
                        os.sync()  # the last run's writes go to disk now, not during this one
                        t0 = time.perf_counter()
                        out = fn(i)
                        times[side].append(time.perf_counter() - t0)
                        if out is not None:
                            out.unlink()
                return min(times[0]), min(times[1])

            def mc_cp(a: str, b: str) -> None:
                subprocess.run([mc, "cp", "--quiet", a, b], env=env, check=True, stdout=subprocess.DEVNULL)

            def up_ours(i: int) -> None:
                store.put_file_if_absent(f"b/ours-{i}", src)

            def up_mc(i: int) -> None:
                mc_cp(str(src), f"bench/{cfg.bucket}/b/mc-{i}")

            def down_ours(i: int) -> Path:
                store.get_file("b/ours-0", tmp / "down-ours")
                return tmp / "down-ours"

            def down_mc(i: int) -> Path:  # the same object as ours
                mc_cp(f"bench/{cfg.bucket}/b/ours-0", str(tmp / "down-mc"))
                return tmp / "down-mc"

            up = best_of_interleaved(up_ours, up_mc)
            store.get_bytes("b/ours-0")  # not timed: neither side pays for the object's first read
            down = best_of_interleaved(down_ours, down_mc)
        mib = size_mib
        print("| direction | gearfarm s | gearfarm MiB/s | mc cp s | mc cp MiB/s | gearfarm ÷ mc (speed) |")
        print("|---|---|---|---|---|---|")
        for name, (ours, theirs) in (("upload", up), ("download", down)):
            print(f"| {name} | {ours:.2f} | {mib / ours:.0f} | {theirs:.2f} | {mib / theirs:.0f} | "
                  f"{theirs / ours:.2f} |")


def codec(repeat: int) -> None:
    """The archive codec (s3/artifact.py) against the one before it, on the engine's own build
    outputs and the project's source: pack and unpack times, sizes."""
    import gzip
    import io
    import tarfile

    import zstandard

    from gearfarm.s3 import artifact

    host = ROOT / "engine" / "build" / "host"
    files = ["gfe", "gfe-suite", "gfe-bench", "libgfe.a"]
    if not all((host / f).exists() for f in files):
        subprocess.run(["make", "-C", str(ROOT / "engine"), "all"], check=True, capture_output=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for f in files:
            tar.add(host / f, arcname=f)
    source = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True,
                            check=True).stdout
    codecs: list[tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes]]] = [
        ("gzip -6 (before)", lambda b: gzip.compress(b, 6, mtime=0), gzip.decompress),
        (f"zstd -{artifact.ARCHIVE_LEVEL} (now)", zstandard.ZstdCompressor(level=artifact.ARCHIVE_LEVEL).compress,
         lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b)),
    ]
    print(f"\n## Archive codec: best of {repeat}")
    print("| tar | MB | codec | packed MB | pack ms | unpack ms |")
    print("|---|---|---|---|---|---|")
    for name, raw in (("engine build outputs (host)", buf.getvalue()), ("project source (git archive)", source)):
        for cname, pack, unpack in codecs:
            t_pack = t_unpack = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                packed = pack(raw)
                t1 = time.perf_counter()
                assert unpack(packed) == raw
                t_pack, t_unpack = min(t_pack, t1 - t0), min(t_unpack, time.perf_counter() - t1)
            print(f"| {name} | {len(raw) / 1e6:.2f} | {cname} | {len(packed) / 1e6:.2f} | {t_pack * 1e3:.0f} | "
                  f"{t_unpack * 1e3:.1f} |")


def _mc() -> str:
    from gearfarm.s3 import minio

    path = Path(minio.find_binary()).with_name("mc")
    if not path.exists():
        sys.exit(f"mc not found beside {minio.find_binary()}: run make setup")
    return str(path)


# ----------------------------------------------------------------------------------- startstop

def startstop(repeat: int, tmp_root: Path) -> tuple[float, float]:
    from gearfarm.formats import catalog
    from gearfarm.run.farm import EmbeddedFarm

    cat = catalog.load_file(ROOT / "jobs" / "catalog.toml")
    starts, stops = [], []
    for i in range(repeat):
        farm = EmbeddedFarm(tmp_root / f"startstop-{i}", ROOT)
        t0 = time.perf_counter()
        try:
            farm.start(cat, None, perf=True)
            t1 = time.perf_counter()
        finally:
            t2 = time.perf_counter()
            farm.stop()
        stops.append(time.perf_counter() - t2)
        starts.append(t1 - t0)
        procs = len(farm.args)
    print(f"\n## Embedded farm start and stop: default catalog, every target and the benchmarks, {procs} "
          f"worker processes, {repeat} times")
    print("| | median s | min s | max s |")
    print("|---|---|---|---|")
    for name, xs in (("start (gearmand, MinIO, probes, every worker registered)", starts),
                     ("stop (every process gone)", stops)):
        print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")
    return statistics.median(starts), statistics.median(stops)


# -------------------------------------------------------------------------------------- nightly

def run_nightly(state: Path, targets: str | None, slots: int | None, run_id: str) -> float:
    """Wall seconds of one `gearfarm nightly` on a fresh embedded farm, start to stop."""
    argv = [str(ROOT / ".venv" / "bin" / "gearfarm"), "nightly", "--state-dir", str(state), "--run-id", run_id]
    argv += ["--targets", targets] if targets else []
    argv += ["--slots", str(slots)] if slots else []
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"nightly {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


Job = tuple[str, str, float, float, float, float]


def job_seconds(state: Path, run_id: str) -> list[Job]:
    """(kind, target, wall seconds of its own work, CPU seconds, started, finished) per job."""
    from gearfarm.db.results import ResultsDB

    out = []
    for r in ResultsDB(f"sqlite:///{state / 'results.db'}").jobs(run_id):
        wall = r.work_seconds
        if wall is None or r.started_at is None or r.finished_at is None:
            continue
        out.append((r.kind, r.target, wall, r.timings.get("cpu", wall), r.started_at, r.finished_at))
    return out


def lower_bound(jobs: list[Job], cores: float) -> tuple[float, float, float]:
    """(bound, critical path, work over the cores) from jobs measured alone: no schedule beats
    the longest chain of wall times, nor the CPU work spread over every core. A benchmark has
    the host to itself, so it holds every core for its wall time."""
    builds = {t: d for k, t, d, _, _, _ in jobs if k == "build"}
    tests: dict[str, list[float]] = {}
    perf: dict[str, list[float]] = {}
    for k, t, d, _, _, _ in jobs:
        (tests if k == "test" else perf if k == "perf" else {}).setdefault(t, []).append(d)
    cpu = sum(c for k, _, _, c, _, _ in jobs if k != "perf")
    work = cpu / cores + sum(sum(v) for v in perf.values())
    chains = [builds.get(t, 0.0) + max(tests.get(t, [0.0])) for t in builds]
    # Benchmarks run one at a time wherever they come from: after the first perf target's build.
    if perf:
        chains.append(min(builds.get(t, 0.0) for t in perf) + sum(sum(v) for v in perf.values()))
    path = max(chains or [0.0])
    return max(path, work), path, work


def exclusive_bound(jobs: list[Job], cores: float) -> float:
    """A tighter bound that also no schedule beats, since a benchmark excludes every other job on
    its host: the benchmarks one after another, plus the shortest the other jobs can take on their
    own (their longest chain, or their CPU work over the cores)."""
    builds = {t: d for k, t, d, _, _, _ in jobs if k == "build"}
    tests: dict[str, list[float]] = {}
    for k, t, d, _, _, _ in jobs:
        if k == "test":
            tests.setdefault(t, []).append(d)
    chain = max([builds.get(t, 0.0) + max(tests.get(t, [0.0])) for t in builds] or [0.0])
    cpu = sum(c for k, _, _, c, _, _ in jobs if k != "perf")
    return sum(d for k, _, d, _, _, _ in jobs if k == "perf") + max(chain, cpu / cores)


def nightly(variants: list[tuple[str, str | None]], tmp_root: Path, repeat: int = 1) -> None:
    """Per variant, ``repeat`` pairs of a one-slot nightly (the bound) and a nightly, taking turns:
    the VM's speed moves over minutes, and the benchmarks (most of a nightly) move with it."""
    cores = len(os.sched_getaffinity(0))
    notes: list[str] = []
    for name, targets in variants:
        ratios, exclusive, walls = [], [], []
        for r in range(repeat):
            label = name if repeat == 1 else f"{name} #{r + 1}"
            tag = f"{name.replace(' ', '-')}-{r}"
            alone_state, state = tmp_root / f"alone-{tag}", tmp_root / f"nightly-{tag}"
            alone_wall = run_nightly(alone_state, targets, 1, "alone")
            alone = job_seconds(alone_state, "alone")
            bound, path, work = lower_bound(alone, cores)
            # The host has run these jobs (the one-slot nightly, just now), as a farm's host has
            # every night but its first: its slots start the jobs it measured longest first.
            shutil.copytree(alone_state / "durations", state / "durations")
            wall = run_nightly(state, targets, None, "night")
            jobs = job_seconds(state, "night")
            span = max(j[5] for j in jobs) - min(j[4] for j in jobs)
            ratios.append(wall / bound)
            exclusive.append(wall / exclusive_bound(alone, cores))
            walls.append((wall, alone))
            print(f"| {label} | {len(jobs)} | {alone_wall:.1f} | {path:.1f} | {work:.1f} | {bound:.1f} | {wall:.1f} | "
                  f"{span:.1f} | {wall - span:.1f} | **{wall / bound:.2f}** |")
        if repeat > 1:
            print(f"| **{name}, median of {repeat}** | | | | | | | | | **{statistics.median(ratios):.2f}** |")
        capacity = parallel_capacity(cores)
        at_capacity = statistics.median(w / lower_bound(a, capacity)[0] for w, a in walls)
        notes.append(f"{name}: wall ÷ the bound with benchmarks excluding all other jobs "
                     f"{statistics.median(exclusive):.2f}; with the CPU work over the {capacity:.2f} cores' "
                     f"worth measured after it {at_capacity:.2f}")
    print("\nWhere the rest goes (medians): the same wall against two tighter bounds, each one no schedule "
          "beats either: the benchmarks one after another plus the other jobs on their own (a benchmark "
          "excludes every other job on its host), and the CPU work spread over the cores' worth this "
          "machine delivers (one CPU-bound process per core, each timed against one alone):\n")
    for line in notes:
        print(f"- {line}")


_SPIN_LOOP = "import time\nt = time.perf_counter()\nx = 0\nfor i in range(6_000_000): x += i\n" \
             "print(time.perf_counter() - t)"


def parallel_capacity(cores: int, rounds: int = 3) -> float:
    """How many cores' worth of CPU-bound work this machine delivers with one process per core: a
    lower bound assumes ``cores``, but a VM whose vCPUs share physical cores delivers fewer."""
    def run(n: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", _SPIN_LOOP], stdout=subprocess.PIPE, text=True)
                 for _ in range(n)]
        return statistics.mean(float(p.communicate()[0]) for p in procs)

    alone, together = [], []
    for _ in range(rounds):  # taking turns: the VM's speed moves over minutes
        alone.append(run(1))
        together.append(run(cores))
    return cores * statistics.median(alone) / statistics.median(together)


def nightly_header(what: str) -> None:
    cores = len(os.sched_getaffinity(0))
    print(f"\n## {what}: `gearfarm nightly` on a fresh embedded farm ({cores} cores, one worker slot per core)")
    print("The bound, from the same jobs run alone (a nightly with one slot): the longest chain of wall "
          "times (a build then its longest suite; the benchmarks one after another after their build) or "
          "the CPU work over the cores (a benchmark holds every core for its wall time), whichever is longer. "
          "*jobs span*: first job's start to last "
          "job's end; *outside jobs*: the rest (farm start and stop, source upload, planning, report).\n")
    print("| nightly | jobs | one slot: wall s | critical path s | work ÷ cores s | lower bound s | wall s | "
          "jobs span s | outside jobs s | wall ÷ bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")


# ---------------------------------------------------------------------------------------- hosts

@contextlib.contextmanager
def namespaces(n: int, tag: str) -> Iterator[list[tuple[str, str]]]:
    """n simulated lab hosts: network namespaces, each joined to this one by a veth pair.
    Yields [(namespace, the address this namespace reaches the job server and MinIO at)]."""
    made: list[tuple[str, str]] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        for i in range(n):
            ns, host_if, ns_if, net = f"gfb{tag}h{i}", f"gfb{tag}a{i}", f"gfb{tag}b{i}", f"10.233.{i + 1}"
            ip("netns", "add", ns)
            made.append((ns, host_if))
            ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            ip("link", "set", ns_if, "netns", ns)
            ip("addr", "add", f"{net}.1/24", "dev", host_if)
            ip("link", "set", host_if, "up")
            for cmd in (["ip", "addr", "add", f"{net}.2/24", "dev", ns_if], ["ip", "link", "set", ns_if, "up"],
                        ["ip", "link", "set", "lo", "up"]):
                ip("netns", "exec", ns, *cmd)
        yield [(ns, f"10.233.{i + 1}.1") for i, (ns, _) in enumerate(made)]
    finally:
        for ns, host_if in made:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@dataclass
class Lab:
    """A running lab (``lab()``): the farm's own config (the nightly's and the collector's), and
    the processes outside the simulated hosts."""

    base: Path
    config: Path
    gearmands: list[Gearmand]
    minio: MinioServer
    collector: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]


@contextlib.contextmanager
def lab(n_hosts: int, base: Path, targets: list[str], *, repo: Path = ROOT, slots: int = 1, perf: bool = True,
        servers: int = 1, db_url: str | None = None, wait_for: list[str] | None = None,
        settle: float = 60.0, cli: list[str] | None = None,
        collector_cli: list[str] | None = None, farm: dict[str, object] | None = None) -> Iterator[Lab]:
    """A lab of n simulated hosts sharing this machine's cores: ``servers`` gearmand, MinIO and
    the collector here, ``slots`` build-and-test worker processes per host (the first host also
    runs the perf worker when ``perf``), each host with its own key registered for what it
    serves, its own config, state directory and host lock. Yields once every worker slot is registered
    with every gearmand for ``wait_for`` (default: every target); stops every process and
    removes every namespace on the way out. ``cli`` runs the workers' and the collector's
    `gearfarm` another way (default: python -m gearfarm.cli), ``collector_cli`` the collector's
    alone (e.g. under a profiler). ``farm``: more [farm] settings of every host's config."""
    from gearfarm import config as config_mod
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB
    from gearfarm.formats.job import KINDS
    from gearfarm.formats.seal import Signer
    from gearfarm.gearman import admin
    from gearfarm.hosts import process

    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        hosts = stack.enter_context(namespaces(n_hosts, str(os.getpid() % 1000)))
        gms = [stack.enter_context(Gearmand(base / f"gm{i}", host="0.0.0.0", queue_db=base / f"gm{i}" / "q.db",
                                            job_retries=3)) for i in range(servers)]
        minio = stack.enter_context(MinioServer(base / "minio", host="0.0.0.0"))
        s3 = minio.s3_config()
        port = minio.port

        # The nightly's key, and one key per host registered for what it serves (docs/security.md).
        nightly_key = base / "keys" / "nightly.key"
        config_mod.write_private(nightly_key, Signer.generate().pem())
        db_url = db_url or f"sqlite:///{base / 'results.db'}"
        registry = Registry(ResultsDB(db_url))

        def state_of(name: str) -> Path:
            # Each host its own state directory, as real hosts have: its spool, artifact cache,
            # durations and logs. One shared by every slot of the lab made each slot's spool flush
            # look at every other slot's owner lock, and one download serve every host.
            return base / "state" if name == "farm" else base / "hosts" / name / "state"

        def config(addr: str, name: str) -> Path:
            host_key = base / "keys" / f"{name}.key"
            signer = Signer.generate()
            config_mod.write_private(host_key, signer.pem())
            registry.add(name, signer.public_text, KINDS, ["*"])
            cfg = Config(gearman=GearmanConfig(servers=[f"{addr}:{gm.address[1]}" for gm in gms]),
                         s3=s3.model_copy(update={"endpoint": f"http://{addr}:{port}"}),
                         database=DatabaseConfig(url=db_url),
                         farm=FarmConfig(repo=str(repo), state_dir=str(state_of(name)), host_name=name,
                                         host_key=str(host_key), signing_key=str(nightly_key),
                                         nightly_keys=[Signer.load(nightly_key).public_text], **(farm or {})))
            path = base / f"{name}.toml"
            config_mod.dump(cfg, path)
            return path

        here = config("127.0.0.1", "farm")
        cli = cli or [sys.executable, "-m", "gearfarm.cli"]
        stack.callback(process.stop_all, procs, 10)
        collector = process.spawn((collector_cli or cli) + ["collector", "--config", str(here)],
                                  base / "collector.log", cwd=ROOT)
        procs.append(collector)
        workers = []
        for i, (ns, addr) in enumerate(hosts):
            cfg = config(addr, f"host{i}")
            env = dict(os.environ, GEARFARM_HOST_LOCK_DIR=str(base / f"lock-{i}"))
            roles = [f"build,test.{s}" for s in range(slots)] + (["perf"] if perf and i == 0 else [])
            for role in roles:
                argv = ["ip", "netns", "exec", ns, *cli, "worker", "--role", role, "--targets", ",".join(targets),
                        "--config", str(cfg)]
                workers.append(process.spawn(argv, base / f"host{i}-{role}.log", env=env, cwd=ROOT))
        procs.extend(workers)
        wanted = {"collect": 1} | {f"build:{t}": n_hosts * slots for t in wait_for or targets}
        deadline = time.monotonic() + settle
        while not all(all(admin.status(*gm.address).get(f, admin.FunctionStatus(0, 0, 0)).workers >= n
                          for f, n in wanted.items()) for gm in gms):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the simulated hosts' workers did not register within {settle:.0f} s; "
                                   f"logs in {base}")
            time.sleep(0.2)
        yield Lab(base, here, gms, minio, collector, workers)


def lab_nightly(n_hosts: int, tmp: Path, targets: str | None) -> tuple[float, int]:
    """A nightly on a lab of n simulated hosts sharing this machine's cores (``lab``): one
    build-and-test slot per host, the first also running the perf worker. Returns (wall
    seconds, jobs)."""
    base = tmp / f"lab-{n_hosts}"
    served = (targets or "linux-x86_64,linux-i686,linux-aarch64,windows-x86_64").split(",")
    try:
        with lab(n_hosts, base, served, wait_for=(targets or "linux-x86_64").split(",")) as lb:
            argv = [sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(lb.config), "--run-id", "lab"]
            argv += ["--targets", targets] if targets else []
            t0 = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - t0
    except RuntimeError as e:
        sys.exit(str(e))
    if proc.returncode not in (0, 1):
        sys.exit(f"the lab nightly failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, len(job_seconds(base, "lab"))


def hosts(counts: list[int], tmp: Path, targets: str | None) -> None:
    if os.geteuid() != 0:
        print("\n## Simulated hosts: skipped (network namespaces need root)")
        return
    print(f"\n## Simulated hosts: the nightly ({targets or 'all four targets'}) on a lab of network namespaces "
          "sharing this machine's cores, one build-and-test slot per host, gearmand, MinIO and the collector "
          "outside them\n")
    print("| hosts | slots | jobs | wall s |")
    print("|---|---|---|---|")
    for n in counts:
        wall, jobs = lab_nightly(n, tmp, targets)
        print(f"| {n} | {n} | {jobs} | {wall:.1f} |")


# ------------------------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--jobs", type=int, default=10000, help="dispatch: foreground jobs per pair (default 10000)")
    ap.add_argument("--repeat", type=int, default=3, help="transfer, startstop: repetitions (default 3)")
    ap.add_argument("--nightly-repeat", type=int, default=3,
                    help="nightly: pairs of the one-slot nightly and the nightly per variant (default 3)")
    ap.add_argument("--size", type=int, default=100, help="transfer: MiB (default 100)")
    ap.add_argument("--hosts", default="1,2,4", help="hosts: numbers of simulated hosts (default 1,2,4)")
    ap.add_argument("--host-targets", help="hosts: --targets of those nightlies (default: all)")
    ap.add_argument("--serve-echo", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_echo:
        host, port, function = args.serve_echo.split(":", 2)
        serve_echo(host, int(port), function)
        return
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"--only: unknown section {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    print(f"# gearfarm farm speed, {time.strftime('%Y-%m-%d %H:%M')}, {len(os.sched_getaffinity(0))} cores, "
          f"load {os.getloadavg()[0]:.2f}")
    with HostLock().exclusive("bench/farm_speed.py") as waited:
        if waited > 1:
            print(f"(waited {waited:.0f} s for the host lock)")
        if "dispatch" in only:
            dispatch(args.jobs)
        if "transfer" in only:
            transfer(args.size, args.repeat)
        if "codec" in only:
            codec(max(args.repeat, 5))
        # The farm under test has a lock directory of its own: its builds and tests take it
        # shared and its benchmarks exclusive, while this bench keeps the host's own lock.
        with tempfile.TemporaryDirectory(prefix="gf-bench-") as d:
            tmp = Path(d)
            os.environ["GEARFARM_HOST_LOCK_DIR"] = str(tmp / "host-lock")
            if "startstop" in only:
                startstop(args.repeat, tmp)
            if "nightly" in only:
                nightly_header("Nightly against its lower bound")
                nightly([("default (4 targets)", None), ("linux-x86_64", "linux-x86_64")], tmp,
                        args.nightly_repeat)
            if "hosts" in only:
                hosts([int(x) for x in args.hosts.split(",")], tmp, args.host_targets)
            if "scale" in only:
                nightly_header("How the cost grows with targets")
                nightly([("1 target", "linux-x86_64"), ("2 targets", "linux-x86_64,linux-aarch64"),
                         ("4 targets", None)], tmp)


if __name__ == "__main__":
    main()
