"""What the chaos suite (tests/farm/test_chaos.py) and the soak (bench/soak.py) share: reading
what happened on an embedded farm (command starts in the workers' logs, the ledger's deliveries,
the `Tally` of runs completed, jobs lost, forged and stale results applied), running a nightly,
and the faults themselves (kill -9 of a worker group mid-job, gearmand killed and restarted on
its port with its persistent queue, a MinIO outage, the collector killed holding a result)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from sqlalchemy import select

from gearfarm import config as config_mod
from gearfarm.db.results import JobRow, ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import COLLECT_FUNCTION, JobId
from gearfarm.formats.result import PRODUCT
from gearfarm.gearman import admin
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.store import ArtifactStore
from tests import farmkit
from tests.farmkit import ROOT

TARGET = "linux-x86_64"
SUITES = "unit,model"
# Steps whose command runs long enough (seconds) to be hit in the middle: the build, and the
# model suite made slower (the chaos suite's repository). The unit suite ends in well under a second.
LONG_STEPS = frozenset({"build", "test-model"})
START_LINE = re.compile(rb"COMMAND START job=(\S+) attempt=(\d+) worker=(\S+)")


# ------------------------------------------------------------------------------ what happened

@dataclass(frozen=True)
class Start:
    """One `COMMAND START` line: a job's command began on a worker."""

    job_id: str
    attempt: int
    worker: str  # "<host>-<role>-<pid>"

    @property
    def jid(self) -> JobId:
        return JobId.parse(self.job_id)

    @property
    def pid(self) -> int:
        return int(self.worker.rsplit("-", 1)[1])


def parse_starts(text: bytes) -> list[Start]:
    return [Start(m[1].decode(), int(m[2]), m[3].decode()) for m in START_LINE.finditer(text)]


def starts_in(logs: list[Path]) -> list[Start]:
    return [s for path in logs for s in parse_starts(path.read_bytes())]


class StartWatch:
    """Follows worker logs as they are written, to act the moment a job's command starts."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.offsets: dict[Path, int] = {}
        self.pending: list[Start] = []

    def _poll(self) -> None:
        for path in sorted(self.logdir.glob("*.log")):
            at = self.offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(at)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line being written is read next time, whole
            self.offsets[path] = at + end
            self.pending += parse_starts(chunk[:end])

    def drain(self) -> None:
        """Forget the starts seen so far (they are still counted from the logs afterwards)."""
        self._poll()
        self.pending.clear()

    def next(self, nightly: Nightly, run_id: str, steps: frozenset[str] | None = None,
             timeout: float = 300) -> Start | None:
        """The next command start of this run (of one of ``steps``); None once the run ended."""
        deadline = time.monotonic() + timeout
        while True:
            self._poll()
            while self.pending:
                s = self.pending.pop(0)
                if s.jid.run_id == run_id and (steps is None or s.jid.step in steps):
                    return s
            if nightly.proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.05)


@dataclass(frozen=True)
class Sealed:
    """One `SEALED` line: a worker made (fitted and signed) a record, before it kept it anywhere."""

    job_id: str
    attempt: int
    status: str
    reused_artifact: bool
    worker: str
    digest: str


SEALED_LINE = re.compile(rb"SEALED job=(\S+) attempt=(\d+) status=(\S+) reused=([01]) worker=(\S+) "
                         rb"digest=([0-9a-f]{64})")


def genuine_records(logs: list[Path], run_id: str) -> dict[str, Sealed]:
    """digest -> every record the run's workers sealed, from their own lines (workers.base
    Context._sealed, written before the record is spooled, so none is delivered unsaid). A
    record applied from the wire or from S3 that is not here was not made by a farm worker.
    (The records' S3 copies were this account before; a worker now writes one only when the
    collector does not answer.)"""
    out = {}
    for path in logs:
        for m in SEALED_LINE.finditer(path.read_bytes()):
            got = Sealed(m[1].decode(), int(m[2]), m[3].decode(), m[4] == b"1", m[5].decode(), m[6].decode())
            if JobId.parse(got.job_id).run_id == run_id:
                out[got.digest] = got
    return out


@dataclass
class Tally:
    """One case's counts over its runs."""

    runs: int = 0
    completed: int = 0
    lost: int = 0
    forged_applied: int = 0
    stale_applied: int = 0
    # Records filed late although the ledger had been offered the very same record before the
    # report (rule 4 would call it a duplicate): the report then lists, as arrived after it, a
    # record that did not. Counted, not asserted: a farm bug reported with this suite.
    late_seen_before: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)  # where applied records came from
    applied: dict[str, int] = field(default_factory=dict)  # job id -> results applied
    started: dict[str, int] = field(default_factory=dict)  # job id -> command starts
    records: dict[str, Sealed] = field(default_factory=dict)  # genuine records, by digest
    problems: list[str] = field(default_factory=list)
    # Runs ended but not counted yet: (run id, exit code, output, digests the test forged).
    ended: list[tuple[str, int, str, frozenset[str]]] = field(default_factory=list)

    def add_run(self, run_id: str, code: int, output: str, forged: frozenset[str] = frozenset()) -> None:
        self.ended.append((run_id, code, output, forged))

    def count(self, db: ResultsDB, logs: list[Path]) -> None:
        """Count the ended runs, once the case is over: a record still on its way when its run
        ended (a late one) is counted too."""
        for run_id, code, output, forged in self.ended:
            self._count_run(db, logs, run_id, code, output, forged)
        self.ended.clear()

    def _count_run(self, db: ResultsDB, logs: list[Path], run_id: str, code: int, output: str,
                   forged: frozenset[str]) -> None:
        self.runs += 1
        self.completed += code == 0
        if code != 0:
            self.problems.append(f"{run_id}: nightly exited {code}:\n{output[-3000:]}")
        run = db.get_run(run_id)
        expected = list(run.expected) if run is not None else []
        if not expected:
            self.problems.append(f"{run_id}: no run recorded")
        with db.session() as s:
            rows = {r.job_id: r for r in s.execute(select(JobRow.job_id, JobRow.status, JobRow.attempt, JobRow.digest)
                                                   .where(JobRow.run_id == run_id))}
        genuine = genuine_records(logs, run_id)
        self.records.update(genuine)
        starts = Counter(s.job_id for s in starts_in(logs))
        deliveries = db.deliveries(run_id)
        self.outcomes.update(d.outcome for d in deliveries)
        for jid in sorted(set(expected) | {d.job_id for d in deliveries if d.job_id}):
            mine = [d for d in deliveries if d.job_id == jid]
            applied = [d for d in mine if d.outcome == "applied"]
            if jid in expected:  # a forged record of a job the run never had is counted below, if applied
                self.applied[jid] = len(applied)
                self.started[jid] = starts[jid]
            self.sources.update(d.source for d in applied)
            row = rows.get(jid)
            if jid in expected and (row is None or row.status != "passed"):
                self.lost += 1
                self.problems.append(f"{jid}: lost, final row {row.status if row else 'missing'}")
            for d in applied:
                if d.source in ("collect", "reconcile") and (d.digest not in genuine or d.digest in forged):
                    self.forged_applied += 1
                    self.problems.append(f"{jid}: forged record applied ({d.source}, {d.status}, "
                                         f"attempt {d.attempt}, digest {d.digest})")
            # Not the newest: an applied record of a lower attempt than one applied before it.
            # Compared within a class only, since rule 1 ranks any product result above any
            # farm-made one (a passed attempt 1 rightly replaces the deadline's infra attempt 2).
            newest: dict[bool, int] = {}
            for d in applied:
                product = d.status in PRODUCT
                if (d.attempt or 0) < newest.get(product, 0):
                    self.stale_applied += 1
                    self.problems.append(f"{jid}: attempt {d.attempt} ({d.status}) applied after attempt "
                                         f"{newest[product]}")
                newest[product] = max(newest.get(product, 0), d.attempt or 0)
            # ... or a final row older than a product result offered before the report (a late
            # one, after it, changes no row by rule 5, and is counted under late=).
            offered = [d.attempt or 0 for d in mine if d.status in PRODUCT
                       and d.outcome in ("applied", "duplicate", "superseded")]
            if row is not None and offered and row.attempt < max(offered):
                self.stale_applied += 1
                self.problems.append(f"{jid}: final row is attempt {row.attempt}, attempt {max(offered)} "
                                     "was offered")
            before = {d.digest for d in mine if d.outcome in ("applied", "duplicate", "superseded")}
            self.late_seen_before += sum(1 for d in mine if d.outcome == "late" and d.digest in before)
            # The delivery log explains the row: the last record applied is the one stored.
            if row is not None and (not applied or applied[-1].digest != row.digest):
                self.problems.append(f"{jid}: final row (digest {row.digest}) is not the last applied record")
            # Every product result comes from one run of the job's command (a reused build
            # artifact excepted): more applied than started means a result from nowhere.
            ran = [d for d in applied if d.status in PRODUCT and d.digest in genuine
                   and not genuine[d.digest].reused_artifact]
            if len(ran) > starts[jid]:
                self.problems.append(f"{jid}: {len(ran)} product results applied, {starts[jid]} command starts")

    def line(self, case: str, **extra: object) -> str:
        def per_job(counts: dict[str, int]) -> str:
            return ",".join(f"{JobId.parse(j).run_id}/{JobId.parse(j).step}:{n}" for j, n in counts.items())

        more = "".join(f" {k}={v}" for k, v in extra.items())
        return (f"CHAOS {case}: runs={self.runs} runs_completed={self.completed} jobs_lost={self.lost} "
                f"forged_applied={self.forged_applied} stale_applied={self.stale_applied}{more} "
                f"superseded={self.outcomes['superseded']} duplicate={self.outcomes['duplicate']} "
                f"late={self.outcomes['late']} late_seen_before={self.late_seen_before} "
                f"applied_from={'+'.join(f'{k}:{v}' for k, v in sorted(self.sources.items()))} "
                f"applied={per_job(self.applied)} started={per_job(self.started)}")

    def report(self, case: str, **extra: object) -> None:
        """Print the case's line and assert what every chaos case must end with."""
        print("\n" + self.line(case, **extra))
        assert self.runs > 0 and not self.ended, "count() the runs first"
        assert not self.problems, "\n".join(self.problems)
        assert self.completed == self.runs and self.lost == 0
        assert self.forged_applied == 0 and self.stale_applied == 0
        # A record the ledger ranked before the report, re-delivered after it, is a duplicate.
        assert self.late_seen_before == 0
        assert all(n >= 1 for n in self.applied.values())


def start_farm(repo: Path, state: Path) -> EmbeddedFarm:
    """An embedded farm serving TARGET from ``repo``, with short leases (read by each nightly)
    so that a lost job is resubmitted within a test's time. The caller stops it."""
    f = EmbeddedFarm(state, repo)
    f.start(catalog_mod.load_file(repo / "jobs" / "catalog.toml"), [TARGET])
    try:
        cfg = config_mod.load(f.config_path)
        cfg.farm.lease_timeout, cfg.farm.lost_grace = 15.0, 8.0
        config_mod.dump(cfg, f.config_path)
    except BaseException:
        f.stop()
        raise
    return f

class Nightly:
    """One `gearfarm nightly` process; killed if the test ends before it does, so a failed
    case leaves nothing running."""

    def __init__(self, config_path: Path, run_id: str, suites: str = SUITES) -> None:
        self.run_id = run_id
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(config_path), "--targets", TARGET,
             "--suites", suites, "--benchmarks", "none", "--run-id", run_id, "--deadline", "600"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    def __enter__(self) -> Nightly:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def finish(self, timeout: float = 660) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out


class FarmView:
    """What a case reads from an embedded farm: its database, S3 and logs."""

    def __init__(self, farm: EmbeddedFarm) -> None:
        self.farm = farm
        self.cfg = config_mod.load(farm.config_path)
        self.db = ResultsDB(self.cfg.database.url)
        self.store = ArtifactStore(self.cfg.s3)

    def logs(self) -> list[Path]:
        return sorted((self.farm.state / "logs").glob("*.log"))

    def add_run(self, tally: Tally, nightly: Nightly, forged: frozenset[str] = frozenset()) -> None:
        tally.add_run(nightly.run_id, *nightly.finish(), forged)

    def count(self, tally: Tally, timeout: float = 120.0) -> None:
        """Count once gearmand's queues and the workers' spools are empty: what the chaos left
        queued (a job replayed after its run closed, a result on its way) has been run, dropped
        or delivered: a record stays in its worker's spool until the collector answered it."""
        host, port = self.cfg.gearman.addresses()[0]
        spool = self.farm.state / "spool"
        deadline = time.monotonic() + timeout
        quiet = 0
        while quiet < 3 and time.monotonic() < deadline:  # three polls in a row: not a lull
            busy = any(st.queued for st in admin.status(host, port).values()) or any(spool.glob("*/*.json"))
            quiet = quiet + 1 if not busy else 0
            time.sleep(0.5)
        tally.count(self.db, self.logs())

    def collect_status(self) -> admin.FunctionStatus:
        host, port = self.cfg.gearman.addresses()[0]
        return admin.status(host, port).get(COLLECT_FUNCTION, admin.FunctionStatus(0, 0, 0))


def proc_of(farm: EmbeddedFarm, pid: int) -> str | None:
    """The farm's name for the live process with this pid (None: it is gone already)."""
    for name, p in list(farm.procs.items()):
        if p.pid == pid and p.poll() is None:  # type: ignore[attr-defined]
            return name
    return None


def wait_for(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    """farmkit.wait_for with the chaos cases' default: a minute."""
    return farmkit.wait_for(what, check, timeout)


def restarted(farm: EmbeddedFarm, name: str, old_pid: int, timeout: float = 30.0) -> None:
    """Wait for the farm's supervisor to have replaced a process that died."""
    wait_for(f"{name} to be restarted", lambda: farm.procs[name].pid != old_pid, timeout)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ the faults

def kill_worker_mid_job(farm: EmbeddedFarm, s: Start, rng: random.Random) -> bool:
    """kill -9 of the worker group running ``s``, a moment into its command (build ~2 s, model
    suite ~8 s), and wait for the supervisor's new one. False: the worker was gone already."""
    time.sleep(rng.uniform(0.3, 0.8) if s.jid.step == "build" else rng.uniform(0.5, 3.0))
    name = proc_of(farm, s.pid)
    if name is None:
        return False
    os.killpg(s.pid, signal.SIGKILL)
    restarted(farm, name, s.pid)
    return True


def restart_gearmand(farm: EmbeddedFarm) -> None:
    """kill -9 of gearmand, started again a second later on the same port and persistent queue."""
    assert farm.gearmand is not None
    farm.gearmand.kill9()
    time.sleep(1.0)
    farm.gearmand.start()


def minio_outage(farm: EmbeddedFarm, seconds: float) -> None:
    """MinIO stopped for ``seconds``, then started again on the same port and data."""
    assert farm.minio is not None
    farm.minio.stop()
    time.sleep(seconds)
    farm.minio.start()


def kill_collector_holding(farm: EmbeddedFarm, view: FarmView, timeout: float = 60.0) -> bool:
    """The collector stopped (SIGSTOP), killed (-9) once a record waits for it in gearmand (or
    after ``timeout``), and replaced by the supervisor. True: a record was waiting."""
    victim = farm.procs["collector"].pid  # type: ignore[attr-defined]
    os.killpg(victim, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while view.collect_status().queued == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        held = view.collect_status().queued > 0
    finally:
        os.killpg(victim, signal.SIGKILL)  # a stopped process dies of SIGKILL too
    restarted(farm, "collector", victim)
    return held
