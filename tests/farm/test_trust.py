"""What a new user tried against the embedded farm, now refused or handled (issue: one owner of
a run's state), on real gearmand, MinIO and SMTP, with libgearman's own `gearman` CLI as the
outsider: a forged result record changes nothing and is counted; a genuine result arriving
after the report is recorded as late and leaves the mail as it was; a job expired in gearmand's
persistent queue does not run on the next start of the farm; a build worker that cannot read
the revision ends its target's dependents within seconds; `kill -9` of a worker mid-suite
leaves no process of that suite alive."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import MailConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import JobId
from gearfarm.formats.lease import Lease, seal_lease
from gearfarm.formats.result import ResultRecord, peek_record, seal_record
from gearfarm.gearman import Client, admin
from gearfarm.hosts import process
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import ROOT, commit, edit_catalog, keyed, make_repo, wait_for
from tests.report.test_mail import SMTPSink, sink  # noqa: F401 - fixture

T = "linux-x86_64"


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gearfarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def nightly(farm: EmbeddedFarm, run_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("nightly", "--config", str(farm.config_path), "--targets", T, "--benchmarks", "none",
               "--run-id", run_id, *args)


def worker_logs(farm: EmbeddedFarm) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((farm.state / "logs").glob("*.log")))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("trust") / "repo")


@pytest.fixture
def farm(repo: Path, tmp_path: Path) -> Iterator[EmbeddedFarm]:
    f = EmbeddedFarm(tmp_path / "state", repo)
    f.start(catalog_mod.load_file(repo / "jobs" / "catalog.toml"), [T])
    try:
        yield f
    finally:
        f.stop()


def test_forged_records_are_rejected_and_late_results_leave_the_mail_as_sent(
        farm: EmbeddedFarm, sink: SMTPSink) -> None:  # noqa: F811
    cfg = config_mod.load(farm.config_path)
    cfg.mail = MailConfig(host="127.0.0.1", port=sink.port, sender="farm@example.org", recipients=["a@example.org"])
    config_mod.dump(cfg, farm.config_path)
    p = nightly(farm, "t1", "--suites", "unit")
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(sink.messages) == 1
    eml = (farm.state / "runs" / "t1" / "report.eml").read_bytes()
    db = ResultsDB(cfg.database.url)
    unit = JobId("t1", T, "test-unit")

    def unit_row() -> ResultRecord:
        return next(r for r in db.jobs("t1") if r.job_id == str(unit))

    assert unit_row().status == "passed"

    # An outsider who can reach gearmand: an edited copy of a record as the worker sealed it (seen
    # on its way to `collect`), and an unsigned one.
    sealed = seal_record(unit_row(), cfg.host_signer())
    edited = sealed.replace(b'"status":"passed"', b'"status":"failed"')
    assert edited != sealed
    unsigned = peek_record(sealed).model_copy(update={"status": "failed", "attempt": 9})
    host, port = cfg.gearman.addresses()[0]
    for i, data in enumerate((edited, unsigned.model_dump_json().encode())):
        out = subprocess.run(["gearman", "-h", host, "-p", str(port), "-b", "-f", "collect", "-u", f"forged-{i}"],
                             input=data, capture_output=True, timeout=30)
        assert out.returncode == 0, out.stderr
    wait_for("the collector to reject both", lambda: db.delivery_counts().get("rejected", 0) == 2)
    assert unit_row().status == "passed"
    status = cli("status", "--config", str(farm.config_path))
    assert "result records rejected: 2 in the last 24 h" in status.stdout, status.stdout
    log = worker_logs(farm)
    assert log.count("REJECTED result record") == 2 and "bad signature" in log
    assert "PRIVATE KEY" not in log  # no key reaches a log

    # A genuine record that arrives after the report: late, shown so, the mail untouched.
    late = unit_row().model_copy(update={"status": "failed", "worker": "slow-host",
                                         "finished_at": time.time()})
    with Client(cfg.gearman.addresses()) as c:
        c.submit_background("collect", seal_record(late, cfg.host_signer()), unique="late-1")
    wait_for("the late result", lambda: db.late_results("t1"))
    assert unit_row().status == "passed"
    shown = cli("report", "t1", "--config", str(farm.config_path))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"\* LATE linux-x86_64 / test-unit: failed \(attempt 1, arrived .*slow-host\)", shown.stdout)
    assert (farm.state / "runs" / "t1" / "report.eml").read_bytes() == eml
    assert len(sink.messages) == 1  # nothing was mailed again


@pytest.mark.parametrize("ended,args,status,why", [
    ("expired", ("--deadline", "25", "--no-worker-wait", "600"), "infra", "its run's deadline passed"),
    ("no worker", ("--no-worker-wait", "3"), "no_worker", "run x1 was reported and closed"),
])
def test_a_job_left_in_the_queue_does_not_run_on_the_next_start(
        repo: Path, tmp_path: Path, ended: str, args: tuple[str, ...], status: str, why: str) -> None:
    cat = catalog_mod.load_file(repo / "jobs" / "catalog.toml")
    first = EmbeddedFarm(tmp_path / "state", repo)
    first.start(cat, [T], roles=("build",))  # no test worker: the test job stays queued
    try:
        p = nightly(first, "x1", "--suites", "unit", *args)
    finally:
        first.stop()
    assert p.returncode == 1, p.stdout + p.stderr
    db = ResultsDB(f"sqlite:///{tmp_path / 'state' / 'results.db'}")
    unit = f"x1:{T}:test-unit"
    before = {r.job_id: (r.status, r.message) for r in db.jobs("x1")}
    assert before[unit][0] == status, (ended, before)

    restarted = time.time()
    again = EmbeddedFarm(tmp_path / "state", repo)  # same state: same persistent queue
    again.start(cat, [T])
    try:
        assert again.gearmand is not None
        dropped = wait_for("the stale job to be dropped", lambda: "DROPPED" in worker_logs(again), timeout=60)
        assert dropped
        wait_for("the queue to empty", lambda: admin.status(*again.gearmand.address)[f"test:{T}"].queued == 0)
        time.sleep(2)
        log = worker_logs(again)
    finally:
        again.stop()
    assert re.search(rf"DROPPED job .* \({re.escape(unit)}\): {why}", log), log[-3000:]
    assert f"COMMAND START job={unit}" not in log
    assert {r.job_id: (r.status, r.message) for r in db.jobs("x1")} == before
    assert not [d for d in db.deliveries("x1") if d.at >= restarted]  # nothing was even offered


def test_workers_whose_clone_lacks_tonights_commit_build_it_from_the_snapshot(repo: Path, tmp_path: Path) -> None:
    """The issue's own report: a lab config whose workers' clone lacked the newest commit
    ended the build `infra`. The workers' clone is now irrelevant: the source comes from S3."""
    lab = tmp_path / "worker-clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(lab)], check=True)
    newer = tmp_path / "newer"
    shutil.copytree(repo, newer)
    (newer / "engine" / "NEWS").write_text("a commit the workers' clone does not have\n")
    rev = commit(newer, "tonight's commit")
    f = EmbeddedFarm(tmp_path / "state", lab)
    f.start(catalog_mod.load_file(lab / "jobs" / "catalog.toml"), [T])
    try:
        p = cli("nightly", "--config", str(f.config_path), "--repo", str(newer), "--rev", rev, "--targets", T,
                "--suites", "unit", "--benchmarks", "none", "--run-id", "newrev")
    finally:
        f.stop()
    assert p.returncode == 0, p.stdout + p.stderr
    db = ResultsDB(f"sqlite:///{tmp_path / 'state' / 'results.db'}")
    recs = {r.step: r for r in db.jobs("newrev")}
    assert recs["build"].status == recs["test-unit"].status == "passed" and recs["build"].rev == rev


def test_a_tampered_source_snapshot_is_refused_and_ends_the_dependents_at_once(repo: Path, tmp_path: Path) -> None:
    """Someone with write access to S3 replaced tonight's snapshot: the build worker checks it
    against the sha256 in the signed payload, runs nothing, and its dependents end with it."""
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    f = EmbeddedFarm(tmp_path / "state", repo)
    cfg = f.start(catalog_mod.load_file(repo / "jobs" / "catalog.toml"), [T])
    try:
        # The snapshot the nightly will find (and so not upload again) is not what it says.
        store = ArtifactStore(cfg.s3)
        store.put_bytes(keys.source(rev), b"not the engine's tree")
        store.put_bytes(keys.source_manifest(rev), json.dumps({"rev": rev, "sha256": "ab" * 32, "size": 21}).encode())
        t0 = time.monotonic()
        p = cli("nightly", "--config", str(f.config_path), "--rev", rev, "--targets", T,
                "--suites", "unit,model,recovery", "--benchmarks", "none", "--run-id", "tampered")
        wall = time.monotonic() - t0
        log = "".join(p.read_text() for p in (tmp_path / "state" / "logs").glob("slot-*.log"))
    finally:
        f.stop()
    assert p.returncode == 1, p.stdout + p.stderr
    db = ResultsDB(f"sqlite:///{tmp_path / 'state' / 'results.db'}")
    recs = {r.step: r for r in db.jobs("tampered")}
    assert recs["build"].status == "infra" and "corrupt or tampered" in recs["build"].message, recs["build"]
    assert "COMMAND START job=tampered" not in log
    deps = [recs[s] for s in ("test-unit", "test-model", "test-recovery")]
    assert all(d.status == "skipped" and "build ended infra" in d.message for d in deps)
    assert max(d.finished_at or 0 for d in deps) - (recs["build"].finished_at or 0) <= 10
    assert wall < 60, f"the run took {wall:.0f}s"


def _suite_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_kill_9_of_a_worker_mid_suite_leaves_no_process_of_that_suite(repo: Path, tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    shutil.copytree(repo, slow)
    edit_catalog(slow, '"--ops", "20000"', '"--ops", "4000017"', "a model suite that runs for a while")
    f = EmbeddedFarm(tmp_path / "state", slow)
    f.start(catalog_mod.load_file(slow / "jobs" / "catalog.toml"), [T])
    marker = "gfe-suite.*4000017"
    try:
        run = subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(f.config_path),
                                "--targets", T, "--suites", "model", "--benchmarks", "none", "--run-id", "k9",
                                "--deadline", "40"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=ROOT)
        wait_for("the suite to start", lambda: _suite_pids(marker), timeout=120)
        work = f.state / "work"

        def busy(pid: int) -> list[Path]:
            return [d for d in work.iterdir() if d.name.startswith(f"{pid}-") and any(d.iterdir())]

        def ancestors(pid: int) -> set[int]:
            seen = set()
            while pid > 1 and (st := process.proc_stat(pid)) is not None:
                seen.add(pid)
                pid = st.ppid
            return seen

        # The slot running the suite: the suite's ancestor (the other slot may hold its last
        # job's dir still, left for later).
        running = set().union(*(ancestors(pid) for pid in _suite_pids(marker)))
        worker = next(p for n, p in f.procs.items() if n.startswith("slot-") and p.pid in running)  # type: ignore[attr-defined]
        mine = busy(worker.pid)
        assert mine and any(mine[0].iterdir()), "the job's directory should exist while it runs"
        before = set(_suite_pids(marker))
        os.kill(worker.pid, signal.SIGKILL)  # the worker only: its job must follow it
        # Its processes, that is: the other slot may already run the job again (a new attempt).
        wait_for("the suite to die with its worker", lambda: not before & set(_suite_pids(marker)), timeout=10)
        # The supervisor restarts the worker, whose first act is to sweep the dead one's dirs.
        wait_for("the dead worker's job dir to be swept", lambda: not mine[0].exists(), timeout=60)
        run.kill()
        run.wait()
    finally:
        f.stop()
        for pid in _suite_pids(marker):
            os.kill(pid, signal.SIGKILL)



def test_an_older_attempt_delivered_after_a_newer_one_changes_nothing(tmp_path: Path) -> None:
    """Through real gearmand and a real collector process: attempt 2's record, then attempt
    1's (a cut-off host reporting late); the row keeps attempt 2 whatever the order."""
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig
    from gearfarm.hosts.gearmand import Gearmand

    with Gearmand(tmp_path / "gm") as gm:
        db_url = f"sqlite:///{tmp_path / 'r.db'}"
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]),
                     database=DatabaseConfig(url=db_url),
                     farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path), **keyed(tmp_path, db_url)))  # type: ignore[arg-type]
        config_mod.dump(cfg, tmp_path / "f.toml")
        db = ResultsDB(cfg.database.url)
        unit = JobId("order", T, "test-unit")
        db.create_run("order", "a" * 40, [T], [str(unit)])
        db.set_live("order", {str(unit): ("queued", 2)})
        collector = process.spawn([sys.executable, "-m", "gearfarm.cli", "collector", "--config",
                                   str(tmp_path / "f.toml")], tmp_path / "collector.log", cwd=ROOT)

        def record(attempt: int, status: str) -> bytes:
            r = ResultRecord(job_id=str(unit), run_id="order", target=T, kind="test", step="test-unit", name="unit",
                             rev="a" * 40, status=status, attempt=attempt, worker=f"host{attempt}",  # type: ignore[arg-type]
                             started_at=100.0, finished_at=200.0 - attempt,  # the older one finished later
                             host={"hostname": cfg.host_name()})
            return seal_record(r, cfg.host_signer())

        try:
            with Client([gm.address]) as c:
                for attempt in (1, 2):  # each attempt claimed by the host that runs it (gearfarm.formats.lease)
                    claim = Lease(job_id=str(unit), attempt=attempt, host=cfg.host_name(), worker=f"w{attempt}",
                                  beat=0)
                    assert c.submit("collect", seal_lease(claim, cfg.host_signer()), unique=f"c{attempt}",
                                    timeout=60) == b"granted "
                c.submit_background("collect", record(2, "passed"), unique="a2")
                wait_for("attempt 2", lambda: len(db.deliveries("order")) == 1)
                c.submit_background("collect", record(1, "failed"), unique="a1")
                wait_for("attempt 1", lambda: len(db.deliveries("order")) == 2)
        finally:
            process.stop(collector)
    (row,) = db.jobs("order")
    assert (row.status, row.attempt, row.worker) == ("passed", 2, "host2")
    assert [(d.attempt, d.outcome) for d in db.deliveries("order")] == [(2, "applied"), (1, "superseded")]


def test_the_report_is_written_and_mailed_with_s3_and_the_database_down(
        tmp_path: Path, sink: SMTPSink, pg_server, pg_url: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from gearfarm.config import Config, DatabaseConfig, FarmConfig
    from gearfarm.hosts.minio_server import MinioServer
    from gearfarm.report import publisher
    from gearfarm.run.ledger import Ledger

    db = ResultsDB(pg_url)
    jobs = [JobId("down", T, s) for s in ("build", "test-unit")]
    db.create_run("down", "a" * 40, [T], [str(j) for j in jobs])
    for j in jobs:
        Ledger(db).apply(ResultRecord(job_id=str(j), run_id="down", target=T, kind=j.kind, step=j.step, name=j.name,
                                      rev="a" * 40, status="passed", started_at=1.0, finished_at=2.0), "collect")
    run, records = db.get_run("down"), db.jobs("down")
    minio = MinioServer(tmp_path / "minio").start()
    cfg = Config(s3=minio.s3_config(), database=DatabaseConfig(url=pg_url),
                 mail=MailConfig(host="127.0.0.1", port=sink.port, recipients=["a@example.org"]),
                 farm=FarmConfig(repo=str(ROOT), state_dir=str(tmp_path / "state")))
    store = ArtifactStore(cfg.s3, retry_for=2)
    minio.stop()
    got: dict[str, publisher.Publication] = {}
    pg_server.restart(while_down=lambda: got.update(
        pub=publisher.publish(cfg, db, store, [run], {run.run_id: records})))
    pub = got["pub"]
    out = tmp_path / "state" / "runs" / "down"
    assert (out / "report.html").exists() and (out / "junit.xml").exists()
    assert len(sink.messages) == 1 and pub.delivery is not None and pub.delivery.sent
    assert any("not in S3" in p for p in pub.problems)
    assert any("results database unavailable" in p for p in pub.problems)
    assert "FARM PROBLEMS WHILE REPORTING" in (out / "report.txt").read_text()
