"""The chaos suite (issue: nothing lost, nothing forged). Each case runs real nightlies on a real
farm (gearmand with its persistent queue, MinIO, the collector, workers; PostgreSQL for one
case) while something breaks, and counts what happened -- never what the primary key allows:

- per job: results APPLIED (the ledger's deliveries table, outcome "applied") and command
  STARTS (`COMMAND START job=...` lines in the workers' logs, appended across restarts);
- runs completed (nightly exit 0), jobs lost (an expected job whose final row is not passed),
  forged results applied (an applied record no farm worker sealed), and applied results whose
  attempt is not the newest (see Tally._count_run).

Each case prints one line, `CHAOS <case>: key=value ...`, and asserts its counts. The small
profile runs in `make test`; the full one (50 worker kills, 20 gearmand kills, a 30 s MinIO
outage, 10,000 fuzzed payloads and 10,000 forged results) runs alone with:
    GEARFARM_CHAOS=full .venv/bin/python -m pytest tests/farm/test_chaos.py -s
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.db.registry import Registry
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import COLLECT_FUNCTION, JobId, Payload, Source, make_payload, sign
from gearfarm.formats.result import ResultRecord, seal_record
from gearfarm.formats.seal import Signer
from gearfarm.gearman import BackgroundJob, Client, admin
from gearfarm.run.farm import EmbeddedFarm
from tests.chaoskit import (
    LONG_STEPS,
    TARGET,
    FarmView,
    Nightly,
    Start,
    StartWatch,
    Tally,
    kill_collector_holding,
    kill_worker_mid_job,
    minio_outage,
    restart_gearmand,
    restarted,
    start_farm,
    starts_in,
    wait_for,
)
from tests.farmkit import ROOT, edit_catalog, key_secrets, keyed, make_repo
from tests.pg import PostgresServer, pg_server, pg_url  # noqa: F401 - fixtures

PROFILE = os.environ.get("GEARFARM_CHAOS", "small")
SIZE: dict[str, float] = {
    # worker_kills_per_attempt: kills of one attempt of one job. gearmand (--job-retries 3) gives
    # a job up after its third lost worker, so 3 also exercises the nightly's resubmission.
    "small": {"worker_kills": 2, "worker_kills_per_run": 2, "worker_kills_per_attempt": 1, "gearmand_kills": 1,
              "gearmand_kills_per_run": 1, "minio_outage": 10.0, "collector_kills": 2, "fuzz_payloads": 1000,
              "forged_results": 1000},
    "full": {"worker_kills": 50, "worker_kills_per_run": 5, "worker_kills_per_attempt": 3, "gearmand_kills": 20,
             "gearmand_kills_per_run": 10, "minio_outage": 30.0, "collector_kills": 10, "fuzz_payloads": 10000,
             "forged_results": 10000},
}[PROFILE]


# ------------------------------------------------------------------------------ the farm

@pytest.fixture(scope="module")
def chaos_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine with a model suite slow enough (seconds) to be hit in the middle."""
    repo = make_repo(tmp_path_factory.mktemp("chaos") / "repo")
    edit_catalog(repo, '"--ops", "20000"', '"--ops", "40000"', "slower model suite for chaos")
    return repo


@pytest.fixture
def farm(chaos_repo: Path, tmp_path: Path) -> Iterator[EmbeddedFarm]:
    f = start_farm(chaos_repo, tmp_path / "state")
    try:
        yield f
    finally:
        f.stop()


# ------------------------------------------------------------------------------ the cases

# The full profile's 50 kills, each mid-job waiting out its lease, take longer than the suite's
# 900 s per test: its first run (2026-11-27) was stopped by that timeout, not by a lost job.
@pytest.mark.timeout(3600 if PROFILE == "full" else 900)
def test_worker_killed_mid_job_loses_nothing(farm: EmbeddedFarm) -> None:
    """kill -9 of the worker group while a job's command runs; the supervisor restarts it and
    gearmand hands the job out again (or the nightly resubmits it once gearmand gave up).

    A kill is aimed into a command, but the command may end first: the worker then sealed its
    result and the kill fell between jobs, which proves nothing about a job. Such a miss is
    counted and made up by another kill, up to twice the target, rather than failing the case."""
    view, tally, rng = FarmView(farm), Tally(), random.Random(1)
    kills: list[Start] = []
    target, per_run = int(SIZE["worker_kills"]), int(SIZE["worker_kills_per_run"])
    mid_job, runs = 0, 0
    while mid_job < target and len(kills) < 2 * target:
        wanted = target - mid_job  # this round: the kills still missing
        aimed = 0
        for _ in range(wanted + 1):  # every run has a model suite to start, so one kill at least
            if aimed >= wanted:
                break
            watch = StartWatch(farm.state / "logs")
            with Nightly(farm.config_path, f"kill{runs}") as run:
                runs += 1
                done = 0
                per_attempt: Counter[tuple[str, int]] = Counter()
                while done < per_run and aimed < wanted:
                    s = watch.next(run, run.run_id, LONG_STEPS)
                    if s is None:
                        break
                    if per_attempt[s.job_id, s.attempt] >= SIZE["worker_kills_per_attempt"]:
                        continue  # let this one run (small profile: one build and one suite killed)
                    if not kill_worker_mid_job(farm, s, rng):
                        continue
                    kills.append(s)
                    per_attempt[s.job_id, s.attempt] += 1
                    done += 1
                    aimed += 1
                view.add_run(tally, run)
        view.count(tally)
        # A kill was mid-job if the killed worker never sealed a result for that job and attempt.
        finished = {(r.job_id, r.attempt, r.worker) for r in tally.records.values()}
        mid_job = sum((s.job_id, s.attempt, s.worker) not in finished for s in kills)
        if aimed == 0:
            break  # no run offered a command to kill: the assertion below says so
    tally.report("worker-kill-9", kills=len(kills), kills_mid_job=mid_job, kills_between_jobs=len(kills) - mid_job,
                 restarts=sum(v for k, v in farm.restarts.items() if k != "collector"))
    assert mid_job >= target, f"{mid_job} of {len(kills)} kills landed mid-job, {target} wanted"


def test_gearmand_killed_and_restarted_loses_no_job(farm: EmbeddedFarm) -> None:
    """kill -9 of gearmand, restarted at once on the same port with the same persistent queue;
    again, up to the profile's count, within one or a few runs. The first kill of a run lands
    while a job's command runs (the job is in the queue, its worker busy); the next ones at
    random moments of the run: fan-out, delivery to the collector, the nightly's polling."""
    view, tally, rng = FarmView(farm), Tally(), random.Random(2)
    kills = 0
    target, per_run = int(SIZE["gearmand_kills"]), int(SIZE["gearmand_kills_per_run"])
    for trial in range(target + 1):  # every run has a model suite to start, so one kill at least
        if kills >= target:
            break
        watch = StartWatch(farm.state / "logs")
        with Nightly(farm.config_path, f"gmd{trial}") as run:
            done = 0
            if watch.next(run, run.run_id, LONG_STEPS) is not None:
                while done < per_run and kills < target:
                    time.sleep(rng.uniform(0.3, 1.0) if done == 0 else rng.uniform(0.5, 2.0))
                    if run.proc.poll() is not None:
                        break
                    restart_gearmand(farm)
                    kills += 1
                    done += 1
            view.add_run(tally, run)
    view.count(tally)
    tally.report("gearmand-kill-9", kills=kills)
    assert kills == target


def test_minio_outage_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    """MinIO stopped while the model suite runs, so its result cannot reach S3 when it ends
    (the worker's S3 client retries, or the worker spools the record); started again on the
    same port and data after the outage."""
    view, tally = FarmView(farm), Tally()
    watch = StartWatch(farm.state / "logs")
    with Nightly(farm.config_path, "s3out") as run:
        assert watch.next(run, run.run_id, frozenset({"test-model"})) is not None
        minio_outage(farm, SIZE["minio_outage"])
        view.add_run(tally, run)
    view.count(tally)
    spooled = sum(p.read_text(errors="replace").count("spooled to") for p in view.logs())
    tally.report("minio-outage", outage_s=SIZE["minio_outage"], results_spooled=spooled)


def test_collector_killed_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    """kill -9 of the collector with a result waiting for it: it is stopped (SIGSTOP) when a
    job's command starts, killed once that job's record is queued in gearmand, and the
    supervisor's new collector takes the record from gearmand's queue (S3 reconcile is the
    nightly's second way in)."""
    view, tally = FarmView(farm), Tally()
    kills = held = 0
    target = int(SIZE["collector_kills"])
    for trial in range(2 * target + 2):
        if held >= target:
            break
        watch = StartWatch(farm.state / "logs")
        with Nightly(farm.config_path, f"coll{trial}") as run:
            # Counted by kills with a result waiting: a job quick enough to be collected before
            # the SIGSTOP landed leaves nothing queued, and that kill proves less.
            while held < target:
                if watch.next(run, run.run_id) is None:
                    break
                held += kill_collector_holding(farm, view)
                kills += 1
                watch.drain()  # act on the next start after the new collector is up
            view.add_run(tally, run)
    view.count(tally)
    tally.report("collector-kill-9", kills=kills, kills_with_result_waiting=held,
                 restarts=farm.restarts.get("collector", 0))
    assert held == target and kills >= held


def test_postgresql_restarted_mid_run_loses_no_result(farm: EmbeddedFarm, pg_server: PostgresServer,  # noqa: F811
                                                      pg_url: str) -> None:  # noqa: F811
    """The farm on PostgreSQL, restarted (stop, start on the same port and data) while the
    model suite runs; it stays down until the collector holds that suite's record and must
    retry, then comes back. The run ends with nothing lost."""
    if not isinstance(pg_server, PostgresServer):
        pytest.skip("an external PostgreSQL ($GEARFARM_TEST_POSTGRES_URL) cannot be restarted by the test")
    # The embedded farm writes a SQLite URL; point it at PostgreSQL and restart the collector
    # (the only long-running process that opens the database) so it reads the new file.
    cfg = config_mod.load(farm.config_path)
    cfg.database.url = pg_url
    config_mod.dump(cfg, farm.config_path)
    # The registry lives in the results database: the host is enrolled in this one too.
    Registry(ResultsDB(pg_url)).add(cfg.host_name(), cfg.host_signer().public_text, ["build", "test", "perf"], ["*"])
    old = farm.procs["collector"].pid  # type: ignore[attr-defined]
    os.killpg(old, signal.SIGTERM)
    restarted(farm, "collector", old)
    port = f"127.0.0.1:{pg_server.port}/"
    wait_for("the collector on PostgreSQL", lambda: port in (farm.state / "logs" / "collector.log").read_text())
    view, tally = FarmView(farm), Tally()
    assert view.db.engine.dialect.name == "postgresql"
    held = 0

    def until_a_record_is_held() -> None:
        nonlocal held
        deadline = time.monotonic() + 60
        while view.collect_status().running == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        held = view.collect_status().running
        time.sleep(2.0)  # and a few more retries, the nightly's too

    watch = StartWatch(farm.state / "logs")
    t0 = time.monotonic()
    with Nightly(farm.config_path, "pgre") as run:
        assert watch.next(run, run.run_id, frozenset({"test-model"})) is not None
        t_down = time.monotonic()
        pg_server.restart(while_down=until_a_record_is_held)
        down = time.monotonic() - t_down
        view.add_run(tally, run)
    view.count(tally)
    retries = (farm.state / "logs" / "collector.log").read_text().count("results database unavailable")
    tally.report("postgresql-restart", down_s=f"{down:.1f}", collector_db_retries=retries,
                 records_held=held, wall_s=f"{time.monotonic() - t0:.0f}")
    assert held >= 1 and retries >= 1


def test_forged_results_sent_to_the_collector_mid_run_change_nothing(farm: EmbeddedFarm) -> None:
    """A compromised test-only host, with every file it has (its own registered key, the nightly's
    public key, gearmand access), sends result records to `collect` while a run is in progress:
    garbage; records its real key signs for the run's own jobs (attempts it does not hold, the
    build it may not sign, its own name or the real host's), for jobs the run does not expect,
    for runs that do not exist; a genuine record with its status or attempt edited; unsigned
    records; and a genuine job payload offered as a result. Every one is rejected and logged; the
    run ends as if they were never sent."""
    view, tally, rng = FarmView(farm), Tally(), random.Random(7)
    n = int(SIZE["forged_results"])
    jobs = [JobId("forge", TARGET, s) for s in ("build", "test-unit", "test-model")]
    forged_digests: set[str] = set()
    # The test-only host: enrolled as a lab enrolls one, for test jobs of this target only.
    rogue = Signer.generate()
    Registry(view.db).add("test-only-host", rogue.public_text, ["test"], [TARGET])
    real_host = view.cfg.host_name()

    def record(jid: JobId, **kw: object) -> ResultRecord:
        fields: dict[str, object] = dict(job_id=str(jid), run_id=jid.run_id, target=jid.target, kind=jid.kind,
                                         step=jid.step, name=jid.name, rev="e" * 40, status="passed",
                                         attempt=rng.randint(1, 99), worker="intruder", finished_at=time.time(),
                                         host={"hostname": rng.choice(["test-only-host", real_host])})
        fields.update(kw)
        rec = ResultRecord(**fields)  # type: ignore[arg-type]
        forged_digests.add(rec.digest)
        return rec

    def forgery(i: int, genuine: bytes) -> bytes:
        kind = i % 8
        if kind == 0:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
        if kind == 1:  # the run's own jobs, signed with the test host's real key
            return seal_record(record(rng.choice(jobs)), rogue)
        if kind == 2:  # a genuine record, its status edited after sealing
            return genuine.replace(b'"status":"passed"', b'"status":"failed"')
        if kind == 3:  # a genuine record, its attempt raised after sealing (it would outrank)
            return genuine.replace(b'"attempt":1,', f'"attempt":{rng.randint(2, 99)},'.encode())
        if kind == 4:  # unsigned
            return record(rng.choice(jobs)).model_dump_json().encode()
        if kind == 5:  # a job the run does not expect, the real key
            return seal_record(record(JobId("forge", TARGET, "test-recovery")), rogue)
        if kind == 6:  # a run that does not exist, the real key
            return seal_record(record(JobId(f"ghost{i}", TARGET, "test-unit")), rogue)
        # A genuine payload, as anyone reaching gearmand sees them go by, offered as a result.
        p = make_payload(JobId("forge", TARGET, "build"), source=Source("engine", "e" * 40, "5" * 64, "6" * 64),
                         deadline=time.time() + 600)
        return sign(p, view.cfg.nightly_signer())

    before = view.db.delivery_counts().get("rejected", 0)
    watch = StartWatch(farm.state / "logs")
    with Nightly(farm.config_path, "forge") as run:
        assert watch.next(run, run.run_id, frozenset({"test-model"})) is not None
        # A genuine sealed record, as anyone reaching gearmand sees them go by to `collect`: the
        # build's, sealed with the real host's key as its worker seals it. (Its S3 copy was taken
        # before; a worker now writes one only when the collector does not answer.)
        genuine = seal_record(ResultRecord(job_id=str(jobs[0]), run_id="forge", target=TARGET, kind="build",
                                           step="build", rev="e" * 40, status="passed", attempt=1,
                                           worker=f"{real_host}-build-1", host={"hostname": real_host},
                                           finished_at=time.time()), view.cfg.host_signer())
        assert b'"status":"passed"' in genuine and b'"attempt":1,' in genuine
        data = [forgery(i, genuine) for i in range(n)]
        assert genuine not in data
        with Client(view.cfg.gearman.addresses()) as c:
            c.submit_background_many([BackgroundJob(COLLECT_FUNCTION, d, f"forged-{i}") for i, d in enumerate(data)])
        sent_at = time.time()
        view.add_run(tally, run, frozenset(forged_digests))
    reported = view.db.get_run("forge")
    # All of them were queued while the run was open (before its report closed it).
    sent_while_running = reported is not None and (reported.reported_at or 0) > sent_at

    def rejected() -> int:
        return view.db.delivery_counts().get("rejected", 0) - before

    wait_for(f"{n} rejections", lambda: rejected() >= n, timeout=max(120.0, n / 20))
    time.sleep(2.0)  # and no more than that
    view.count(tally)
    log = "".join(p.read_text(errors="replace") for p in view.logs())
    tally.report("forged-results", sent=n, sent_while_running=int(sent_while_running),
                 rejected_delta=rejected(), rejection_log_lines=log.count("REJECTED result record"))
    assert sent_while_running and rejected() == n
    assert log.count("REJECTED result record") == n
    assert not any(k in log for k in key_secrets(view.cfg))  # no key reaches a log


def test_hung_suite_is_killed_at_its_timeout_and_the_worker_goes_on(chaos_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    edit_catalog(repo, '"--ops", "20000"]\ntimeout = 300', '"--ops", "100000000"]\ntimeout = 3',
                 "a model suite that hangs past its timeout")
    f = EmbeddedFarm(tmp_path / "state", repo)
    f.start(catalog_mod.load_file(repo / "jobs" / "catalog.toml"), [TARGET])
    tally = Tally()
    try:
        view = FarmView(f)
        with Nightly(f.config_path, "hang", "model,unit") as run:
            view.add_run(tally, run)
        view.count(tally)
        statuses = {r.job_id: r.status for r in view.db.jobs("hang")}
        log = (f.state / "runs" / "hang" / "report.json").read_text()
    finally:
        f.stop()
    print("\n" + tally.line("hung-suite"))
    model = f"hang:{TARGET}:test-model"
    # Exit 1 and one job not passed, by design: the suite that hangs ends timed_out.
    assert tally.completed == 0 and tally.lost == 1 and tally.forged_applied == 0 and tally.stale_applied == 0
    assert statuses == {f"hang:{TARGET}:build": "passed", model: "timed_out", f"hang:{TARGET}:test-unit": "passed"}
    assert tally.started[model] == 1 and tally.applied[model] == 1  # killed once, not run again
    assert "killed after the catalog timeout of 3s" in log
    leftover = subprocess.run(["pgrep", "-f", "gfe-suite model.*100000000"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "the suite's process group outlived its timeout"


@pytest.fixture
def lab_netns() -> Iterator[tuple[str, str, str]]:
    """A lab host of our own: a network namespace joined to this one by a veth pair.
    Yields (namespace, host-side address, host-side interface)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 10000}"
    ns, host_if, ns_if = f"gf-lab{tag}", f"gfh{tag}", f"gfn{tag}"
    net = f"10.231.{os.getpid() % 250 + 1}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{net}.1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, f"{net}.1", host_if
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_worker_host_cut_off_mid_job_and_the_job_completes_on_another_host(
        chaos_repo: Path, tmp_path: Path, lab_netns: tuple[str, str, str]) -> None:
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig
    from gearfarm.hosts import process
    from gearfarm.hosts.gearmand import Gearmand
    from gearfarm.hosts.minio_server import MinioServer

    ns, addr, host_if = lab_netns
    procs: list[subprocess.Popen[bytes]] = []
    tally = Tally()
    with Gearmand(tmp_path / "gm", host=addr, queue_db=tmp_path / "gm" / "q.db", job_retries=3) as gm, \
            MinioServer(tmp_path / "minio", host=addr) as minio:
        db_url = f"sqlite:///{tmp_path / 'r.db'}"
        cfg = Config(gearman=GearmanConfig(servers=[f"{addr}:{gm.address[1]}"]), s3=minio.s3_config(),
                     database=DatabaseConfig(url=db_url),
                     farm=FarmConfig(repo=str(chaos_repo), state_dir=str(tmp_path), lease_timeout=8, lost_grace=8,
                                     **keyed(tmp_path, db_url)))  # type: ignore[arg-type]
        cfg_path = tmp_path / "lab.toml"
        config_mod.dump(cfg, cfg_path)
        cli = [sys.executable, "-m", "gearfarm.cli"]

        def spawn(name: str, *args: str, netns: bool = False) -> subprocess.Popen[bytes]:
            argv = (["ip", "netns", "exec", ns] if netns else []) + cli + [*args, "--config", str(cfg_path)]
            p = process.spawn(argv, tmp_path / f"{name}.log", cwd=ROOT)
            procs.append(p)
            return p

        try:
            spawn("collector", "collector")
            spawn("build", "worker", "--role", "build", "--targets", TARGET)
            remote = spawn("remote-test", "worker", "--role", "test", "--targets", TARGET, netns=True)
            deadline = time.monotonic() + 60
            while admin.status(addr, gm.address[1]).get(f"test:{TARGET}") is None:
                assert time.monotonic() < deadline and remote.poll() is None, (tmp_path / "remote-test.log").read_text()
                time.sleep(0.3)
            with Nightly(cfg_path, "cut", "model") as run:
                deadline = time.monotonic() + 120
                while f"COMMAND START job=cut:{TARGET}:test-model" not in (tmp_path / "remote-test.log").read_text():
                    assert time.monotonic() < deadline and run.proc.poll() is None
                    time.sleep(0.2)
                subprocess.run(["ip", "link", "set", host_if, "down"], check=True)  # the host is cut off
                local = spawn("local-test", "worker", "--role", "test", "--targets", TARGET)
                tally.add_run("cut", *run.finish(timeout=300))
            tally.count(ResultsDB(cfg.database.url), sorted(tmp_path.glob("*.log")))
        finally:
            for p in procs:
                process.stop(p, timeout=3)
        row = next(r for r in ResultsDB(cfg.database.url).jobs("cut") if r.step == "test-model")
    tally.report("host-cut-off", completed_by=row.worker, attempt=row.attempt)
    model = f"cut:{TARGET}:test-model"
    # Started on the cut-off host (its result never arrives) and again, as attempt 2, here.
    assert tally.started[model] == 2 and tally.applied[model] == 1
    assert row.worker.endswith(f"-test-{local.pid}") and row.attempt == 2


def test_fuzzed_forged_and_replayed_payloads_are_never_executed(tmp_path: Path, chaos_repo: Path) -> None:
    """A real test worker gets garbage, forged, tampered, replayed, oversized and misdirected
    jobs through gearmand: it rejects every one with a log line, runs none, and stays up."""
    from gearfarm.config import Config, FarmConfig, GearmanConfig
    from gearfarm.hosts import process
    from gearfarm.hosts.gearmand import Gearmand

    rng = random.Random(7)
    n = int(SIZE["fuzz_payloads"])
    db_url = f"sqlite:///{tmp_path / 'r.db'}"
    farm = keyed(tmp_path, db_url)
    key = Signer.load(Path(str(farm["signing_key"])))  # the nightly's
    host = Signer.load(Path(str(farm["host_key"])))  # the worker host's own, which must not make payloads

    def valid(**kw: object) -> Payload:
        now = time.time()
        base: dict[str, object] = dict(kind="test", run_id="fz", project="engine", rev="c" * 40,
                                       source_sha256="5" * 64, catalog_sha256="6" * 64, target=TARGET, name="unit",
                                       artifact_key="artifacts/x", artifact_sha256="d" * 64, submitted_at=now,
                                       deadline=now + 3600)
        base.update(kw)
        return Payload(**base)  # type: ignore[arg-type]

    def bad(i: int) -> bytes:
        kind = i % 7
        if kind == 0:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
        if kind == 1:
            return sign(valid(), rng.choice([host, Signer.generate()]))  # forged: not the nightly's key
        if kind == 2:  # genuine, replayed a month later
            month_ago = time.time() - 30 * 86400
            return sign(valid(submitted_at=month_ago, deadline=month_ago + 3600), key)
        if kind == 3:
            env = json.loads(sign(valid(), key))
            env["body"]["name"] = "recovery"  # tampered after signing
            return json.dumps(env).encode()
        if kind == 4:  # an envelope with a made-up signature, carrying a command
            return json.dumps({"purpose": "payload", "body": {"kind": "test", "cmd": "rm -rf /"}, "kid": "x",
                               "sig": "0" * 64}).encode()
        if kind == 5:  # a genuine result record sent as a job
            rec = ResultRecord(job_id=f"fz:{TARGET}:test-unit", run_id="fz", target=TARGET, kind="test",
                               step="test-unit", name="unit", rev="c" * 40, status="passed")
            return seal_record(rec, host)
        return sign(valid(artifact_key="a" * 400), key) + b" " * (64 * 1024)  # over the size limit

    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]),
                     farm=FarmConfig(repo=str(chaos_repo), state_dir=str(tmp_path), **farm))  # type: ignore[arg-type]
        config_mod.dump(cfg, tmp_path / "f.toml")
        worker = process.spawn([sys.executable, "-m", "gearfarm.cli", "worker", "--role", "test", "--targets",
                                TARGET, "--config", str(tmp_path / "f.toml")], tmp_path / "worker.log", cwd=ROOT)
        try:
            while admin.status(*gm.address).get(f"test:{TARGET}") is None:
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                time.sleep(0.2)
            with Client([gm.address]) as c:
                c.submit_background_many([BackgroundJob(f"test:{TARGET}", bad(i), f"fuzz-{i}") for i in range(n)])
            deadline = time.monotonic() + 300
            while admin.status(*gm.address)[f"test:{TARGET}"].queued:
                assert time.monotonic() < deadline
                time.sleep(0.5)
            alive = worker.poll() is None
        finally:
            process.stop(worker)
    log = (tmp_path / "worker.log").read_text()
    rejected = log.count("REJECTED job")
    executed = len(starts_in([tmp_path / "worker.log"]))
    print(f"\nCHAOS fuzzed-payloads: payloads={n} rejected={rejected} dropped={log.count('DROPPED job')} "
          f"forged_executed={executed} worker_alive={int(alive)}")
    assert alive and executed == 0 and rejected == n
    for reason in ("not one this verifier trusts", "time window", "not JSON", "sealed as a 'result'", "too large",
                   "bad signature"):
        assert reason in log, reason
    assert not any(k in log for k in key_secrets(Config(farm=FarmConfig(**farm))))  # type: ignore[arg-type]
