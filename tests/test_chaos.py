"""The chaos suite (issue: nothing lost, nothing forged). Each case runs real nightlies on a
real farm while something breaks, and prints its counts: trials, runs completed, jobs lost,
duplicate results, forged jobs executed.

Runs in `make test` with a small profile; the full profile (>= 20 worker kills, a 30 s MinIO
outage, 10,000 fuzzed payloads) runs alone with:
    GEARFARM_CHAOS=full .venv/bin/python -m pytest tests/test_chaos.py -s
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import catalog as catalog_mod
from gearfarm import config as config_mod
from gearfarm.farm import EmbeddedFarm
from gearfarm.gearman import admin
from tests.farmkit import ROOT, commit, make_repo

PROFILE = os.environ.get("GEARFARM_CHAOS", "small")
SIZE = {
    "small": {"kill_trials": 2, "kills": 2, "minio_outage": 10.0, "fuzz_worker": 1000},
    "full": {"kill_trials": 5, "kills": 4, "minio_outage": 30.0, "fuzz_worker": 10000},
}[PROFILE]
TARGET = "linux-x86_64"
SUITES = "unit,model"


def report(case: str, trials: int, completed: int, lost: int, duplicates: int, forged: int = 0,
           **extra: object) -> None:
    more = "".join(f" {k}={v}" for k, v in extra.items())
    print(f"\nCHAOS {case}: trials={trials} runs_completed={completed} jobs_lost={lost} "
          f"duplicate_results={duplicates} forged_executed={forged}{more}")


@pytest.fixture(scope="module")
def chaos_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine with a model suite slow enough (seconds) to be killed in the middle."""
    repo = make_repo(tmp_path_factory.mktemp("chaos") / "repo")
    cat = repo / "jobs" / "catalog.toml"
    cat.write_text(cat.read_text().replace('"--ops", "20000"', '"--ops", "40000"'))
    commit(repo, "slower model suite for chaos")
    return repo


@pytest.fixture
def farm(chaos_repo: Path, tmp_path: Path) -> Iterator[EmbeddedFarm]:
    f = EmbeddedFarm(tmp_path / "state", chaos_repo)
    f.start(catalog_mod.load_at_rev(chaos_repo, "HEAD"), [TARGET])
    cfg = config_mod.load(f.config_path)
    cfg.farm.lease_timeout, cfg.farm.lost_grace = 15.0, 8.0
    config_mod.dump(cfg, f.config_path)
    try:
        yield f
    finally:
        f.stop()


def start_nightly(farm: EmbeddedFarm, run_id: str, suites: str = SUITES) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(farm.config_path),
                             "--targets", TARGET, "--suites", suites, "--benchmarks", "none", "--run-id", run_id,
                             "--deadline", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def outcome(farm: EmbeddedFarm, run_id: str, n_expected: int) -> tuple[int, int, dict[str, str]]:
    """(jobs lost, duplicate rows, statuses) of a run from the results database."""
    with sqlite3.connect(farm.state / "results.db") as db:
        rows = db.execute("SELECT job_id, status FROM jobs WHERE run_id = ?", (run_id,)).fetchall()
    statuses = dict(rows)
    lost = n_expected - sum(1 for s in statuses.values() if s == "passed")
    return lost, len(rows) - len(statuses), statuses


def wait_running(farm: EmbeddedFarm, proc: subprocess.Popen[str], timeout: float = 120) -> str | None:
    """The function with a job running right now, once there is one."""
    host, port = farm.cfg.gearman.addresses()[0]  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            for fn, st in admin.status(host, port).items():
                if st.running and fn != "collect":
                    return fn
        except OSError:
            pass
        time.sleep(0.2)
    return None


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


N_JOBS = 1 + len(SUITES.split(","))


def test_worker_killed_mid_job_loses_nothing(farm: EmbeddedFarm) -> None:
    kills = completed = lost = dups = 0
    for trial in range(SIZE["kill_trials"]):
        run_id = f"kill{trial}"
        proc = start_nightly(farm, run_id)
        done = 0
        while done < SIZE["kills"]:
            fn = wait_running(farm, proc)
            if fn is None:
                break
            role = fn.split(":")[0]
            victim = farm.procs[f"{role}-{TARGET}"]
            os.killpg(victim.pid, signal.SIGKILL)  # type: ignore[attr-defined]
            done += 1
            time.sleep(2.5)  # the supervisor restarts it; let it take the job again
        kills += done
        code, out = finish(proc)
        completed += code == 0
        trial_lost, trial_dups, statuses = outcome(farm, run_id, N_JOBS)
        assert trial_lost == 0, (statuses, out[-3000:])
        lost += trial_lost
        dups += trial_dups
    report("worker-kill-9", SIZE["kill_trials"], completed, lost, dups, kills=kills)
    assert kills >= SIZE["kill_trials"] * SIZE["kills"]
    assert completed == SIZE["kill_trials"] and lost == 0 and dups == 0


def test_gearmand_killed_and_restarted_loses_no_job(farm: EmbeddedFarm) -> None:
    proc = start_nightly(farm, "gmd")
    assert wait_running(farm, proc) is not None
    assert farm.gearmand is not None
    farm.gearmand.kill9()
    time.sleep(2)
    farm.gearmand.start()  # same port, same persistent queue
    code, out = finish(proc)
    lost, dups, statuses = outcome(farm, "gmd", N_JOBS)
    report("gearmand-kill-9", 1, int(code == 0), lost, dups)
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_minio_outage_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    proc = start_nightly(farm, "s3out")
    assert wait_running(farm, proc) is not None
    assert farm.minio is not None
    farm.minio.stop()
    time.sleep(SIZE["minio_outage"])
    farm.minio.start()  # same port and data
    code, out = finish(proc)
    lost, dups, statuses = outcome(farm, "s3out", N_JOBS)
    report("minio-outage", 1, int(code == 0), lost, dups, outage_s=SIZE["minio_outage"])
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_collector_stopped_mid_run_loses_no_result(farm: EmbeddedFarm) -> None:
    collector = farm.procs["collector"]
    proc = start_nightly(farm, "coll")
    assert wait_running(farm, proc) is not None
    os.killpg(collector.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
    try:
        # The run still ends: the nightly reconciles the database from the records in S3.
        code, out = finish(proc)
    finally:
        os.killpg(collector.pid, signal.SIGCONT)  # type: ignore[attr-defined]
    lost, dups, statuses = outcome(farm, "coll", N_JOBS)
    report("collector-stopped", 1, int(code == 0), lost, dups)
    assert code == 0 and lost == 0 and dups == 0, (statuses, out[-3000:])


def test_hung_suite_is_killed_at_its_timeout_and_the_worker_goes_on(chaos_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    cat = repo / "jobs" / "catalog.toml"
    text = cat.read_text().replace('"--ops", "20000"]\ntimeout = 300', '"--ops", "100000000"]\ntimeout = 3')
    assert text != cat.read_text()
    cat.write_text(text)
    commit(repo, "a model suite that hangs past its timeout")
    f = EmbeddedFarm(tmp_path / "state", repo)
    f.start(catalog_mod.load_at_rev(repo, "HEAD"), [TARGET])
    try:
        proc = start_nightly(f, "hang", "model,unit")
        code, out = finish(proc)
        _, _, statuses = outcome(f, "hang", 3)
        log = (f.state / "runs" / "hang" / "report.json").read_text()
    finally:
        f.stop()
    assert code == 1, out
    assert statuses == {f"hang:{TARGET}:build": "passed", f"hang:{TARGET}:test-model": "timed_out",
                        f"hang:{TARGET}:test-unit": "passed"}
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
    from gearfarm.s3.minio import MinioServer

    from gearfarm import process
    from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig
    from gearfarm.gearmand import Gearmand

    ns, addr, host_if = lab_netns
    procs: list[subprocess.Popen[bytes]] = []
    with Gearmand(tmp_path / "gm", host=addr, queue_db=tmp_path / "gm" / "q.db", job_retries=3) as gm, \
            MinioServer(tmp_path / "minio", host=addr) as minio:
        cfg = Config(gearman=GearmanConfig(servers=[f"{addr}:{gm.address[1]}"]), s3=minio.s3_config(),
                     database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'r.db'}"),
                     farm=FarmConfig(repo=str(chaos_repo), state_dir=str(tmp_path), secrets=["lab-key"],
                                     lease_timeout=8, lost_grace=8))
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
            nightly = subprocess.Popen(cli + ["nightly", "--config", str(cfg_path), "--targets", TARGET,
                                              "--suites", "model", "--benchmarks", "none", "--run-id", "cut"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
            deadline = time.monotonic() + 120
            while not admin.status(addr, gm.address[1]).get(f"test:{TARGET}", admin.FunctionStatus(0, 0, 0)).running:
                assert time.monotonic() < deadline and nightly.poll() is None
                time.sleep(0.2)
            subprocess.run(["ip", "link", "set", host_if, "down"], check=True)  # the host is cut off
            local = spawn("local-test", "worker", "--role", "test", "--targets", TARGET)
            code, out = finish(nightly, timeout=300)
        finally:
            for p in procs:
                process.stop(p, timeout=3)
        with sqlite3.connect(tmp_path / "r.db") as db:
            rows = db.execute("SELECT job_id, status, worker, attempt FROM jobs WHERE run_id='cut'").fetchall()
    test_row = next(r for r in rows if r[0].endswith("test-model"))
    lost = sum(1 for r in rows if r[1] != "passed") + (2 - len(rows))
    report("host-cut-off", 1, int(code == 0), lost, 0, completed_by=test_row[2], attempt=test_row[3])
    assert code == 0, out[-3000:]
    assert test_row[1] == "passed" and test_row[2].endswith(f"-test-{local.pid}") and test_row[3] == 2


def test_fuzzed_forged_and_replayed_payloads_are_never_executed(tmp_path: Path, chaos_repo: Path) -> None:
    """A real test worker gets garbage, forged, tampered and replayed jobs through gearmand:
    it rejects every one with a log line, runs none, and stays up."""
    import json
    import random

    from gearfarm import process
    from gearfarm.config import Config, FarmConfig, GearmanConfig
    from gearfarm.gearman import BackgroundJob, Client
    from gearfarm.gearmand import Gearmand
    from gearfarm.job import Payload, sign

    rng = random.Random(7)
    key = "the-farm-key"
    n = SIZE["fuzz_worker"]

    def valid(**kw: object) -> Payload:
        base: dict[str, object] = dict(kind="test", run_id="fz", rev="c" * 40, target=TARGET, name="unit",
                                       artifact_key="artifacts/x", artifact_sha256="d" * 64, submitted_at=time.time())
        base.update(kw)
        return Payload(**base)  # type: ignore[arg-type]

    def bad(i: int) -> bytes:
        kind = i % 5
        if kind == 0:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
        if kind == 1:
            return sign(valid(), ["an-attacker-key"])  # forged
        if kind == 2:
            return sign(valid(submitted_at=time.time() - 30 * 86400), [key])  # replayed a month later
        if kind == 3:
            env = json.loads(sign(valid(), [key]))
            env["payload"]["name"] = "recovery"  # tampered after signing
            return json.dumps(env).encode()
        return json.dumps({"payload": {"kind": "test", "cmd": "rm -rf /"}, "kid": "x", "sig": "0" * 64}).encode()

    with Gearmand(tmp_path / "gm") as gm:
        cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{gm.address[1]}"]),
                     farm=FarmConfig(repo=str(chaos_repo), state_dir=str(tmp_path), secrets=[key]))
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
    executed = log.count(f": test:{TARGET} test-")
    report("fuzzed-payloads", n, int(alive), n - rejected, 0, forged=executed, rejected=rejected)
    assert alive and executed == 0 and rejected == n
    assert "bad signature" in log and "time window" in log and "not JSON" in log
    assert key not in log  # the secret never reaches a log
