"""Costs that must not grow faster than a night's jobs (issue #38, found by bench/scale.py): each
test counts what a night does per job (round trips to gearmand, reads of a run's expected
jobs, records read again from S3, passes over the records, history loaded) on a night large
enough that a cost growing with the jobs' square shows, without timing anything."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import event

from gearfarm.config import Config, DatabaseConfig, FarmConfig
from gearfarm.db.results import ResultsDB, Run
from gearfarm.formats.job import JobId, Source
from gearfarm.formats.lease import Lease, seal_lease
from gearfarm.formats.result import ResultRecord
from gearfarm.formats.seal import Signer
from gearfarm.gearman import BackgroundJob, JobStatus
from gearfarm.gearman.admin import FunctionStatus
from gearfarm.report import document
from gearfarm.run import nightly
from gearfarm.run.ledger import Ledger, farm_record
from gearfarm.run.priority import JOURNAL_BYTES, Durations
from gearfarm.run.states import FULL_READ_SECONDS, RunStates
from gearfarm.s3 import keys
from tests.farmkit import claim, keyed, wait_for

REV = "a" * 40
T = "linux-x86_64"



def statements(db: ResultsDB) -> list[str]:
    """Every SQL statement ``db``'s engine runs from now on."""
    seen: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda _c, _cur, stmt, *_: seen.append(stmt))
    return seen


def night(db: ResultsDB, run_id: str, suites: int, targets: tuple[str, ...] = (T,)) -> list[JobId]:
    jids = [JobId(run_id, t, s) for t in targets for s in ["build"] + [f"test-s{i:03d}" for i in range(suites)]]
    assert db.create_run(run_id, REV, list(targets), [str(j) for j in jids])
    return jids


def record(jid: JobId, status: str = "passed", finished: float = 1000.0) -> ResultRecord:
    return ResultRecord(job_id=str(jid), run_id=jid.run_id, target=jid.target, kind=jid.kind, step=jid.step,
                        name=jid.name, rev=REV, status=status, attempt=1, worker="w",  # type: ignore[arg-type]
                        started_at=finished - 1, finished_at=finished, timings={"test": 1.0})


def test_the_ledger_reads_a_runs_expected_jobs_once_not_per_record(tmp_path: Path) -> None:
    """Every record and lease checked its job against the run's whole expected list, read and
    parsed from the database each time: a record cost more the larger the night."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    jids = night(db, "big", 400)
    ledger = Ledger(db)
    sql = statements(db)
    for jid in jids[1:101]:  # tests, not the build (whose infra would end them all)
        assert ledger.apply(farm_record(jid, REV, "infra", "expired"), "nightly") == "applied"
    assert ledger.apply(farm_record(JobId("big", T, "test-nosuch"), REV, "infra", "x"), "nightly") == "rejected"
    reads = [s for s in sql if "runs.expected" in s]
    assert len(reads) <= 1, f"the run's expected jobs were read {len(reads)} times for 101 records"
    # A failed build still ends its dependents, from the list read once.
    other = night(db, "other", 3)
    assert ledger.apply(farm_record(other[0], REV, "infra", "no compiler"), "nightly") == "applied"
    assert {r.job_id: r.status for r in db.jobs("other")} == {str(other[0]): "infra",
                                                             **{str(j): "skipped" for j in other[1:]}}


def planned(tmp: Path, run_id: str, targets: int = 5, suites: int = 60) -> tuple[ResultsDB, Config, nightly.Plan]:
    """A nightly's config (its signing key), its results database and a recorded plan of
    ``targets`` × (build + ``suites``)."""
    url = f"sqlite:///{tmp / 'r.db'}"
    db = ResultsDB(url)
    cfg = Config(database=DatabaseConfig(url=url),
                 farm=FarmConfig(state_dir=str(tmp / "state"), **keyed(tmp, url)))  # type: ignore[arg-type]
    names = [f"linux-t{i}" for i in range(targets)]
    steps = [f"s{i:03d}" for i in range(suites)]
    p = nightly.Plan(run_id, Source("engine", REV, "5" * 64, "6" * 64), names, {t: steps for t in names},
                     {t: [] for t in names})
    assert db.create_run(p.run_id, REV, names, [str(j) for j in p.expected])
    return db, cfg, p


@dataclass
class CountingClient:
    """gearmand as the watchdog sees it: every job queued, ``running`` ones running."""

    running: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    def get_status_unique(self, unique: str) -> JobStatus:
        self.asked.append(unique)
        return JobStatus(unique, True, unique in self.running, 0, 0)


def test_the_watchdog_asks_gearmand_about_a_bounded_number_of_jobs_per_poll(tmp_path: Path) -> None:
    """The wait loop asked gearmand about every pending job every poll (0.2 s): one round trip
    each, so a 5,000-job night spent seconds per poll and its cost grew with the square of its
    jobs. A job gearmand says runs, and nobody holds the lease of, is asked about every poll,
    and every queued one in turn."""
    db, cfg, p = planned(tmp_path, "w")
    targets = p.targets
    states = {str(JobId("w", t, "build")): "passed" for t in targets}
    pending = [j for j in p.expected if j.kind != "build"]  # 300 suites, their builds passed
    client = CountingClient(running={pending[7].unique(1), pending[250].unique(1)})
    dog = nightly.Watchdog(cfg, db, Ledger(db), None, client, p, set())  # type: ignore[arg-type]
    dog.released.update(pending)  # submitted already: this is about watching them
    table = {"collect": FunctionStatus(0, 0, 1)}
    polls = 0
    asked: set[str] = set()
    while len(asked) < len(pending) or polls < 10:
        client.asked.clear()
        dog.check(pending, states, time.time(), table)
        polls += 1
        assert len(client.asked) <= nightly.STATUS_SWEEP + 2, f"{len(client.asked)} round trips in one poll"
        # A job seen running is asked about every poll from then on (its lease is judged).
        assert asked & client.running <= set(client.asked)
        asked |= set(client.asked)
        assert polls <= 10 or len(asked) == len(pending), "some queued job is never asked about"
    assert client.running <= asked


def test_the_watchdog_asks_nothing_about_a_job_whose_holder_beats_and_a_queued_one_every_few_seconds(
        tmp_path: Path) -> None:
    """The watchdog asked gearmand about every running job 5 times a second (its lease was judged
    from the ledger's beats anyway), and about every queued job as often while they were fewer
    than a sweep: 43 round trips a poll at 1 host × 100 jobs, 4 of the nightly's 10 CPU
    seconds, and 128 a poll more at 64 hosts. A job whose holder beats is running by its beats;
    one whose holder fell silent is asked about every poll again; a queued one once every
    SWEEP_SECONDS."""
    db, cfg, p = planned(tmp_path, "hb", targets=1, suites=40)
    states = {str(JobId("hb", p.targets[0], "build")): "passed"}
    pending = [j for j in p.expected if j.kind != "build"]
    held, silent = pending[:3], pending[3]
    ledger, host = Ledger(db), Signer.load(cfg.path(cfg.farm.host_key))
    db.set_live("hb", {str(j): ("queued", 1) for j in pending})  # submitted: attempt 1 may be claimed
    for jid in [*held, silent]:
        assert claim(ledger, host, str(jid), 1, cfg.farm.host_name) == "granted"
    client = CountingClient(running={j.unique(1) for j in [*held, silent]})
    dog = nightly.Watchdog(cfg, db, ledger, None, client, p, set())  # type: ignore[arg-type]
    dog.released.update(pending)
    table = {"collect": FunctionStatus(0, 0, 1)}
    t0, asks = time.time(), defaultdict(list)

    def poll(at: float) -> None:
        client.asked.clear()
        dog.check(pending, states, at, table)
        for u in client.asked:
            asks[u].append(at)

    beat = 0
    for k in range(int(2 * dog.stale / 0.2)):  # 0.2 s polls; every holder but one beats every 10 s
        at = t0 + k * 0.2
        if k % 50 == 0:
            beat += 1
            for jid in held:
                lease = Lease(job_id=str(jid), attempt=1, host=cfg.farm.host_name, worker="w", beat=beat)
                assert ledger.lease(seal_lease(lease, host))[0] == "granted"
        poll(at)
    for jid in held:
        assert not asks[jid.unique(1)], f"{jid} was asked about {len(asks[jid.unique(1)])} times while it beat"
    quiet = asks[silent.unique(1)]
    assert quiet and quiet[0] - t0 > dog.stale - 1, "a silent holder's job was asked about before its beats stopped"
    assert len(quiet) >= (2 * dog.stale - (quiet[0] - t0)) / 0.2 - 2, "a silent holder's job is asked every poll"
    for jid in pending[4:]:
        times = asks[jid.unique(1)]
        assert times, f"queued {jid} was never asked about"
        assert all(b - a >= nightly.SWEEP_SECONDS for a, b in zip(times, times[1:], strict=False)), \
            f"queued {jid} was asked about at {[round(t - t0, 1) for t in times]}"


@dataclass
class Submissions:
    """gearmand taking background jobs: each call is a round trip (a batch is pipelined)."""

    sent: list[str] = field(default_factory=list)
    trips: int = 0

    def submit_background(self, function: str, data: bytes, unique: str) -> str:
        self.sent.append(unique)
        self.trips += 1
        return f"H:{len(self.sent)}"

    def submit_background_many(self, jobs: Iterable[BackgroundJob], priority: str = "normal") -> list[str]:
        jobs = list(jobs)
        self.trips += 1
        self.sent.extend(j.unique for j in jobs)
        return [f"H:{len(self.sent) - len(jobs) + n + 1}" for n in range(len(jobs))]


def test_releasing_a_targets_suites_reads_its_build_once_and_records_them_together(tmp_path: Path) -> None:
    """Each test job released read its target's build record again (the same artifact for all
    of them), recorded its attempt in a transaction of its own, and was submitted in a round
    trip of its own to gearmand (at 64 hosts, 46 ms each: 230 s of a 520 s night)."""
    db, cfg, p = planned(tmp_path, "rl")
    targets = p.targets
    ledger = Ledger(db)
    for t in targets:
        build = record(JobId("rl", t, "build")).model_copy(update={"artifact_key": f"artifacts/{REV}/{t}/x/a.tar.zst",
                                                                   "artifact_sha256": "7" * 64})
        assert ledger.apply(build, "nightly") == "applied"
    client = Submissions()
    dog = nightly.Watchdog(cfg, db, ledger, None, client, p, set())  # type: ignore[arg-type]
    tests = [j for j in p.expected if j.kind == "test"]
    sql = statements(db)
    dog.release(tests)
    assert sorted(client.sent) == sorted(j.unique(1) for j in tests)
    builds = [s for s in sql if "FROM jobs" in s and "jobs.record" in s]
    assert len(builds) <= len(targets), f"{len(builds)} reads of build records for {len(tests)} jobs"
    writes = [s for s in sql if s.startswith("BEGIN IMMEDIATE")]
    assert len(writes) <= len(targets), f"{len(writes)} write transactions for {len(tests)} jobs"
    assert client.trips <= len(targets), f"{client.trips} round trips to gearmand for {len(tests)} jobs"
    assert {lj.attempt for lj in db.live(["rl"]).values()} == {1} and len(db.live(["rl"])) == len(tests)


class ResultsInS3:
    """An S3 holding the run's result records: lists them, counts what is read."""

    def __init__(self, listed: list[str]) -> None:
        self.listed, self.read = listed, []

    def list(self, prefix: str) -> Iterator[str]:
        return iter(self.listed)

    def get_bytes(self, key: str) -> bytes:
        self.read.append(key)
        return b"{}"  # not a sealed record: the ledger rejects it


def test_reconcile_reads_only_records_the_ledger_has_not_ranked(tmp_path: Path) -> None:
    """The nightly's last reconcile read every record of the night from S3 again and offered it
    to the ledger (a GET and a signature check per job at the end of every night), though the
    collector had delivered them all."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    jids = night(db, "rc", 50)
    ledger = Ledger(db)
    delivered = []
    for jid in jids:
        rec = record(jid)
        assert ledger.apply(rec, "nightly") == "applied"
        delivered.append(keys.result(rec.run_id, rec.target, rec.step, rec.attempt, rec.digest))
    lost = keys.result("rc", T, "test-s000", 2, "f" * 64)  # a record the collector never delivered
    store = ResultsInS3(delivered + [lost])
    seen: set[str] = set()
    nightly.reconcile(ledger, store, "rc", seen)  # type: ignore[arg-type]
    assert store.read == [lost]
    assert set(delivered) <= seen


def test_the_nightlys_poll_reads_the_jobs_that_changed_not_every_job(tmp_path: Path) -> None:
    """The nightly's wait loop read every job's state five times a second: at 5,000 jobs 35 ms a
    poll on a busy machine, 132 CPU s of a 790 s night. Between whole reads (every
    FULL_READ_SECONDS) a poll now reads the jobs the ledger applied a record to lately."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    jids = night(db, "rs", 500)
    ledger = Ledger(db)
    read: list[int] = []
    since = db.job_states_since

    def counted(run_id: str, at: float) -> tuple[dict[str, str], float | None]:
        got, latest = since(run_id, at)
        read.append(len(got))
        return got, latest

    db.job_states_since = counted  # type: ignore[method-assign]
    states = RunStates(db, "rs")
    assert states.read() == db.job_states("rs") == {} and states.whole_reads == 1
    for jid in jids[1:4]:
        assert ledger.apply(record(jid), "nightly") == "applied"
    read.clear()
    for _ in range(50):
        assert states.read() == {str(j): "passed" for j in jids[1:4]}
    assert states.whole_reads == 1 and max(read) <= 3, f"a poll read {max(read)} jobs' states for 3 changes"
    assert ledger.apply(record(jids[0], "failed"), "nightly") == "applied"  # ends its 500 tests
    assert states.read() == db.job_states("rs") and len(states.read()) == 501
    states.whole_at -= FULL_READ_SECONDS
    assert states.read() == db.job_states("rs") and states.whole_reads == 2


@dataclass
class Forgetful(Submissions):
    """gearmand that holds none of the jobs sent to it any more (they ended, or it lost them)."""

    def get_status_unique(self, unique: str) -> JobStatus:
        return JobStatus(unique, False, False, 0, 0)


class Listed(ResultsInS3):
    """S3 as above, saying which prefixes were listed and how many keys that took."""

    def __init__(self, listed: list[str]) -> None:
        super().__init__(listed)
        self.prefixes: list[str] = []
        self.keys = 0

    def list(self, prefix: str) -> Iterator[str]:
        self.prefixes.append(prefix)
        got = [k for k in self.listed if k.startswith(prefix)]
        self.keys += len(got)
        return iter(got)


def test_a_job_thought_lost_is_looked_for_in_s3_under_its_own_keys(tmp_path: Path) -> None:
    """A job gearmand no longer holds, with no result past the lost grace, was looked for in S3
    by listing the whole run: at 5,000 jobs 15,000 objects (log, JUnit, record each) for every
    job whose record was late, which made records later still (docs/speed.md)."""
    db, cfg, p = planned(tmp_path, "lj", targets=1, suites=40)
    ledger = Ledger(db)
    t = p.targets[0]
    build = record(JobId("lj", t, "build")).model_copy(update={"artifact_key": f"artifacts/{REV}/{t}/x/a.tar.zst",
                                                               "artifact_sha256": "7" * 64})
    assert ledger.apply(build, "nightly") == "applied"
    tests = [j for j in p.expected if j.kind == "test"]
    others = [keys.job_file("lj", t, j.step, n) for j in tests for n in ("log.txt", "junit.xml")]
    store, client = Listed(others), Forgetful()
    dog = nightly.Watchdog(cfg, db, ledger, store, client, p, set())  # type: ignore[arg-type]
    dog.release(tests)
    states = db.job_states("lj")
    keeps_up = {"collect": FunctionStatus(0, 0, 1)}
    now = time.time()
    for k in range(-(-len(tests) // nightly.STATUS_SWEEP)):  # until each was asked about once
        dog.check(tests, states, now + 0.2 * k, keeps_up)
    dog.check(tests, states, now + cfg.farm.lost_grace + 1, keeps_up)
    assert sorted(store.prefixes) == sorted(keys.job_results("lj", t, j.step) for j in tests)
    assert store.keys == 0, "another job's keys were listed"


@pytest.mark.parametrize("targets", [1, 60])
def test_the_report_passes_over_the_records_a_bounded_number_of_times(targets: int) -> None:
    """document.build rebuilt the set of recorded jobs once per expected job (jobs² steps), and
    its targets' spans went over every record once per target (targets × jobs)."""
    names = [f"linux-t{i:02d}" for i in range(targets)]
    jids = [JobId("rp", t, s) for t in names for s in ["build"] + [f"test-s{i:04d}" for i in range(3000 // targets)]]
    run = Run(run_id="rp", rev=REV, created_at=1.0, finished_at=2.0, expected=[str(j) for j in jids], targets=names,
              state="finished", notes={}, parent_run_id=None, project="engine")

    class Passes(list):  # type: ignore[type-arg]
        count = 0

        def __iter__(self) -> Iterator[ResultRecord]:
            Passes.count += 1
            return super().__iter__()

    records = Passes(record(j) for j in jids[:-1])  # the last job's result never came
    Passes.count = 0
    rep = document.build(run, records)
    assert rep.missing == [str(jids[-1])]
    assert Passes.count <= 20, f"the records were iterated {Passes.count} times for {len(jids)} jobs"


def test_the_reports_performance_figures_read_no_records_again(tmp_path: Path) -> None:
    """publisher made the night's figures with perf.figures(db, run), which read every record of
    the run from the database again (every case of every suite) though the report had them,
    and read them for a night without any benchmark too."""
    from gearfarm.perf import analysis

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    jids = night(db, "pf", 30)
    ledger = Ledger(db)
    for jid in jids:
        assert ledger.apply(record(jid), "nightly") == "applied"
    run = db.get_run("pf")
    assert run is not None
    sql = statements(db)
    assert analysis.figures(db, run) == []
    assert not [s for s in sql if "jobs.record" in s]


def test_history_queries_load_neither_expected_jobs_nor_other_targets(tmp_path: Path) -> None:
    """The nightly asks each target's last durations (step_seconds) and the report each target's
    history (runs_before): both loaded every earlier run's whole expected list, and step_seconds
    every record of the run, for each target: targets × jobs per night."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    targets = tuple(f"linux-t{i}" for i in range(4))
    jids = night(db, "n1", 20, targets)
    ledger = Ledger(db)
    for jid in jids:
        assert ledger.apply(record(jid), "nightly") == "applied"
    sql = statements(db)
    runs = db.runs_before(time.time(), "engine", targets[1], limit=5)
    assert [r.run_id for r in runs] == ["n1"]
    want = {"build": 1.0} | {f"test-s{i:03d}": 1.0 for i in range(20)}
    assert db.step_seconds("engine", targets[1], time.time()) == want
    assert not [s for s in sql if "runs.expected" in s or "runs.notes" in s]
    reads = [s for s in sql if "FROM jobs" in s]
    assert reads and all("jobs.target = ?" in s for s in reads), reads


class CountedPlan(nightly.Plan):
    """A plan that counts how often its jobs are made (each time: every job of the night)."""

    made = 0

    @property
    def expected(self) -> list[JobId]:
        CountedPlan.made += 1
        return super().expected


@dataclass
class PolledDB:
    """The results database as the wait loop polls it: the jobs pending for ``polls`` polls."""

    ids: list[str]
    polls: int
    asked: int = 0
    cancels: int = 0

    def job_states(self, run_id: str) -> dict[str, str]:
        return {} if self.asked <= self.polls else {j: "passed" for j in self.ids}

    def job_states_since(self, run_id: str, since: float) -> tuple[dict[str, str], float]:
        self.asked += 1  # once a poll (RunStates.read)
        return self.job_states(run_id), 1.0

    def get_run(self, run_id: str) -> None:
        return None

    def cancellations(self, run_id: str) -> list[object]:
        self.cancels += 1
        return []

    def jobs(self, run_id: str) -> list[ResultRecord]:
        return []


def test_the_wait_loop_and_its_progress_make_the_nights_jobs_once(tmp_path: Path) -> None:
    """Each 0.2 s poll made every job id of the night again, twice (the pending list, then the
    progress lines, and on a terminal once per target): polls × jobs, and the polls grow with
    the jobs."""
    from gearfarm.cli.nightly_cmd import _ConsoleObserver, _table

    steps = [f"s{i:03d}" for i in range(20)]
    targets = [f"linux-t{i}" for i in range(5)]
    p = CountedPlan("wl", Source("engine", REV, "5" * 64, "6" * 64), targets, {t: steps for t in targets},
                    {t: [] for t in targets}, deadline=time.time() + 600)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cfg = Config(gearman={"servers": ["127.0.0.1:1"]},  # nothing there: no functions table, no judging
                 farm=FarmConfig(state_dir=str(tmp_path / "state"), **keyed(tmp_path, url)))  # type: ignore[arg-type]
    db = PolledDB([str(j) for j in p.expected], polls=8)
    observer, lines = _ConsoleObserver(), []
    CountedPlan.made = 0

    def progress(states: dict[str, str], fns: dict[str, FunctionStatus]) -> None:
        observer.progress(p, states, fns)
        _table(p, observer._order(p), states, fns)
        lines.append(len(observer.last))

    nightly.wait(cfg, db, None, ResultsInS3([]), None, p, progress, poll=0)  # type: ignore[arg-type]
    assert db.asked == 9
    assert CountedPlan.made <= 3, f"the night's jobs were made {CountedPlan.made} times in 9 polls"


def test_the_wait_loop_looks_for_cancel_requests_once_a_second_not_every_poll(tmp_path: Path) -> None:
    """Every 0.2 s poll read the run's cancel requests, a fifth of the nightly's CPU in a 500-job
    night (docs/speed.md); a person's cancel is found within CANCEL_LOOK, and the job's own
    heartbeat finds its marker within a beat anyway."""
    steps = [f"s{i:03d}" for i in range(5)]
    p = CountedPlan("cl", Source("engine", REV, "5" * 64, "6" * 64), [T], {T: steps}, {T: []},
                    deadline=time.time() + 600)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    cfg = Config(gearman={"servers": ["127.0.0.1:1"]},
                 farm=FarmConfig(state_dir=str(tmp_path / "state"), **keyed(tmp_path, url)))  # type: ignore[arg-type]
    db = PolledDB([str(j) for j in p.expected], polls=40)
    t0 = time.monotonic()
    nightly.wait(cfg, db, None, ResultsInS3([]), None, p, None, poll=0.01)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert db.asked == 41
    assert 1 <= db.cancels <= 1 + took, f"{db.cancels} looks in {took:.2f}s of 41 polls"


def test_a_polls_read_of_what_changed_is_one_statement(tmp_path: Path) -> None:
    """A poll's read of the jobs that changed was two statements (the changed jobs' states, then
    the latest change's time) in an ORM session, five times a second; one now, which also gives
    the time (and on PostgreSQL outside a transaction: ResultsDB.polling)."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    jids = night(db, "ch", 20)
    ledger = Ledger(db)
    for i, jid in enumerate(jids[1:4]):
        assert ledger.apply(record(jid, finished=1000.0 + i), "nightly") == "applied"
    sql = statements(db)
    got, latest = db.job_states_since("ch", 0.0)
    assert len([s for s in sql if s.lstrip().upper().startswith("SELECT")]) == 1, sql
    assert got == {str(j): "passed" for j in jids[1:4]}
    assert latest == max(d.at for d in db.deliveries("ch"))
    assert db.job_states_since("ch", latest + 1) == ({}, None)


def test_a_steps_page_reads_its_targets_records_only(tmp_path: Path) -> None:
    """The step page (and a build's download) read every record of the run, every case of
    every suite, to show one step and its target's other steps: a 5,000-job night's step page
    took seconds."""
    from gearfarm.web import dashboard

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    targets = tuple(f"linux-t{i}" for i in range(4))
    ledger = Ledger(db)
    for jid in night(db, "sp", 10, targets):
        assert ledger.apply(record(jid), "nightly") == "applied"
    sql = statements(db)
    page = dashboard.step_log(db, "sp", targets[2], "test-s003", None)
    assert page is not None and page["record"]["status"] == "passed" and len(page["siblings"]) == 10
    reads = [s for s in sql if "FROM jobs" in s]
    assert reads and all("jobs.target = ?" in s for s in reads), reads


def test_a_worker_makes_one_context_per_role_not_per_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """workers.base.serve made a Context (S3 and gearmand clients, keys, the host's fingerprint,
    the sandbox check) for every function it serves, though it keeps one per role: a worker of
    100 targets made 200 and took minutes to start while 127 others did the same."""
    import threading

    from gearfarm.workers import base

    made: list[str] = []

    class Ctx:
        def __init__(self, cfg: Config, role: str) -> None:
            made.append(role)
            self.work = tmp_path / "work"
            self.client = self
            self.disk = self  # the slot's job disk: opened once, closed at the end

        def open(self) -> Ctx:
            return self

        def close(self) -> None:
            pass

        def flush_spool(self) -> None:
            pass

        def drain(self, timeout: float) -> bool:
            return True

    class GearmanWorker:
        client_id = "w"

        def stop_on_signals(self, stop: threading.Event) -> None:
            pass

        def register(self, function: str, handler: object) -> None:
            self.registered = [*getattr(self, "registered", []), function]

        def work(self, stop: threading.Event) -> None:
            pass

        def close(self) -> None:
            pass

    worker = GearmanWorker()
    monkeypatch.setattr(base, "Context", Ctx)
    monkeypatch.setattr(base, "gearman_worker", lambda cfg, name, prefer=None: worker)
    functions = [(r, f"{r}:linux-t{i:03d}", base.run_step) for i in range(100) for r in ("build", "test")]
    stop = threading.Event()
    stop.set()
    base.serve(Config(), functions, stop)  # type: ignore[arg-type]
    assert sorted(made) == ["build", "test"]
    assert len(worker.registered) == 200


def test_a_dashboard_that_started_many_runs_keeps_no_zombie_and_a_bounded_list(tmp_path: Path) -> None:
    """Found by reading, for the soak: a dashboard kept every self-service run's nightly Popen
    forever, and an ended process nobody waits for stays a zombie, one per run it started."""
    import os
    import subprocess

    from gearfarm.web import app

    started: dict[str, app.Started] = {}
    for i in range(app.STARTED_KEPT + 20):
        proc = subprocess.Popen(["true"])
        started[f"r{i}"] = app.Started(f"r{i}", "ann", float(i), proc, tmp_path / f"r{i}.log")
    pids = [s.proc.pid for s in started.values()]
    time.sleep(0.5)  # every `true` has exited
    running = subprocess.Popen(["sleep", "30"])
    started["running"] = app.Started("running", "ann", 999.0, running, tmp_path / "running.log")
    try:
        app._forget_ended(started)
        assert list(started)[0] == "r20" and len(started) == app.STARTED_KEPT + 1 and "running" in started
        for pid in pids:  # reaped: none is left a zombie of this process
            assert not Path(f"/proc/{pid}").exists() or "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
        with pytest.raises(ChildProcessError):
            os.waitpid(pids[0], os.WNOHANG)
    finally:
        running.kill()
        running.wait()


def test_the_report_copies_a_nights_job_files_to_disk_several_at_a_time(tmp_path: Path, minio) -> None:  # type: ignore[no-untyped-def]
    """bench/scale.py: a 5,000-job night's report copied its 10,000 job files from S3 to disk one
    after the other (two requests each). Copies overlap now; every file still arrives, and a file
    S3 lacks (a JUnit file never stored) is no problem."""
    import threading

    from gearfarm.report import joblog
    from gearfarm.s3.store import ArtifactStore

    store = ArtifactStore(minio.s3_config(), retry_for=0.0, attempts=1)
    store.ensure_bucket()
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    ledger, recs = Ledger(db), []
    for i, jid in enumerate(night(db, "copies", 24)[1:]):
        log_key, junit_key = keys.job_file("copies", T, jid.step, "log.txt"), keys.job_file("copies", T, jid.step,
                                                                                              "junit.xml")
        store.put_bytes(log_key, f"log {i}\n".encode())
        if i:  # the first job's JUnit file never reached S3
            store.put_bytes(junit_key, f"<testsuite name='{i}'/>".encode())
        recs.append(farm_record(jid, REV, "passed", "").model_copy(update={"log_key": log_key,
                                                                           "junit_key": junit_key}))
        assert ledger.apply(recs[-1], "nightly") == "applied"
    in_flight, most, lock = 0, 0, threading.Lock()
    get_file = store.get_file

    def counted(key: str, dest: Path) -> int:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        try:
            return get_file(key, dest)
        finally:
            with lock:
                in_flight -= 1

    store.get_file = counted  # type: ignore[method-assign]
    assert joblog.copy_all(store, db, recs, tmp_path) == []
    assert most > 1
    for i in range(24):
        step = tmp_path / "copies" / joblog.relative(T, f"test-s{i:03d}", "log.txt")
        assert step.read_text() == f"log {i}\n"
        assert (step.parent / "junit.xml").exists() == bool(i)


def test_a_nights_job_files_are_copied_as_its_jobs_end_and_the_report_copies_only_the_rest(
        tmp_path: Path, minio) -> None:  # type: ignore[no-untyped-def]
    """bench/scale.py: after a 5,000-job night's report the nightly copied its 10,000 job files to
    disk, 45 s between the last job and its end. The copier makes them while the night runs, as
    jobs end; the report copies what it did not: a job that ended after it stopped, and a job
    whose record a later one replaced (its files are that record's)."""
    from gearfarm.report import joblog
    from gearfarm.s3.store import ArtifactStore

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    store = ArtifactStore(minio.s3_config(), retry_for=0.0, attempts=1)
    store.ensure_bucket()
    jids = night(db, "cp", 8)
    ledger, runs = Ledger(db), tmp_path / "runs"

    def ended(jid: JobId, attempt: int = 1) -> None:
        log_key = keys.job_file("cp", T, jid.step, "log.txt")
        store.put_bytes(log_key, f"{jid.step} attempt {attempt}\n".encode())
        rec = record(jid).model_copy(update={"log_key": log_key, "attempt": attempt, "finished_at": 1000.0 + attempt})
        assert ledger.apply(rec, "nightly") == "applied"

    copier = joblog.Copier(store, db, runs)
    for jid in jids[:6]:
        ended(jid)
        copier.offer(db.job_states("cp"))
    copy = runs / "cp" / joblog.relative(T, jids[5].step, "log.txt")
    wait_for("the copier to copy the sixth job's log", copy.exists, 30)
    made = copier.close()
    assert set(made) == {str(j) for j in jids[:6]}
    for jid in jids[6:]:  # ended after the copier stopped
        ended(jid)
    ended(jids[2], attempt=2)  # a later attempt's record replaced the one copied
    copier.offer(db.job_states("cp"))  # stopped: nothing more is copied
    asked: list[str] = []
    get_file = store.get_file

    def counted(key: str, dest: Path) -> int:
        asked.append(key)
        return get_file(key, dest)

    store.get_file = counted  # type: ignore[method-assign]
    assert joblog.copy_all(store, db, db.jobs("cp", cases=False), runs, made) == []
    assert sorted(asked) == sorted(keys.job_file("cp", T, j.step, "log.txt") for j in [jids[2], *jids[6:]])
    for jid in jids:
        attempt = 2 if jid == jids[2] else 1
        got = (runs / "cp" / joblog.relative(T, jid.step, "log.txt")).read_text()
        assert got == f"{jid.step} attempt {attempt}\n"
    # A disk that cannot take the copies is a problem the report names, not a crash of it.
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    problems = joblog.copy_all(store, db, db.jobs("cp", cases=False)[:2], blocked)
    assert len(problems) == 2 and all("not copied to disk" in p for p in problems), problems


@pytest.mark.parametrize("dashboard", ["https://farm.lab/", ""])
def test_with_a_dashboard_the_report_is_mailed_before_its_job_files_are_copied(
        tmp_path: Path, minio, dashboard: str) -> None:  # type: ignore[no-untyped-def]
    """A report whose links go to the dashboard (which reads S3 first) no longer waits for the
    disk copies of every job file: they are made after the message. Without a dashboard the
    report links to the copies, so they come first. Either way every file is copied."""
    from gearfarm.config import S3Config, WebConfig
    from gearfarm.report import joblog, publisher
    from gearfarm.s3.store import ArtifactStore

    cfg = Config(s3=S3Config.model_validate(minio.s3_config().model_dump()), web=WebConfig(url=dashboard or None),
                 database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'r.db'}"),
                 farm=FarmConfig(state_dir=str(tmp_path / "state")))
    db, store = ResultsDB(cfg.database.url), ArtifactStore(cfg.s3, retry_for=0.0, attempts=1)
    store.ensure_bucket()
    run_id = "mailed" + ("-web" if dashboard else "")
    jids = night(db, run_id, 6)
    for jid in jids:
        key = keys.job_file(run_id, T, jid.step, "log.txt")
        store.put_bytes(key, b"log\n")
        Ledger(db).apply(farm_record(jid, REV, "passed", "").model_copy(update={"log_key": key}), "nightly")
    run = db.get_run(run_id)
    assert run is not None
    publisher.publish(cfg, db, store, [run], {run_id: db.jobs(run_id)}, send_mail=False)
    out = cfg.runs_dir() / run_id
    copies = [out / joblog.relative(T, j.step, "log.txt") for j in jids]
    assert all(c.read_bytes() == b"log\n" for c in copies)
    eml = (out / "report.eml").stat().st_mtime_ns
    if dashboard:
        assert dashboard in (out / "report.html").read_text()
        assert min(c.stat().st_mtime_ns for c in copies) >= eml
    else:
        assert max(c.stat().st_mtime_ns for c in copies) <= eml


def test_classifying_a_night_reads_only_the_history_of_cases_that_fail_or_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/scale.py: the report classified every case of the night against its whole history
    (HISTORY_RUNS earlier runs each): for a 5,000-job night with 100 nights behind it, 20
    million rows read and 200,000 cases judged one by one, 16 s of a 24 s report. A case that
    passes now and failed in none of those runs is "passed" whatever else it did; only the cases
    failing now or failing before are read, with their whole history, and the rest is not."""
    from gearfarm.db import history
    from gearfarm.formats.result import CaseResult

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    ledger = Ledger(db)
    cases = 20

    def status(i: int, n: int) -> str:
        # c0 fails from night 30 on (known, since h30); c2 failed on night 5 only (passed now);
        # c3 failed last night only (fixed tonight); the rest never fail.
        return "failed" if (i == 0 and n >= 30) or (i == 2 and n == 5) or (i == 3 and n == 39) else "passed"

    for n in range(41):
        run_id = f"h{n:02d}"
        for jid in night(db, run_id, 1):
            rec = record(jid).model_copy(update={"cases": [CaseResult(name=f"c{i}", status=status(i, n))
                                                           for i in range(cases)]} if jid.kind == "test" else {})
            ledger.apply(rec, "nightly")
    read: list[tuple[str, ...]] = []
    statuses = ResultsDB.case_statuses
    monkeypatch.setattr(ResultsDB, "case_statuses", lambda self, ids, keys: read.extend(
        got := statuses(self, ids, keys)) or got)
    monkeypatch.setattr(ResultsDB, "cases_in", lambda *_: pytest.fail("every case of the history was read"))
    current = db.get_run("h40")
    assert current is not None
    verdicts = {v.name: v for v in history.classify_run(db, current, db.jobs("h40"))}
    assert verdicts["c0"].kind == "known" and verdicts["c0"].since_run == "h30"
    assert verdicts["c3"].kind == "fixed" and verdicts["c2"].kind == "passed"
    assert set(verdicts) == {"c0", "c2", "c3"}  # the 17 others pass and never failed: passed, unread
    # The three cases' outcomes in the 41 runs, no other case's (820 rows before).
    assert sorted({r[3] for r in read}) == ["c0", "c2", "c3"] and len(read) == 3 * 41, len(read)

def test_the_dashboards_front_page_reads_each_runs_jobs_once_not_once_per_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/big_night.py: the front page (dashboard.status) parsed a run's expected job ids once
    per target and run shown: for 100 targets × 50 jobs, 2 million parses and 6.5 s a page.
    Each run's jobs are parsed once."""
    from gearfarm.web import dashboard

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    targets = tuple(f"linux-t{i:02d}" for i in range(20))
    for n in range(3):
        night(db, f"n{n}", 9, targets)
    parsed = 0
    parse = JobId.parse

    def counted(text: str) -> JobId:
        nonlocal parsed
        parsed += 1
        return parse(text)

    monkeypatch.setattr(dashboard.JobId, "parse", staticmethod(counted))
    page = dashboard.status(db)
    assert [t["target"] for t in page["projects"][0]["targets"]] == list(targets)
    assert all(len(t["strip"]) == 3 for t in page["projects"][0]["targets"])
    assert parsed == 3 * 20 * 10, parsed  # each of the 3 runs' 200 jobs once (12,000 before)


def test_the_tests_page_reads_whole_runs_and_says_how_many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/big_night.py: the tests page read at most 100,000 case rows of its 30 runs in one
    query without an order: a 5,000-job night has 200,000, so the page showed an arbitrary half
    of one night and said "in the last 30 runs". It reads whole runs, newest first, until its
    row budget, and names the runs it read."""
    from gearfarm.formats.result import CaseResult
    from gearfarm.web import dashboard

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    ledger = Ledger(db)
    for n in range(4):
        for jid in night(db, f"n{n}", 3):
            # c0 of each suite fails on the newest night only.
            rec = record(jid, finished=1000.0 + n).model_copy(update={"cases": [
                CaseResult(name=f"c{i}", status="failed" if i == 0 and n == 3 else "passed") for i in range(20)]}
                if jid.kind == "test" else {})
            ledger.apply(rec, "nightly")
        with db.writing() as conn:  # one night a day, newest last
            conn.execute(Run.__table__.update().where(Run.run_id == f"n{n}").values(created_at=1000.0 * (n + 1)))
    monkeypatch.setattr(dashboard, "TESTS_ROWS", 100)  # 60 cases a night: the newest 2 nights whole
    page = dashboard.tests(db)
    assert page["runs_read"] == 2 and page["found"] == 60
    cells = [cell for t in page["tests"] for cell in t["targets"].values()]
    assert all(c["runs"] == 2 for c in cells), {c["runs"] for c in cells}
    failing = {t["test"] for t in page["tests"] if t["failing"]}
    assert failing == {"s000/c0", "s001/c0", "s002/c0"}
    assert all(t["targets"][T]["fail_rate"] == 0.5 for t in page["tests"] if t["test"] in failing)


def test_recording_a_jobs_duration_writes_one_line_not_every_known_duration(tmp_path: Path) -> None:
    # A host serving 100 targets knows 5,000 durations (each target's suites); each job
    # rewrote them all (300 KB of indented JSON) to fold in its own.
    d = Durations(tmp_path / "host.json")
    d.path.write_text(json.dumps({f"test:t{i // 50}/test-s{i % 50}": 1.0 for i in range(5000)}))
    written = write_counter(d.path.parent)
    for i in range(100):
        d.record("test:t7", 2.0, f"test-s{i % 50}")
    assert written() < 100 * 200, "bytes written by 100 jobs' durations"
    got = d.load()
    assert len(got) == 5001 and got["test:t7/test-s3"] == 1.75 and got["test:t7"] == 2.0
    # Past JOURNAL_BYTES the journal is folded into the file, and nothing changes by it.
    sizes = []
    for _ in range(JOURNAL_BYTES // 16):
        d.record("test:t7", 2.0, "test-s3")
        sizes.append(d.journal.stat().st_size)
    assert max(sizes) <= JOURNAL_BYTES + 100 and min(sizes) == 0 and d.load()["test:t7/test-s3"] == pytest.approx(2.0)
    assert json.loads(d.path.read_text())["test:t7/test-s3"] == pytest.approx(2.0)


def write_counter(folder: Path):  # noqa: ANN201 - a closure
    """Bytes written into ``folder``'s files from now on: the sum of their sizes' growth, each
    file replaced counted whole (an os.replace makes a new inode)."""
    before = {p.name: (p.stat().st_ino, p.stat().st_size) for p in folder.iterdir()}

    def written() -> int:
        n = 0
        for p in folder.iterdir():
            ino, size = p.stat().st_ino, p.stat().st_size
            was = before.get(p.name)
            n += size - was[1] if was and was[0] == ino else size
        return n
    return written


def test_the_live_page_finds_each_functions_workers_in_one_pass(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/scale.py at 64 hosts: `/live` asked, for each function, each connected worker
    whether it serves it: functions × workers × each worker's functions (1.3 million looks for
    128 slots of 100 targets, most of a 245 ms page). Each worker's list is read once. The
    workers are real connections to a real gearmand; only their listed functions are counted."""
    from dataclasses import replace

    from gearfarm.config import GearmanConfig
    from gearfarm.gearman import Client, Worker
    from gearfarm.hosts.gearmand import Gearmand
    from gearfarm.web import dashboard

    looks = 0

    class Counted(list):  # type: ignore[type-arg]
        def __contains__(self, item: object) -> bool:
            nonlocal looks
            for x in self:
                if x == item:
                    return True
            return False

        def __iter__(self) -> Iterator[str]:
            nonlocal looks
            for x in super().__iter__():
                looks += 1
                yield x

    n_workers, n_functions = 12, 30
    with Gearmand(tmp_path / "gm") as gm:
        workers = [Worker([gm.address], client_id=f"h{i}-test-{i}") for i in range(n_workers)]
        try:
            for w in workers:
                for f in range(n_functions):
                    w.register(f"test:linux-t{f:02d}", lambda job: b"")
                w.work_one(0.05)  # connects, and tells gearmand what it serves
            cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]))
            real = dashboard.admin.workers
            monkeypatch.setattr(dashboard.admin, "workers", lambda *a, **k: [
                replace(w, functions=Counted(w.functions)) for w in real(*a, **k)])
            with Client([gm.address]) as c:
                for f in range(n_functions):
                    c.submit_background(f"test:linux-t{f:02d}", b"", unique=f"u{f}")
            (server,) = dashboard.gearmand(cfg)
        finally:
            for w in workers:
                w.close()
    listed = {f["function"]: f["worker_ids"] for f in server["functions"]}
    assert listed == {f"test:linux-t{f:02d}": sorted(f"h{i}-test-{i}" for i in range(n_workers))
                      for f in range(n_functions)}
    assert looks <= n_workers * n_functions, looks  # each worker's functions once (~5,600 before)


def test_the_ledger_writes_a_known_hosts_row_once_a_minute_not_per_record(db_url: str) -> None:
    """Each record a host delivers refreshed its host's row (last_seen): one of a record's round
    trips, 5,000 a night for a fact the dashboard shows to the minute. A row the ledger found
    there is refreshed once a minute; a new host's row is still made with its first record."""
    from gearfarm.db.results import Host

    db = ResultsDB(db_url)
    jids = night(db, "hosts", 6)
    ledger = Ledger(db)
    sql = statements(db)
    for jid in jids:
        r = record(jid).model_copy(update={"host": {"hostname": "h1", "cpu": "c", "cores": "2"}})
        assert ledger.apply(r, "collect") == "applied"
    writes = [s for s in sql if s.lstrip().upper().startswith("INSERT INTO HOSTS")]
    assert len(writes) == 2, writes  # made, then found there; 7 before
    with db.session() as s:
        assert [h.hostname for h in s.query(Host)] == ["h1"]


def test_the_nightly_records_its_jobs_states_in_one_statement_not_one_a_job(db_url: str) -> None:
    """bench/scale.py, 64 hosts × 5,000 jobs under cProfile: the nightly spent 150 of its 520 s
    in set_live, which made, compiled and sent one upsert per job whose state changed. A change
    of any size is one statement, made once; the attempt recorded still never goes down."""
    db = ResultsDB(db_url)
    jids = night(db, "live", 199)
    db.set_live("live", {str(j): ("queued", 2) for j in jids})
    sql = statements(db)
    db.set_live("live", {str(j): ("running", 1) for j in jids})
    assert len([s for s in sql if "live_jobs" in s]) == 1, len(sql)
    seen = db.live(["live"])
    assert len(seen) == 200 and {(j.state, j.attempt) for j in seen.values()} == {("running", 2)}


def test_the_nightlys_poll_keeps_one_admin_connection_to_gearmand(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The nightly read gearmand's function table at every 0.2 s poll on a connection of its
    own: a connect (behind TLS a handshake) five times a second all night. The poll's Board
    keeps one, and makes it again when gearmand restarted meanwhile, at the same poll."""
    from gearfarm.gearman import admin
    from gearfarm.hosts.gearmand import Gearmand

    made: list[tuple[str, int]] = []
    connect = admin._connect

    def counted(host: str, port: int, *args: object, **kw: object) -> object:
        made.append((host, port))
        return connect(host, port, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(admin, "_connect", counted)
    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman={"servers": [f"127.0.0.1:{gm.address[1]}"]},  # type: ignore[arg-type]
                     farm=FarmConfig(state_dir=str(tmp_path / "state")))
        board = nightly.Board(cfg)
        try:
            made.clear()  # gearmand's own start asked it over admin connections
            tables = [board.table() for _ in range(20)]
            assert len(made) == 1 and all(t == {} for t in tables)
            gm.restart()
            made.clear()
            assert board.table() == {}  # the closed connection made again, not an error
            assert len(made) == 1
        finally:
            board.close()


class LookedPlan(nightly.Plan):
    """A plan that counts the looks at its jobs' readiness (one per job a poll looks at)."""

    looks = 0

    def ready(self, jid: JobId, states: dict[str, str]) -> bool:
        LookedPlan.looks += 1
        return super().ready(jid, states)


def test_a_polls_look_at_the_jobs_grows_with_what_changed_not_with_what_is_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 0.2 s poll looked at every pending job (its readiness, its lease, its live state)
    and at each one's Gearman function for the no-worker rule: 7 ms a poll at 2,500 pending, so
    a 5,000-job night's nightly spent 27.6 CPU ms a job against 20.7 at 1,000 (docs/speed.md).
    Between whole reads a poll now looks at the jobs whose state changed, those with a lease or
    in doubt, and the next STATUS_SWEEP of the sweep."""
    jobs, per_poll = 2000, 20
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    cfg = Config(database=DatabaseConfig(url=url), farm=FarmConfig(state_dir=str(tmp_path / "state"),
                                                                   **keyed(tmp_path, url)))  # type: ignore[arg-type]
    steps = [f"s{i:04d}" for i in range(jobs)]
    p = LookedPlan("lk", Source("engine", REV, "5" * 64, "6" * 64), [T], {T: steps}, {T: []},
                   deadline=time.time() + 600)
    assert db.create_run(p.run_id, REV, [T], [str(j) for j in p.expected])
    ledger = Ledger(db)
    build = record(JobId("lk", T, "build")).model_copy(update={"artifact_key": f"artifacts/{REV}/{T}/x/a.tar.zst",
                                                               "artifact_sha256": "7" * 64})
    assert ledger.apply(build, "nightly") == "applied"
    tests = [j for j in p.expected if j.kind == "test"]
    table = {"collect": FunctionStatus(0, 0, 1), tests[0].function: FunctionStatus(jobs, 1, 1)}

    class Board:
        def __init__(self, cfg: Config) -> None:
            pass

        def table(self) -> dict[str, FunctionStatus]:
            return table

        def close(self) -> None:
            pass

    monkeypatch.setattr(nightly, "Board", Board)
    client = SweptGearmand()
    polls = []

    def progress(states: dict[str, str], fns: dict[str, FunctionStatus]) -> None:
        polls.append(LookedPlan.looks)
        done = len(polls) * per_poll
        for jid in tests[done - per_poll:done]:
            assert ledger.apply(record(jid), "nightly") == "applied"

    LookedPlan.looks = 0
    nightly.wait(cfg, db, ledger, ResultsInS3([]), client, p, progress, poll=0)  # type: ignore[arg-type]
    assert len(polls) >= jobs // per_poll and len(client.sent) == jobs
    looks = [b - a for a, b in zip(polls, polls[1:], strict=False)][1:]  # the first poll looks at every job
    assert max(looks) <= per_poll + nightly.STATUS_SWEEP + 10, f"a poll looked at up to {max(looks)} jobs"
    assert LookedPlan.looks <= 3 * jobs, f"{LookedPlan.looks} looks at the jobs of a {jobs}-job night"


@dataclass
class SweptGearmand(Submissions):
    """gearmand holding every job sent to it, queued."""

    def get_status_unique(self, unique: str) -> JobStatus:
        return JobStatus(unique, True, False, 0, 0)
