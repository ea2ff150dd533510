"""Farm configuration: one TOML file (flag --config or $GEARFARM_CONFIG) naming the gearmand
servers, the S3 endpoint, the results database, mail, and the signing keys.

The embedded default writes such a file into its state directory, so the lab deployment and
the embedded farm run the very same code.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gearfarm.formats.seal import Lookup, SealError, Signer, keyring, parse_public
from gearfarm.formats.words import parse_size
from gearfarm.s3.settings import S3Config, S3Keys  # noqa: F401  (the [s3] section; S3Keys for callers)

ENV_VAR = "GEARFARM_CONFIG"
DEFAULT_CATALOG = "jobs/catalog.toml"


class ConfigError(ValueError):
    """The configuration file is missing or invalid."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GearmanConfig(_Section):
    servers: list[str] = Field(default_factory=lambda: ["127.0.0.1:4730"])
    # CA file to verify the job server's TLS certificate (stunnel in front of gearmand).
    tls_ca: str | None = None
    tls_server_name: str | None = None
    # This host's client certificate and key from the farm CA (gearfarm tls client):
    # a lab's stunnel admits no one without them (docs/tls.md).
    tls_cert: str | None = None
    tls_key: str | None = None

    @model_validator(mode="after")
    def _pair(self) -> GearmanConfig:
        if (self.tls_key is None) != (self.tls_cert is None):
            raise ValueError("set tls_cert and tls_key together (the host's client certificate and its key)")
        if self.tls_key is not None and not self.tls_ca:
            raise ValueError("a client certificate needs tls_ca too (the farm CA that verifies the server)")
        return self

    @field_validator("servers")
    @classmethod
    def _hostports(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one gearmand server is needed, as 'host:port'")
        for s in v:
            host, sep, port = s.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"gearmand server {s!r} is not 'host:port'")
        return v

    def addresses(self) -> list[tuple[str, int]]:
        out = []
        for s in self.servers:
            host, _, port = s.rpartition(":")
            out.append((host, int(port)))
        return out


class DatabaseConfig(_Section):
    url: str = "sqlite:///gearfarm.db"


class MailConfig(_Section):
    host: str | None = None
    port: int = 25
    security: str = "none"  # none | starttls | tls
    username: str | None = None
    password: str | None = None
    sender: str = "gearfarm@localhost"
    recipients: list[str] = Field(default_factory=list)
    retries: int = 3


class WebConfig(_Section):
    # The dashboard as its readers reach it ("https://farm.example.com/"): reports and mail link
    # to it. None: they link to the copies of the logs on disk beside each report.
    url: str | None = None
    # Where `gearfarm web` listens (host:port). 8631: no common CI server's default (Jenkins and
    # GitLab take 8080, Buildbot 8010, TeamCity 8111, GoCD 8153), so both run on one host.
    listen: str = "127.0.0.1:8631"
    # Signs the dashboard's session cookies and CSRF tokens; default: a key of the dashboard's own,
    # kept in the state directory (web-secret), never derived from keys the worker hosts hold.
    secret: str | None = None
    # Builds (archives and provenance) download without an account; by default only a logged-in
    # user (or a bearer token) gets them: a project's binaries are not always for everyone.
    public_artifacts: bool = False

    @field_validator("url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("the dashboard's url must start with http:// or https://")
        return v.rstrip("/") + "/" if v else v

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"web listen address {v!r} is not 'host:port'")
        return v


PROJECT_RE = r"^[a-z][a-z0-9_-]{0,31}$"
DEFAULT_PROJECT = "engine"


class ProjectConfig(_Section):
    """One project the farm builds: its repository (a path, or any URL git can fetch: the
    nightly fetches it; workers never see it), what to build, and where its catalog is."""

    name: str = Field(pattern=PROJECT_RE)
    repo: str
    # A branch, tag or commit; resolved by the nightly to one commit per run.
    branch: str = "HEAD"
    # A path inside the repository at the run's revision ...
    catalog: str | None = None
    # ... or a file beside this config, for repositories that cannot carry one.
    catalog_file: str | None = None
    # The catalog's targets the farm builds (default: all): a lab with no worker for some of
    # them names the others, so its nightly does not wait for workers that will never come.
    targets: list[str] | None = None

    @field_validator("catalog_file")
    @classmethod
    def _one_catalog(cls, v: str | None, info: Any) -> str | None:
        if v is not None and info.data.get("catalog") is not None:
            raise ValueError("set catalog (a path in the repository) or catalog_file (a file beside the config), "
                             "not both")
        return v

    @field_validator("targets")
    @classmethod
    def _some_targets(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("targets lists no target: name some, or leave targets out to build every target "
                             "of the catalog")
        for t in v:
            if v.count(t) > 1:
                raise ValueError(f"target {t!r} is listed twice")
        return v

    @property
    def catalog_path(self) -> str:
        return self.catalog or DEFAULT_CATALOG

    def local_repo(self, base: Path) -> Path | None:
        """The directory ``repo`` names, relative to ``base``, when it is one: the one rule for
        telling a clone used in place from a URL (anything with ://, git@host:..., or a path that
        is no directory here)."""
        if "://" in self.repo or self.repo.startswith("git@"):
            return None
        local = (base / os.path.expanduser(self.repo)).resolve()
        return local if local.is_dir() else None


def _unique_projects(v: list[ProjectConfig]) -> list[ProjectConfig]:
    names = [p.name for p in v]
    for n in names:
        if names.count(n) > 1:
            raise ValueError(f"project {n!r} is configured twice: project names must be unique")
    return v


class FarmConfig(_Section):
    @model_validator(mode="before")
    @classmethod
    def _no_shared_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and "secrets" in data:
            raise ValueError("secrets: the farm's shared HMAC keys are gone; the nightly signs with its own Ed25519 "
                             "key and each worker host with its own (set nightly_keys, signing_key or host_key: "
                             "docs/security.md, 'Keys')")
        return data

    @field_validator("nightly_keys")
    @classmethod
    def _public_keys(cls, v: list[str]) -> list[str]:
        for i, text in enumerate(v):
            try:
                parse_public(text)
            except SealError as e:
                raise ValueError(f"nightly_keys[{i}]: {e}") from None
        return v

    # The default project's repository (the project "engine" when [[projects]] is absent). Only
    # the nightly reads it: workers get the source and the catalog through S3.
    repo: str = "."
    state_dir: str = "state"
    # The public keys of the nightly (ed25519:<base64>), which sign every payload: a worker runs
    # a job only if one of them signed it. More than one during a rotation (docs/security.md).
    nightly_keys: list[str] = Field(default_factory=list)
    # The nightly host only: the private key (a PEM file, 0600) that signs payloads and markers.
    signing_key: str | None = None
    # A worker host only: its own private key, which signs its result records; its public half
    # is in the farm's registry with the roles and targets the host serves (gearfarm keys add).
    host_key: str | None = None
    # The name the host is registered under (default: its hostname); its records carry it.
    host_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    # Seconds a job may wait with no worker registered for its function before it is
    # recorded as "no worker".
    no_worker_wait: float = 120.0
    # A run ends by this many seconds after submission, every job terminal.
    run_deadline: float = 3 * 3600.0
    # The longest timeout a catalog may give a step (a build, a suite, a benchmark), in seconds:
    # a catalog with a longer one is refused, naming the key (the nightly fails that project's
    # night; a worker, whose own config may be stricter, refuses the job). A catalog may lower
    # the farm's limits, never raise them.
    max_timeout: float = Field(default=6 * 3600.0, gt=0)
    # A payload older than this is refused as a replay.
    payload_max_age: float = 24 * 3600.0
    # A running job whose lease has had no signed heartbeat for this long (its worker died or was
    # cut off, or whatever holds it is not a registered host: gearfarm.formats.lease) is submitted again.
    # Workers beat every 10 s, or a third of this if shorter: give every host the same value.
    lease_timeout: float = 60.0
    # A job gearmand no longer knows, whose result has not arrived after this long, was
    # dropped (--job-retries exhausted) and is submitted again.
    lost_grace: float = 20.0
    # Resubmissions a run may spend; past it, lost jobs are recorded as infrastructure failures.
    resubmit_budget: int = 20
    # The most of its commands' output a job's log keeps, in bytes or as a size ("64 MiB", "1 GiB"):
    # past it the log keeps the output's head and its last quarter, with a note of how many bytes
    # were dropped between (gearfarm.hosts.process.CappedLog). A worker holds that quarter in memory
    # while a command runs.
    log_limit: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    # The most of a suite's results file (JUnit, TAP) the worker reads and stores, a size as
    # log_limit: past it the rest is dropped with a note in the job's log, its record's message and
    # the stored file (gearfarm.step.runner). The worker reads it streaming: its memory does not grow
    # with this.
    result_limit: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)

    @field_validator("log_limit", "result_limit", "job_memory_max", "job_tmp_size", "job_disk", "min_free",
                     mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_size(v) if isinstance(v, str) else v

    # What each job command may use at most, bounded by the host's kernel in a cgroup of its own
    # (gearfarm/hosts/cgroup.py): its processes (threads count), its memory with swap, in bytes
    # or as a size ("4 GiB"), and its CPU weight against the host's other jobs (cgroup v2's
    # cpu.weight: 100 an equal share). A catalog may lower them, never raise them ([limits]: a
    # value above these is a catalog error). A job that reaches one fails, naming it. 0: none.
    job_pids_max: int = Field(default=4096, ge=0)
    job_memory_max: int = Field(default=8 * 1024**3, ge=0)
    job_cpu_weight: int = Field(default=100, ge=1, le=10000)
    # "if-available": a worker whose host does not let it make job cgroups (not root, no cgroup
    # delegated to it) says so in its log and runs jobs without those limits; "required": it
    # refuses to start (docs/security.md).
    job_limits: str = Field(default="if-available", pattern=r"^(if-available|required)$")
    # How many uids from job_uid on a host's slots take, one each, never two slots of any farm on
    # the host at once (a lock per uid in /run/gearfarm/job-uids: gearfarm/step/sandbox.py).
    job_uids: int = Field(default=256, ge=1, le=65536)

    def job_limits_max(self) -> dict[str, int | None]:
        """The farm's bounds by the catalog's [limits] key they bound (None: unbounded)."""
        return {"processes": self.job_pids_max or None, "memory": self.job_memory_max or None,
                "cpu_weight": self.job_cpu_weight}

    # The most a job may keep in its sandbox's /tmp (a tmpfs: the host's memory), bytes or a size.
    job_tmp_size: int = Field(default=1024**3, ge=1024 * 1024)
    # The filesystem of a job's own directories (its $HOME, its tree and scratch): a
    # root worker puts them on a loop-mounted ext4 image of this size per slot, so a job cannot
    # fill the disk the farm lives on (gearfarm/hosts/jobdisk.py); bytes or a size.
    job_disk: int = Field(default=8 * 1024**3, ge=16 * 1024 * 1024)
    # Free space the state directory's filesystem keeps (bytes or a size): below it a worker takes
    # no job, and ends the running job that wrote the most, as that job's failure.
    min_free: int = Field(default=1024**3, ge=0)
    # Build and test jobs the embedded farm's host runs at once (its worker slots); 0: one per
    # core. More oversubscribes the cores: measured on 2 cores, ten workers made every job slower
    # and the nightly no shorter.
    slots: int = Field(default=0, ge=0, le=256)
    # Seconds a benchmark lets its host's builds and tests go first (it takes the host when
    # none runs); past it, new ones wait for the benchmark (gearfarm/hosts/hostlock.py).
    perf_patience: float = Field(default=600.0, ge=0)
    # Nights a target's reference build stays pinned before the last good build replaces it (the
    # perf jobs' third side: docs/performance.md, "The reference build"); 0: no reference.
    reference_nights: int = Field(default=28, ge=0, le=366)
    # How workers confine a job's commands (gearfarm/step/sandbox.py): "bwrap" (bubblewrap; the
    # worker refuses to start if it cannot) or "none" (unconfined, on purpose).
    sandbox: str = Field(default="bwrap", pattern=r"^(bwrap|none)$")
    # The uid (and gid) a root worker runs jobs' commands as, outside their sandbox: one no account
    # uses, so a job that got out of its mount view still owns nothing of the host's. 0: the
    # worker's own uid (what a worker that is not root always does; docs/security.md).
    job_uid: int = Field(default=2_000_000_000, ge=0, le=4_294_967_294)
    # Read-only trees jobs may see besides /usr and /etc, for toolchains installed elsewhere.
    sandbox_readonly: list[str] = Field(default_factory=list)
    # Directories every job may write besides its own, e.g. a ccache the builds share (a job
    # can then leave things there for the next one: share only what is meant to be shared).
    sandbox_shared: list[str] = Field(default_factory=list)
    # Names of variables of the worker's environment that jobs get (e.g. CCACHE_DIR); nothing
    # else of it reaches them.
    sandbox_env: list[str] = Field(default_factory=list)
    # The builds' compiler cache: each project's builds get <ccache>/<project> as CCACHE_DIR, the
    # only part of it they may write (a project cannot plant objects in another's cache). A
    # build uses it through ccache, e.g. CMAKE_C_COMPILER_LAUNCHER=ccache or CC="ccache gcc".
    ccache: str | None = None
    # Records and leases the collector takes at once (one Gearman connection and database
    # connection each). One at a time was the farm's bottleneck at scale: a 5,000-job night on 64
    # hosts waited on the collector at 6 records a second, the workers' claims queued behind it
    # (docs/speed.md). The ledger's rules hold for concurrent writers (gearfarm/run/ledger.py); on
    # SQLite writes still take turns, but verifying and parsing overlap them. Sixteen: a thread
    # spends most of a record waiting (a round trip per statement, each a wake-up of PostgreSQL
    # and of the thread on a busy machine), so at 64 hosts four applied 12 records a second
    # with 12 % of a core and a queue of 650 behind them; sixteen keep the queue near empty.
    # Their database connections are opened when the collector starts (docs/lab.md).
    collector_threads: int = Field(default=16, ge=1, le=64)
    # Seconds a worker or collector whose parent process is gone waits for any gearmand to answer
    # before it exits; 0: never. The embedded farm's processes get 30: their parent is the farm
    # that owns their gearmand, and with both gone nothing would ever stop them. A lab's are
    # daemons under systemd (their parent never goes), which keep retrying through any outage.
    orphan_wait: float = Field(default=0.0, ge=0)


class BisectConfig(_Section):
    """Bisection of what a nightly finds (gearfarm/bisection/driver.py, docs/bisection.md)."""

    # After a nightly's mail, bisect its new failures and performance regressions whose range
    # holds more than one commit; a follow-up mail names the culprits.
    auto: bool = True
    # Bisection groups at once (failures of one target and range are one group, each regression
    # of a benchmark one of its own): each runs one job at a time, so two keep two worker slots busy.
    parallel: int = Field(default=2, ge=1, le=32)
    # The budget of one group: builds made (reused ones are free), jobs run, wall time.
    builds: int = Field(default=8, ge=1, le=1000)
    jobs: int = Field(default=60, ge=1, le=10000)
    hours: float = Field(default=4.0, gt=0, le=168)
    # Tests: runs of each end of the range before searching, and of each middle revision.
    confirm: int = Field(default=4, ge=1, le=100)
    repeat: int = Field(default=2, ge=1, le=100)
    # Benchmarks: the most A/B pairs measured at one revision.
    max_pairs: int = Field(default=40, ge=2, le=1000)


class RetentionConfig(_Section):
    """What `gearfarm store prune` keeps (gearfarm/run/retention.py, docs/bisection.md "Retention")."""

    # Builds, sources and run files (logs, results, reports) not used for this many days expire,
    # unless the policy keeps them: the last good and first bad builds of every regression, every
    # revision a bisection judged, tagged revisions, each target's last good and reference build.
    days: float = Field(default=30.0, ge=1.0, le=3650.0)
    # Keep the builds of revisions a tag of the project's repository points at.
    keep_tags: bool = True


class Config(_Section):
    projects: list[ProjectConfig] = Field(default_factory=list)
    gearman: GearmanConfig = Field(default_factory=GearmanConfig)
    bisect: BisectConfig = Field(default_factory=BisectConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    s3: S3Config = Field(default_factory=S3Config)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    mail: MailConfig = Field(default_factory=MailConfig)
    farm: FarmConfig = Field(default_factory=FarmConfig)
    web: WebConfig = Field(default_factory=WebConfig)
    # Where the file was read from; relative paths in it are relative to its folder.
    source: str | None = None

    @field_validator("projects")
    @classmethod
    def _unique_names(cls, v: list[ProjectConfig]) -> list[ProjectConfig]:
        return _unique_projects(v)

    def project_list(self) -> list[ProjectConfig]:
        """The configured projects; with none, the one default project: the engine in
        farm.repo with its catalog at jobs/catalog.toml."""
        return self.projects or [ProjectConfig(name=DEFAULT_PROJECT, repo=self.farm.repo)]

    def project(self, name: str) -> ProjectConfig:
        for p in self.project_list():
            if p.name == name:
                return p
        raise ConfigError(f"no project {name!r} in the config; configured: "
                          f"{', '.join(p.name for p in self.project_list())}")

    def secret_files(self) -> list[Path]:
        """Every file this config names that a job must never read: the config itself (keys,
        passwords), the signing keys and the TLS files."""
        out = [Path(self.source).resolve()] if self.source else []
        g = self.gearman
        for name in (g.tls_ca, g.tls_cert, g.tls_key, self.s3.ca_bundle, self.farm.signing_key, self.farm.host_key):
            if name:
                out.append(self.path(name))
        return out

    def path(self, p: str) -> Path:
        base = Path(self.source).parent if self.source else Path.cwd()
        return (base / p).resolve()

    def host_name(self) -> str:
        """The name this host is registered under and its records carry."""
        return self.farm.host_name or socket.gethostname()

    def nightly_signer(self) -> Signer:
        """The nightly's private key; ConfigError saying how to make one when it has none."""
        if not self.farm.signing_key:
            raise ConfigError("[farm] signing_key is not set: the nightly host signs payloads with its own key "
                              "(make one with `gearfarm keys new --out FILE`, put its public key in every host's "
                              "[farm] nightly_keys)")
        return self._signer(self.farm.signing_key, "signing_key")

    def host_signer(self) -> Signer:
        """This worker host's private key; ConfigError saying how to enroll the host without one."""
        if not self.farm.host_key:
            raise ConfigError("[farm] host_key is not set: a worker host signs its results with a key of its own "
                              "(make one with `gearfarm keys new --out FILE` and register it on the nightly host "
                              "with `gearfarm keys add HOST PUBLIC_KEY --role ... --target ...`)")
        return self._signer(self.farm.host_key, "host_key")

    def _signer(self, name: str, what: str) -> Signer:
        try:
            return Signer.load(self.path(name))
        except SealError as e:
            raise ConfigError(f"[farm] {what}: {e}") from e

    def nightly_lookup(self) -> Lookup:
        """What verifies payloads on a worker: the nightly's public keys."""
        if not self.farm.nightly_keys:
            raise ConfigError("[farm] nightly_keys is empty: a worker runs only payloads the nightly signed; put "
                              "the nightly's public key there (`gearfarm keys show` on the nightly host prints it)")
        return keyring(self.farm.nightly_keys)

    def runs_dir(self) -> Path:
        """Where this host keeps each run's reports and job files (one folder per run id)."""
        return self.path(self.farm.state_dir) / "runs"

    def submitted_logs(self) -> Path:
        """Where the dashboard keeps the output of the nightlies it started (self-service), one
        ``<run>.log`` each: the retention prune removes it with the run's folder."""
        return self.path(self.farm.state_dir) / "web"

    def submitted_log(self, run_id: str) -> Path:
        return self.submitted_logs() / f"{run_id}.log"


def load(path: str | os.PathLike[str]) -> Config:
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"config file {p} not found (given by --config or ${ENV_VAR})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"config file {p} is invalid: {describe(e)}") from None
    cfg.source = str(p.resolve())
    # A relative SQLite file is relative to the config's folder like every other path in it, not
    # to wherever the command happened to run (a nightly started from a checkout left its
    # results database in the checkout).
    prefix = "sqlite:///"
    db = cfg.database.url
    if db.startswith(prefix) and not db[len(prefix):].startswith(("/", ":memory:")) and db[len(prefix):]:
        cfg.database.url = prefix + str(cfg.path(db[len(prefix):]))
    return cfg


class EmbeddedSettings(_Section):
    """What a projects file may say of the embedded farm that runs it: the [farm] keys of a lab
    config that concern the one host (its slots and what its jobs may see and share)."""

    slots: int = Field(default=0, ge=0, le=256)
    ccache: str | None = None
    max_timeout: float = Field(default=FarmConfig.model_fields["max_timeout"].default, gt=0)
    sandbox_readonly: list[str] = Field(default_factory=list)
    sandbox_shared: list[str] = Field(default_factory=list)
    sandbox_env: list[str] = Field(default_factory=list)
    job_pids_max: int = Field(default=FarmConfig.model_fields["job_pids_max"].default, ge=0)
    job_memory_max: int = Field(default=FarmConfig.model_fields["job_memory_max"].default, ge=0)
    job_cpu_weight: int = Field(default=FarmConfig.model_fields["job_cpu_weight"].default, ge=1, le=10000)
    job_limits: str = Field(default="if-available", pattern=r"^(if-available|required)$")
    job_tmp_size: int = Field(default=FarmConfig.model_fields["job_tmp_size"].default, ge=1024 * 1024)
    job_disk: int = Field(default=FarmConfig.model_fields["job_disk"].default, ge=16 * 1024 * 1024)
    min_free: int = Field(default=FarmConfig.model_fields["min_free"].default, ge=0)

    @field_validator("job_memory_max", "job_tmp_size", "job_disk", "min_free", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return parse_size(v) if isinstance(v, str) else v


class ProjectsFile(_Section):
    """`gearfarm nightly --projects FILE`: the projects of an embedded farm, as a lab config's
    [[projects]] (same keys), and optionally [farm] with the keys of EmbeddedSettings."""

    projects: list[ProjectConfig] = Field(min_length=1)
    farm: EmbeddedSettings = Field(default_factory=EmbeddedSettings)

    @field_validator("projects")
    @classmethod
    def _unique_names(cls, v: list[ProjectConfig]) -> list[ProjectConfig]:
        return _unique_projects(v)


def load_projects(path: str | os.PathLike[str]) -> ProjectsFile:
    """A projects file, its relative paths (repo, catalog_file, the [farm] directories) made
    absolute from its own folder: the embedded farm's config, where they end up, lives elsewhere."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"projects file {p} not found (given by --projects)") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"projects file {p} cannot be read: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"projects file {p} is not valid TOML: {e}") from e
    lab = sorted(set(raw) - {"projects", "farm"})
    if lab:
        raise ConfigError(f"projects file {p} has [{'], ['.join(lab)}]: a projects file holds only [[projects]] (and "
                          f"[farm] {', '.join(EmbeddedSettings.model_fields)}) for the embedded farm; a farm of "
                          f"your own servers is a lab config: run with --config (docs/lab.md)")
    if "projects" not in raw:
        raise ConfigError(f"projects file {p} has no [[projects]]: add one per project (name, repo; docs/projects.md)")
    try:
        found = ProjectsFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"projects file {p} is invalid: {describe(e)}") from None
    base = p.resolve().parent
    for project in found.projects:
        local = project.local_repo(base)
        if local is not None:
            project.repo = str(local)
        if project.catalog_file is not None:
            project.catalog_file = str((base / project.catalog_file).resolve())
    settings = found.farm
    settings.ccache = str((base / os.path.expanduser(settings.ccache)).resolve()) if settings.ccache else None
    settings.sandbox_readonly = [str((base / d).resolve()) for d in settings.sandbox_readonly]
    settings.sandbox_shared = [str((base / d).resolve()) for d in settings.sandbox_shared]
    return found


def describe(e: ValidationError) -> str:
    """Each problem as 'section.key: what is wrong', never with the offending value: a value in
    this file may be a password or a signing key, and the message goes to logs and cron mail."""
    parts = []
    for err in e.errors(include_input=False, include_url=False):
        where = ".".join(str(x) for x in err["loc"])
        hint = " (unknown key: remove it or check its spelling)" if err["type"] == "extra_forbidden" else ""
        parts.append(f"[{where}] {err['msg']}{hint}")
    return "; ".join(parts)



def dump(cfg: Config, path: Path) -> None:
    """Write a config as TOML (only the simple shapes this model uses)."""
    lines: list[str] = []
    data = cfg.model_dump(exclude={"source"})
    for project in data.pop("projects"):
        lines.append("[[projects]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in project.items() if v is not None]
        lines.append("")
    for section, model in data.items():
        lines.append(f"[{section}]")
        for k, v in model.items():
            if v is None:
                continue
            lines.append(f"{k} = {_toml_value(v)}")
        lines.append("")
    write_private(path, "\n".join(lines).encode())


def write_private(path: Path, data: bytes) -> None:
    """Write a file of secrets readable by its owner only, with no moment where it is readable by
    others (written first and chmod'ed after, a local user could open it in between)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # the file may have existed with wider permissions


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table; keys are the model's plain names
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
