"""The embedded farm: gearmand (persistent queue), MinIO, the collector, one build-and-test worker
slot per core serving every target this host can build or test, and a perf worker, all on
loopback under one state directory. It writes the same TOML config a lab deployment uses, so
every part runs exactly as in the lab."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gearfarm import config as config_mod
from gearfarm.config import (
    Config,
    DatabaseConfig,
    EmbeddedSettings,
    FarmConfig,
    GearmanConfig,
    ProjectConfig,
    S3Keys,
)
from gearfarm.db.registry import Registry, RegistryError
from gearfarm.db.results import ResultsDB
from gearfarm.formats.catalog import Catalog
from gearfarm.formats.job import KINDS
from gearfarm.formats.seal import Signer
from gearfarm.gearman import admin
from gearfarm.hosts import jobdisk, probe, process
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3.keys import ROLE_WRITES

log = logging.getLogger(__name__)
STATE_FILE = "farm.json"
# Held (flock) while the state file is written or a process it lists is started or stopped: a
# slot the supervisor restarts while `gearfarm farm stop` stops the farm is either in the file
# the stop reads or never started (_locked).
LOCK_FILE = "farm.lock"


# [farm] orphan_wait of the embedded farm's processes: a slot or collector whose farm process is
# gone and whose gearmand has not answered for this long exits (gearfarm.hosts.connection.orphaned).
ORPHAN_WAIT = 30.0


class FarmError(RuntimeError):
    """The embedded farm could not start."""


class EmbeddedFarm:
    def __init__(self, state_dir: Path, repo: Path, job_retries: int = 3,
                 projects: list[ProjectConfig] | None = None, worker_env: dict[str, str] | None = None,
                 slots: int = 0, sandbox: str = "bwrap", settings: EmbeddedSettings | None = None) -> None:
        self.state = state_dir.resolve()
        # How workers confine the jobs' commands ([farm] sandbox).
        self.sandbox = sandbox
        # The default project's repository: only the nightly reads it, never a worker.
        self.repo = repo.resolve()
        self.projects = projects or []
        # Extra environment of the workers and the collector (e.g. a PATH without git).
        self.worker_env = worker_env or {}
        self.job_retries = job_retries
        # What a projects file says of this host's jobs ([farm] of gearfarm.config.EmbeddedSettings).
        self.settings = settings or EmbeddedSettings()
        # Worker slots for builds and tests (0: one per core the process may use).
        self.slots = slots or self.settings.slots or len(os.sched_getaffinity(0))
        self.gearmand: Gearmand | None = None
        self.minio: MinioServer | None = None
        self.procs: dict[str, object] = {}
        self.cfg: Config | None = None
        self.missing: dict[str, dict[str, str]] = {}
        self.functions: set[str] = {"collect"}
        self.args: dict[str, list[str]] = {}
        # What each was last started with, as the state file must record its command line.
        self.argv: dict[str, list[str]] = {}
        self.restarts: dict[str, int] = {}
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def config_path(self) -> Path:
        return self.state / "farm.toml"

    def _previous_secrets(self) -> tuple[str, dict[str, S3Keys]]:
        """Keep MinIO's keys (the root's and each worker role's) across nightlies: the bucket and
        the history persist in the state directory, so must the credentials."""
        roles = {role: S3Keys(access_key=f"gearfarm-{role}", secret_key=secrets.token_hex(20))
                 for role in ROLE_WRITES}
        if self.config_path.exists():
            try:
                old = config_mod.load(self.config_path)
            except config_mod.ConfigError as e:
                # A state directory from before per-host keys ([farm] secrets): its MinIO keys are
                # still good, and a new config is written with keys of the new kind.
                log.warning("%s; writing a new config", e)
                old = None
            if old is not None:
                return old.s3.secret_key, {**roles, **old.s3.roles}
            raw = tomllib.loads(self.config_path.read_text())
            s3 = raw.get("s3", {})
            kept = {r: S3Keys(**k) for r, k in s3.get("roles", {}).items() if r in roles}
            return str(s3.get("secret_key", secrets.token_hex(20))), {**roles, **kept}
        return secrets.token_hex(20), roles

    def _keys(self) -> tuple[Signer, Signer]:
        """The nightly's key and this host's, made once and kept in the state directory (0600):
        the embedded farm is one host that is both the nightly host and a worker host."""
        out = []
        for name in ("nightly.key", "host.key"):
            path = self.state / "keys" / name
            if not path.exists():
                config_mod.write_private(path, Signer.generate().pem())
            out.append(Signer.load(path))
        return out[0], out[1]

    def start(self, cats: Catalog | list[Catalog], targets: list[str] | None = None,
              roles: tuple[str, ...] = ("build", "test"), perf: bool = False) -> Config:
        """Start everything, with workers for ``targets`` (default: every target of the
        projects' catalogs ``cats``) that this host can serve. A start that fails stops what
        it started: no caller is left holding a gearmand, a MinIO or workers it never got."""
        try:
            return self._start(cats if isinstance(cats, list) else [cats], targets, roles, perf)
        except BaseException:
            self.stop()
            raise

    def _start(self, cats: list[Catalog], targets: list[str] | None, roles: tuple[str, ...],
               perf: bool) -> Config:
        self.state.mkdir(parents=True, exist_ok=True)
        # The farm's alone: its config, MinIO's data and the results database are in it, and a
        # job's uid must find nothing there even outside its sandbox.
        self.state.chmod(0o700)
        stop_from_state(self.state)  # a farm left by --keep or a crash would hold the queue
        s3_secret, role_keys = self._previous_secrets()
        nightly_key, host_key = self._keys()
        self.gearmand = Gearmand(self.state / "gearmand", queue_db=self.state / "gearmand" / "queue.db",
                                 job_retries=self.job_retries)
        self.gearmand.start()
        wanted = targets or sorted({t for c in cats for t in c.targets})
        perf_targets = [t for t in wanted if any(c.targets[t].perf for c in cats if t in c.targets)]
        # The probes (compilers, emulators) run while MinIO starts; neither waits for the other.
        # The roles' MinIO users (a second on a new state directory) are made while the workers
        # start: no process touches S3 before its first job, and start() returns, so the first
        # job is submitted, only once they exist.
        background = ThreadPoolExecutor(max_workers=1)
        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                probes = {role: pool.submit(probe.servable, cats, role, perf_targets if role == "perf" else wanted)
                          for role in roles + (("perf",) if perf else ())}
                self.minio = MinioServer(self.state / "minio", secret_key=s3_secret).start()
                users = background.submit(self.minio.add_role_users, role_keys)
                servable = {role: f.result() for role, f in probes.items()}
            self._spawn_all(roles, perf, servable, (nightly_key, host_key), role_keys)
            users.result()
        finally:
            background.shutdown(wait=True)
        self.supervise()
        return self.cfg

    def _spawn_all(self, roles: tuple[str, ...], perf: bool, servable: dict[str, tuple[list[str], dict[str, str]]],
                   signers: tuple[Signer, Signer], role_keys: dict[str, S3Keys]) -> None:
        """Write the farm's config and register this host's key, then start the collector and
        the workers and wait until every worker has registered."""
        assert self.gearmand is not None and self.minio is not None
        host, port = self.gearmand.address
        self.cfg = Config(
            projects=self.projects,
            gearman=GearmanConfig(servers=[f"{host}:{port}"]),
            s3=self.minio.s3_config().model_copy(update={"roles": role_keys}),
            database=DatabaseConfig(url=f"sqlite:///{self.state / 'results.db'}"),
            farm=FarmConfig(repo=str(self.repo), state_dir=str(self.state), no_worker_wait=30.0, slots=self.slots,
                            sandbox=self.sandbox, nightly_keys=[signers[0].public_text],
                            signing_key=str(self.state / "keys" / "nightly.key"),
                            host_key=str(self.state / "keys" / "host.key"), orphan_wait=ORPHAN_WAIT,
                            **self.settings.model_dump(exclude={"slots"})),
        )
        config_mod.dump(self.cfg, self.config_path)
        self.cfg = config_mod.load(self.config_path)
        # The one host serves every role and target it can; its registration says so.
        try:
            Registry(ResultsDB(self.cfg.database.url)).add(self.cfg.host_name(), signers[1].public_text, KINDS, ["*"])
        except RegistryError as e:
            raise FarmError(f"this host's key cannot be registered: {e} (to give the embedded farm a new key, remove "
                            f"{self.state / 'keys' / 'host.key'})") from e
        self._record()
        self.spawn("collector", ["collector"])
        for role, (ok, missing) in servable.items():
            self.missing[role] = missing
            self.functions |= {f"{role}:{t}" for t in ok}
        # Builds and tests share the host's slots, one job each: the cores are busy and not
        # oversubscribed, and each slot takes the longest-path job first (gearfarm.run.priority).
        # Benchmarks have a worker of their own: while one measures it has the host to itself.
        shared = [r for r in roles if servable[r][0]]
        if shared:
            union = sorted({t for r in shared for t in servable[r][0]})
            for i in range(1, self.slots + 1):
                self.spawn(f"slot-{i}", ["worker", "--role", ",".join(shared), "--targets", ",".join(union)])
        if perf and servable["perf"][0]:
            self.spawn("perf", ["worker", "--role", "perf", "--targets", ",".join(servable["perf"][0])])
        self._record()
        self.wait_ready(timeout=120)

    def wait_ready(self, timeout: float) -> None:
        """Wait until every spawned worker has registered, so the run's preflight reports
        only targets that really have no worker; a worker that died is named."""
        assert self.gearmand is not None
        host, port = self.gearmand.address
        deadline = time.monotonic() + timeout
        while True:
            fns = admin.status(host, port)
            missing = {f for f in self.functions if f not in fns or fns[f].workers == 0}
            if not missing:
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]  # type: ignore[attr-defined]
            if dead or time.monotonic() > deadline:
                logs = "; ".join(f"{n}: {process.log_tail(self.state / 'logs' / f'{n}.log', 3)}" for n in dead)
                raise FarmError(f"workers did not register: {', '.join(sorted(missing))}. {logs}")
            time.sleep(0.05)

    def spawn(self, name: str, args: list[str]) -> None:
        self.args[name] = args
        argv = [sys.executable, "-m", "gearfarm.cli", *args, "--config", str(self.config_path)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.worker_env)
        self.procs[name] = process.spawn(argv, self.state / "logs" / f"{name}.log", env=env)
        self.argv[name] = argv

    def supervise(self) -> None:
        """Restart workers and the collector when they die, as systemd's Restart=always does
        on a lab host: a killed worker's job goes back to gearmand, and capacity comes back."""
        def loop() -> None:
            while not self._stopping.wait(1.0):
                self._heal_gearmand()
                for name, proc in list(self.procs.items()):
                    if proc.poll() is not None and not self._stopping.is_set():  # type: ignore[attr-defined]
                        if not self._restart(name, proc.returncode):  # type: ignore[attr-defined]
                            return

        self._supervisor = threading.Thread(target=loop, name="farm-supervisor", daemon=True)
        self._supervisor.start()

    def _heal_gearmand(self) -> None:
        """gearmand's persistent queue failed (its disk was full) and there is room again: it is
        restarted, as it does not recover by itself (Gearmand.heal); workers and the nightly
        reconnect as after any restart of it."""
        if self.gearmand is None or self._stopping.is_set():
            return
        try:
            if self.gearmand.heal():
                log.warning("gearmand's queue failed (its disk was full) and there is room again: gearmand restarted")
                self.restarts["gearmand"] = self.restarts.get("gearmand", 0) + 1
                self._record()
        except Exception:  # the supervisor goes on; the next look tries again
            log.exception("gearmand's queue failed and it cannot be restarted yet")

    def _restart(self, name: str, code: int | None) -> bool:
        """Start ``name`` again and record it, both under the farm's lock; False (and nothing
        started) once the farm is being stopped, by this process or by `gearfarm farm stop` from
        another: a slot restarted after the stop read the state file outlived the farm, logging
        "lost gearmand … reconnecting", its parent gone (issue #76, case 11)."""
        with _locked(self.state):
            if self._stopping.is_set() or _stopping(self.state):
                log.warning("%s exited (%s); not restarted: the farm is being stopped", name, code)
                return False
            log.warning("%s exited (%s); restarting it", name, code)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self.spawn(name, self.args[name])
            self._write_state()
        return True

    def _record(self) -> None:
        with _locked(self.state):
            self._write_state()

    def _write_state(self) -> None:
        """Write farm.json (under the lock, atomically: a stop never reads half of it): every
        pid, and what proves later that it is still the process we started (start time, command
        line, boot, process group), so that a stop from the state file never kills a process
        that merely got a recorded pid."""
        pids = {n: p.pid for n, p in self.procs.items()}  # type: ignore[attr-defined]
        if self.minio and self.minio.proc:
            pids["minio"] = self.minio.proc.pid
        if self.gearmand and self.gearmand.pid:
            pids["gearmand"] = self.gearmand.pid
        procs = {n: ident for n, pid in pids.items()
                 if (ident := process.identity(pid, self.argv.get(n))) is not None}
        _write_json(self.state / STATE_FILE, {"pids": pids, "procs": procs, "config": str(self.config_path)})

    def detach(self) -> None:
        """Leave the farm running without this process (`nightly --keep`): its supervisor ends
        first and the state file says every process it started, so `gearfarm farm stop` finds
        them all; what dies from now on is not restarted."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        self._record()

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        # Workers and the collector first (a job's result still reaches gearmand and MinIO),
        # all at once: each exits as soon as its loop wakes (Worker.wake on SIGTERM).
        process.stop_all(list(self.procs.values()), timeout=10)  # type: ignore[arg-type]
        self.procs.clear()
        # A worker killed on the way (past its grace) leaves its job disk mounted: not the host's.
        jobdisk.sweep(self.state / "work")
        if self.minio:
            self.minio.stop()
        if self.gearmand:
            self.gearmand.stop()
        (self.state / STATE_FILE).unlink(missing_ok=True)


class Stopped(list[str]):
    """The names stop_from_state() stopped; ``skipped`` names entries whose pid is alive but
    not provably the process the farm started, which were left alone."""

    def __init__(self, stopped: list[str], skipped: list[str]) -> None:
        super().__init__(stopped)
        self.skipped = skipped


def stop_from_state(state_dir: Path, timeout: float = 10.0) -> Stopped:
    """Stop a farm left running (by --keep or a crash): every process in its state file that
    is provably the one the farm started -- same pid, start time, boot and command line as
    recorded. SIGTERM to all of them at once, SIGKILL to what is left after ``timeout``."""
    path = state_dir / STATE_FILE
    if not path.exists():
        return Stopped([], [])
    # Marked stopping under the lock first: a supervisor still running (the farm's process is
    # alive) restarts nothing after this, and what it restarted before is in what is read here.
    with _locked(state_dir):
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            return Stopped([], [])
        _write_json(path, {**state, "stopping": True})
    pids: dict[str, int] = state.get("pids", {})
    records: dict[str, dict[str, Any]] = state.get("procs", {})
    ours: dict[str, dict[str, Any]] = {}
    skipped = []
    for name, pid in pids.items():
        rec = records.get(name)
        if rec is not None and rec.get("pid") == pid and process.is_same(rec):
            ours[name] = rec
        elif process.start_time(pid) is not None:
            # A recycled pid (or a state file from before identities were recorded): some
            # other process now, or at least nothing proves otherwise.
            skipped.append(name)
            log.warning("not stopping %s: pid %d is alive but not provably the process the farm started "
                        "(no record of it in %s, or its start time or command line differ)", name, pid, path)
    # SIGKILL is only waited for briefly: it cannot be refused, and what still lingers then
    # (uninterruptible sleep) would not go sooner for our waiting.
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        for rec in ours.values():
            if process.is_same(rec):
                _signal_process(rec, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(rec) for rec in ours.values()):
            time.sleep(0.05)
    jobdisk.sweep(state_dir / "work")  # the job disks of workers that did not close theirs
    path.unlink(missing_ok=True)
    return Stopped(list(ours), skipped)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """The farm's lock (LOCK_FILE), held across processes for the ``with``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stopping(state_dir: Path) -> bool:
    """Whether a stop from the state file has begun (or ended: the file is gone)."""
    try:
        return bool(json.loads((state_dir / STATE_FILE).read_text()).get("stopping"))
    except FileNotFoundError:
        return True
    except ValueError:
        return False


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _signal_process(rec: dict[str, Any], sig: int) -> None:
    pid = int(rec["pid"])
    st = process.proc_stat(pid)
    # The whole group only while the pid still leads the group it led when recorded: every farm
    # process starts its own session, and its children (MinIO's, a worker's) are in it.
    if st is not None and rec.get("pgid") == pid and st.pgid == pid:
        process.kill_group(pid, sig)
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(rec: dict[str, Any]) -> bool:
    """Whether the recorded process still runs (a zombie does not: it is dead, unreaped)."""
    return process.start_time(int(rec["pid"])) == rec["start"]
