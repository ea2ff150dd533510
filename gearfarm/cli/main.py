"""The `gearfarm` command: nightly, worker, collector, status, report, history, farm stop."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from gearfarm import config as config_mod
from gearfarm.config import Config, ConfigError, FarmConfig, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import CatalogError
from gearfarm.formats.exitcode import EXIT_FAILED, EXIT_FARM, EXIT_OK
from gearfarm.gearman import GearmanError, admin
from gearfarm.hosts import process
from gearfarm.hosts.connection import ssl_context
from gearfarm.s3 import artifact
from gearfarm.s3.store import ArtifactStore, StoreError, sha256_file
from gearfarm.step import sandbox, wine

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from gearfarm.db.results import ResultsDB
    from gearfarm.run import nightly

# Commands import what they need when they run: a worker process starts by importing this
# module, and the nightly's, the report's and the database's modules (SQLAlchemy, matplotlib,
# scipy) tripled its start time (measured: 2.2 s against 0.5 s with ten workers starting).

console = Console(stderr=True, soft_wrap=True)


def _fail(msg: str) -> NoReturn:
    console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)
    sys.exit(EXIT_FARM)


def _repo_root() -> Path:
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if proc.returncode != 0:
        _fail("not inside a git repository; run from the gearfarm checkout or pass --repo")
    return Path(proc.stdout.strip())


def _load_config(path: str | None) -> Config | None:
    path = path or os.environ.get(config_mod.ENV_VAR)
    if not path:
        return None
    try:
        return config_mod.load(path)
    except ConfigError as e:
        _fail(str(e))


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    if value.strip() in ("", "none"):
        return []
    return [v.strip() for v in value.split(",") if v.strip()]


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
def main(verbose: bool) -> None:
    """gearfarm: nightly builds, tests and benchmarks on Gearman."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@main.command("nightly")
@click.option("--config", "config_path", help="Lab config (TOML); default: $GEARFARM_CONFIG, else embedded.")
@click.option("--project", "project_names", help="Comma-separated projects to build (default: every configured one).")
@click.option("--rev", help="Revision to build (default: each project's branch); needs one project.")
@click.option("--targets", help="Comma-separated targets (default: each project's [[projects]] targets, else all "
                                "in its catalog).")
@click.option("--suites", help="Comma-separated suites (default: each target's list; 'none' for build only).")
@click.option("--benchmarks", help="Comma-separated benchmarks for perf targets (default: all; 'none').")
@click.option("--run-id", help="Run id (default: time, project and revision); needs one project. "
                               "Resubmitting an id adds nothing.")
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path),
              help="The default project's repository (when the config names no [[projects]]).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Embedded farm state (default: $GEARFARM_STATE or <repo>/state).")
@click.option("--keep", is_flag=True, help="Leave the embedded farm running (stop: gearfarm farm stop).")
@click.option("--slots", type=click.IntRange(1, 256),
              help="Embedded farm: build and test jobs run at once (default: one per core).")
@click.option("--no-worker-wait", type=float, help="Seconds before a job with no worker is recorded so.")
@click.option("--deadline", type=float, help="Seconds by which the run must end.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also copy each run's report, JUnit XML and logs to DIR/<run id>/ (e.g. a Jenkins workspace).")
def nightly_cmd(config_path: str | None, project_names: str | None, rev: str | None, targets: str | None,
                suites: str | None, benchmarks: str | None, run_id: str | None, seed: int, repo: Path | None,
                state_dir: Path | None, keep: bool, slots: int | None, no_worker_wait: float | None,
                deadline: float | None, report_dir: Path | None) -> None:
    """Run a whole nightly: every project's build on every target, tests, collect, one report."""
    from gearfarm.run import nightly

    # cron and CI stop jobs with SIGTERM: unwind so the embedded farm is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_FARM))
    cfg = _load_config(config_path)
    if cfg is not None and slots is not None:
        _fail("--slots sets the embedded farm's worker slots; with --config, each lab host has as many slots as "
              "worker processes it runs (docs/lab.md)")
    default_repo = (repo or (cfg.path(cfg.farm.repo) if cfg else None) or _repo_root()).resolve()
    # Before the embedded farm exists, its config is only where projects and paths come from.
    base = cfg or Config(farm=FarmConfig(repo=str(default_repo),
                                         state_dir=str(_state_dir(state_dir, default_repo))))
    if repo is not None and not base.projects:
        base.farm.repo = str(default_repo)
    try:
        projects = _select_projects(base, project_names)
        if len(projects) > 1 and (rev or run_id):
            raise nightly.RunError(f"--rev and --run-id name one project's run: add --project (configured: "
                                   f"{', '.join(p.name for p in projects)})")
        loaded = [nightly.load_project(base, p, rev) for p in projects]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # Checked now, before anything starts; planned once the sources are in S3.
        todo: list[tuple[nightly.Loaded, str, nightly.Selection]] = []
        wanted = _csv(targets)
        for lp in loaded:
            # --targets, else the project's own [[projects]] targets, else all of its catalog's.
            narrowed = [_narrow(lp.catalog, kind, names, len(loaded) > 1)
                        for kind, names in (("targets", lp.targets if wanted is None else wanted),
                                            ("suites", _csv(suites)), ("benchmarks", _csv(benchmarks)))]
            sel = nightly.select(lp.catalog, *narrowed)
            if sel.targets:
                todo.append((lp, run_id or f"{stamp}-{lp.name}-{lp.rev[:12]}", sel))
            else:
                console.print(f"[yellow]project {lp.name}: none of --targets {targets} is in its catalog; "
                              "not built tonight[/]", highlight=False)
        _check_known(loaded, _csv(targets), _csv(suites), _csv(benchmarks))
        if not todo:
            raise nightly.RunError("no project has anything to build with these --targets")
    except (CatalogError, nightly.RunError, ConfigError, ValueError) as e:
        _fail(str(e))
    farm = None
    if cfg is None:
        from gearfarm.hosts.gearmand import GearmandError
        from gearfarm.run.farm import EmbeddedFarm, FarmError
        from gearfarm.s3.minio import MinioError

        state = _state_dir(state_dir, default_repo)
        farm = EmbeddedFarm(state, default_repo, slots=slots or 0)
        console.print(f"starting the embedded farm in {state} …")
        try:
            cfg = farm.start([lp.catalog for lp, _, _ in todo], sorted({t for _, _, sel in todo for t in sel.targets}),
                             perf=any(any(sel.benchmarks.values()) for _, _, sel in todo))
        except (GearmandError, MinioError, FarmError, OSError) as e:
            farm.stop()
            _fail(f"the embedded farm could not start: {e}")
        for role, missing in farm.missing.items():
            for t, why in missing.items():
                console.print(f"[yellow]no {role} worker for {t}:[/] {escape(why)}")
    assert cfg is not None
    if no_worker_wait is not None:
        cfg.farm.no_worker_wait = no_worker_wait
    if deadline is not None:
        cfg.farm.run_deadline = deadline
    try:
        code = _run_nightly(cfg, todo, seed, report_dir)
    finally:
        if farm is not None and not keep:
            farm.stop()
        elif farm is not None:
            console.print(f"farm left running (config {farm.config_path}); stop it with: gearfarm farm stop")
    _exit_now(code)


def _state_dir(state_dir: Path | None, repo: Path) -> Path:
    return (state_dir or Path(os.environ.get("GEARFARM_STATE", repo / "state"))).resolve()


def _select_projects(cfg: Config, names: str | None) -> list[ProjectConfig]:
    wanted = _csv(names)
    if not wanted:
        return cfg.project_list()
    return [cfg.project(n) for n in wanted]


def _narrow(cat: catalog_mod.Catalog, kind: str, names: list[str] | None, several: bool) -> list[str] | None:
    """With several projects, --targets/--suites/--benchmarks apply to the projects that have
    them (a name no project has is an error, see _check_known); with one, every name must exist."""
    if names is None or not several:
        return names
    known = {"targets": cat.targets, "suites": cat.suites, "benchmarks": cat.benchmarks}[kind]
    return [n for n in names if n in known]


def _check_known(loaded: list[nightly.Loaded], targets: list[str] | None, suites: list[str] | None,
                 benchmarks: list[str] | None) -> None:
    from gearfarm.run import nightly

    for kind, names in (("targets", targets), ("suites", suites), ("benchmarks", benchmarks)):
        known = {n for lp in loaded for n in getattr(lp.catalog, kind)}
        unknown = [n for n in names or [] if n not in known]
        if unknown:
            raise nightly.RunError(f"unknown {kind[:-1]} {', '.join(unknown)}: no project's catalog defines it; "
                                   f"known {kind}: {', '.join(sorted(known)) or 'none'}")


class _ConsoleObserver:
    """The night on the terminal: progress and problems on stderr (a live table of each run's
    jobs on a terminal, a line per change of state otherwise), the reports on stdout."""

    def __init__(self) -> None:
        self.live: Live | None = None
        self.last: dict[str, str] = {}

    def say(self, text: str) -> None:
        console.print(escape(text), highlight=False)

    def result(self, text: str) -> None:
        click.echo(text)

    def warn(self, text: str) -> None:
        console.print(f"[yellow]{escape(text)}[/]", highlight=False)

    def problem(self, text: str) -> None:
        console.print(f"[bold red]farm problem:[/] {escape(text)}", highlight=False)

    def submitted(self, plan: nightly.Plan, created: bool) -> None:
        self.say(f"run {plan.run_id} {'submitted' if created else 'already known; resubmitted'}: project "
                 f"{plan.project}, rev {plan.rev[:12]}, {len(plan.targets)} targets, {len(plan.expected)} jobs")

    def progress(self, plan: nightly.Plan, states: dict[str, str], functions: dict[str, admin.FunctionStatus]) -> None:
        if console.is_terminal:
            from rich.live import Live

            if self.live is None:
                self.live = Live(console=console, refresh_per_second=2)
                self.live.start()
            self.live.update(_table(plan, states, functions))
            return
        for j in map(str, plan.expected):
            if states.get(j) and states.get(j) != self.last.get(j):
                console.print(f"  {j[len(plan.run_id) + 1:]:<40} {states[j]}", highlight=False)
        self.last.update(states)

    def waited(self, plan: nightly.Plan, records: list) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _table(plan: nightly.Plan, states: dict[str, str], fns: dict[str, admin.FunctionStatus]) -> Table:
    from rich.table import Table

    from gearfarm.formats.result import TERMINAL

    t = Table(title=f"run {plan.run_id}")
    t.add_column("target")
    for col in ("queued", "running", "passed", "failed", "other"):
        t.add_column(col)
    for target in plan.targets:
        st = [states.get(str(j), "") for j in plan.expected if j.target == target]
        running = sum(fns[f].running for f in fns if f.endswith(":" + target))
        queued = sum(1 for s in st if s not in TERMINAL) - running
        t.add_row(target, str(max(queued, 0)), str(running), str(st.count("passed")),
                  str(st.count("failed") + st.count("timed_out")),
                  str(sum(1 for s in st if s in ("skipped", "no_worker", "infra"))))
    return t


def _run_nightly(cfg: Config, todo: list[tuple[nightly.Loaded, str, nightly.Selection]], seed: int,
                 report_dir: Path | None = None) -> int:
    from gearfarm.night.sequence import NightError, Project, run_night

    observer = _ConsoleObserver()
    try:
        return run_night(cfg, [Project(lp, rid, sel) for lp, rid, sel in todo], seed, observer, report_dir)
    except NightError as e:
        observer.close()
        _fail(str(e))
    finally:
        observer.close()


@main.command("worker")
@click.option("--role", required=True,
              help="build, test, perf or collector; or several of build, test and perf, comma-separated: one "
                   "worker slot (one job at a time) serving them all ('-' separates them too). A trailing .N "
                   "names the slot and is otherwise ignored (systemd: gearfarm-worker@build-test.1, @perf.1).")
@click.option("--targets", help="Comma-separated targets to serve (default: all this host can serve).")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def worker_cmd(role: str, targets: str | None, config_path: str | None) -> None:
    """Run a worker: registers exactly the functions this host can serve, the jobs on the
    longest path of a nightly first (run one per core for a host's slots)."""
    cfg = _load_config(config_path)
    if cfg is None:
        _fail(f"a worker needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    # "build-test.2" (systemd's instance names cannot hold a comma) is "build,test" in slot 2:
    # the slot's number is for the unit's instance name only.
    roles = _csv(re.sub(r"\.[0-9]+$", "", role).replace("-", ",")) or []
    if roles == ["collector"]:
        from gearfarm.workers import collector

        collector.serve(cfg)
        _exit_now()
    bad = [r for r in roles if r not in ("build", "test", "perf")]
    if bad or not roles or len(set(roles)) < len(roles):
        _fail(f"--role {role!r}: give build, test, perf or collector, or several of build, test and perf "
              "separated by commas (e.g. --role build,test)")
    from gearfarm.formats.job import function_name
    from gearfarm.hosts import probe
    from gearfarm.run import priority
    from gearfarm.workers import base, build, perf, test

    wanted = _csv(targets)
    for t in wanted or []:
        if not catalog_mod.TARGET_RE.match(t):
            _fail(f"--targets: {t!r} is not a target name <os>-<arch> (e.g. linux-x86_64)")
    # No repository here: what the projects' targets are comes from the catalogs the nightly
    # stored in S3. Each job's own catalog decides what runs.
    # With --targets given, the check is a courtesy: an S3 that is away does not hold the worker up.
    cats, notes = _latest_catalogs(cfg, retry_for=2.0 if wanted else 30.0, role=roles[0])
    for note in notes:
        console.print(f"[yellow]{escape(note)}[/]", highlight=False)
    if not cats and not wanted:
        _fail("no project has a catalog in S3 yet (no nightly has run), so this worker cannot tell which targets "
              "it may serve: name them with --targets, e.g. --targets linux-x86_64")
    served: dict[str, list[str]] = {}
    missing: dict[tuple[str, str], str] = {}
    for r in roles:
        if not cats:
            served[r] = list(wanted or [])
            continue
        ok, why = probe.servable(cats, r, wanted)
        if wanted:
            # A target no catalog defines yet may be a project's first: serve it as asked.
            unknown = [t for t, w in why.items() if w.startswith("no project's catalog")]
            ok += unknown
            why = {t: w for t, w in why.items() if t not in unknown}
        served[r] = ok
        missing.update({(r, t): w for t, w in why.items()})
    if wanted:
        # A named target must be served; with several roles, by at least one of them (a host
        # may build for Windows without wine to test it).
        lost = [(r, t) for (r, t) in missing if not any(t in served[o] for o in roles)]
        if lost:
            _fail("; ".join(f"this host cannot serve {r} for {t}: {missing[(r, t)]}" for r, t in lost))
        for (r, t), w in missing.items():
            console.print(f"[yellow]not serving {r} for {t}: {escape(w)}[/]", highlight=False)
    if not any(served.values()):
        _fail(f"this host can serve no target for role {role}: "
              + "; ".join(f"{t} ({r}): {w}" for (r, t), w in missing.items()))
    defs = {name: t for c in reversed(cats) for name, t in c.targets.items()}
    pairs = priority.order([(r, t) for r in roles for t in served[r]], defs,
                           priority.Durations.of_host(cfg.path(cfg.farm.state_dir)).load())
    handlers = {"build": build.handle, "test": test.handle, "perf": perf.handle}
    try:
        base.serve(cfg, [(r, function_name(r, t), handlers[r]) for r, t in pairs])  # type: ignore[misc]
    except ConfigError as e:  # no key to verify payloads or sign results with: refuse, saying how
        _fail(str(e))
    _exit_now()


def _exit_now(code: int = EXIT_OK) -> NoReturn:
    """End a process whose work is done and written (a worker stopped cleanly, its results
    delivered or spooled; a nightly after its report) without the interpreter's teardown:
    freeing every module's objects one by one took 0.2 s of CPU per worker (1 s for ten workers
    stopping at once on two cores), and 0.5 s at the end of every nightly."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _latest_catalogs(cfg: Config, retry_for: float, role: str) -> tuple[list[catalog_mod.Catalog], list[str]]:
    """The newest catalog of every configured project, from S3 (see gearfarm.run.snapshot), read
    with ``role``'s keys."""
    import json

    from gearfarm.run import snapshot
    from gearfarm.s3 import keys

    store = ArtifactStore(cfg.s3.for_role(role), retry_for=retry_for)
    cats, notes = [], []
    for project in cfg.project_list():
        try:
            if not store.exists(keys.project_latest(project.name)):
                continue
            latest = json.loads(store.get_bytes(keys.project_latest(project.name)))
            cats.append(snapshot.fetch_catalog(store, latest["catalog_sha256"]))
        except (StoreError, CatalogError, ValueError, KeyError) as e:
            notes.append(f"project {project.name}: its newest catalog cannot be read from S3 ({e}); ignored")
    return cats, notes


@main.group("project")
def project_group() -> None:
    """A project's catalog: check it, and try its build, before its first nightly."""


@project_group.command("check")
@click.option("--config", "config_path", help="Farm config naming the project (default $GEARFARM_CONFIG).")
@click.option("--project", "name", help="A configured project (default: the only or first one).")
@click.option("--repo", help="A repository (path or URL) to check instead of a configured project.")
@click.option("--catalog", "catalog_path", help="The catalog's path in the repository (default jobs/catalog.toml).")
@click.option("--catalog-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A catalog file on disk, for repositories that cannot carry one.")
@click.option("--rev", help="Revision to check (default: the project's branch).")
@click.option("--target", help="Target to build once (default: the first this host can build).")
@click.option("--no-run", is_flag=True, help="Only validate the catalog and print what the farm would run.")
def project_check(config_path: str | None, name: str | None, repo: str | None, catalog_path: str | None,
                  catalog_file: Path | None, rev: str | None, target: str | None, no_run: bool) -> None:
    """Validate a project's catalog at a revision, print what the farm would run for each
    target, and (where this host can) build one target and run its suites once, locally,
    through the same code as the farm's workers. Exit 0: all good; 1: the build or a suite
    failed; 2: the catalog or the repository is wrong."""
    import tempfile

    from gearfarm.hosts import probe
    from gearfarm.run import nightly, snapshot
    from gearfarm.step import runner as step

    cfg = _load_config(config_path) or Config()
    if repo is not None:
        project = ProjectConfig(name=name or "check", repo=repo, catalog=catalog_path,
                                catalog_file=str(catalog_file.resolve()) if catalog_file else None)
    else:
        try:
            project = cfg.project(name) if name else cfg.project_list()[0]
        except ConfigError as e:
            _fail(str(e))
        if catalog_file is not None or catalog_path is not None:
            project = project.model_copy(update={"catalog": catalog_path, "catalog_file": str(catalog_file.resolve())
                                                 if catalog_file else None})
    with tempfile.TemporaryDirectory(prefix="gearfarm-check-") as tmp_name:
        tmp = Path(tmp_name)
        if cfg.source is None:
            cfg.farm.state_dir = str(tmp / "state")  # a URL's mirror lives only as long as the check
        try:
            lp = nightly.load_project(cfg, project, rev)
        except (CatalogError, nightly.RunError) as e:
            _fail(str(e))
        cat = lp.catalog
        click.echo(f"project {project.name}: catalog valid at {lp.rev[:12]} ({len(cat.targets)} targets, "
                   f"{len(cat.suites)} suites, {len(cat.benchmarks)} benchmarks)")
        for t in cat.targets.values():
            _print_target(cat, t)
        if no_run:
            return
        if target is not None:
            try:
                cat.target(target)
            except CatalogError as e:
                _fail(str(e))
            reason = probe.probe(cat.target(target), "build")
            if reason:
                _fail(f"this host cannot build {target}: {reason}")
            chosen = target
        else:
            ok, missing = probe.servable(cat, "build")
            if not ok:
                _fail("this host can build none of the targets: " + "; ".join(f"{t}: {w}" for t, w in missing.items()))
            chosen = ok[0]
        tgt = cat.target(chosen)
        click.echo(f"\nbuilding {chosen} here, from the snapshot of {lp.rev[:12]} …")
        archive = tmp / f"source{artifact.ARCHIVE_SUFFIX}"
        snapshot.pack(lp.repo, lp.rev, archive)
        root, scratch = tmp / "root", tmp / "scratch"
        scratch.mkdir()
        artifact.safe_extract(archive, root, sha256_file(archive), "source snapshot")
        log_path = tmp / "build.log"
        # Confined as a worker would confine it (the project's code runs on the user's machine).
        box = sandbox.for_config(cfg)
        run = step.run_build(cat, tgt, root, scratch, log_path, box)
        if run.status != "passed":
            click.echo(process.log_tail(log_path, 40))
            console.print(f"[bold red]build {run.status}:[/] {escape(run.message(cat.build.timeout))} (log above)",
                          highlight=False)
            sys.exit(EXIT_FAILED)
        click.echo(f"build passed; artifact would hold {len(run.outputs)} files:")
        for f in run.outputs[:20]:
            click.echo(f"  {f}")
        if len(run.outputs) > 20:
            click.echo(f"  … and {len(run.outputs) - 20} more")
        # Through a real artifact, as test workers get it: what is not in the outputs is not there.
        packed_path = tmp / f"artifact{artifact.ARCHIVE_SUFFIX}"
        packed = artifact.pack(root, run.outputs, {"rev": lp.rev, "target": chosen}, packed_path)
        failed = 0
        for sname in tgt.suites:
            suite = cat.suite(sname)
            reason = probe.probe(tgt, "test")
            if reason:
                click.echo(f"suite {sname}: not run here ({reason})")
                continue
            tree = tmp / f"tree-{sname}"
            if suite.source:
                artifact.safe_extract(archive, tree, sha256_file(archive), "source snapshot")
            artifact.unpack(packed_path, tree, packed["archive_sha256"])
            (tmp / f"scratch-{sname}").mkdir()
            slog = tmp / f"{sname}.log"
            prefix = wine.job_prefix(box, cfg.path(cfg.farm.state_dir) / "wine", tgt.runner, tmp / f"job-{sname}")
            res = step.run_suite(cat, tgt, suite, tree, tmp / f"scratch-{sname}", slog, 1, box, prefix)
            counts = {st: sum(1 for c in res.cases if c.status == st)
                      for st in ("passed", "failed", "error", "skipped")}
            click.echo(f"suite {sname} ({suite.format}): {res.status}, {len(res.cases)} test cases "
                       + ", ".join(f"{n} {st}" for st, n in counts.items() if n)
                       + (f" — {res.message}" if res.message else ""))
            for c in res.cases:
                if c.status in ("failed", "error"):
                    click.echo(f"    {c.status}: {c.name} {c.message.splitlines()[0] if c.message else ''}")
            if res.status != "passed":
                failed += 1
                click.echo(process.log_tail(slog, 15))
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _print_target(cat: catalog_mod.Catalog, t: catalog_mod.Target) -> None:
    shown = {"root": "{root}", "scratch": "{scratch}", "junit": "{junit}", "seed": "{seed}"}
    vals = catalog_mod.values(cat, t, shown)

    def cmd(argv: list[str], runner: bool = False) -> str:
        return " ".join((t.runner if runner else []) + catalog_mod.expand(argv, vals, t.runner))

    click.echo(f"\ntarget {t.name}" + (f" (runner: {' '.join(t.runner)})" if t.runner else "")
               + (f", needs {', '.join(t.tools)}" if t.tools else ""))
    click.echo(f"  build   (in {cat.build.cwd}): {cmd(cat.build.argv)}")
    click.echo(f"          outputs: {', '.join(o.format_map(vals) for o in cat.build.outputs)}")
    for sname in t.suites:
        s_ = cat.suite(sname)
        click.echo(f"  test-{sname} ({s_.format}, in {s_.cwd}): {cmd(s_.argv, s_.runner)}")
    if t.perf:
        for bname, b in cat.benchmarks.items():
            click.echo(f"  perf-{bname} ({', '.join(b.metrics)}): {cmd(b.argv, b.runner)}")


@main.command("collector")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def collector_cmd(config_path: str | None) -> None:
    """Run the collector: stores every result record in the results database."""
    cfg = _load_config(config_path)
    if cfg is None:
        _fail(f"the collector needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    from gearfarm.workers import collector

    collector.serve(cfg)
    _exit_now()


def _config_or_embedded(config_path: str | None, state_dir: Path | None) -> Config:
    cfg = _load_config(config_path)
    if cfg is not None:
        return cfg
    state = (state_dir or Path(os.environ.get("GEARFARM_STATE", _repo_root() / "state"))).resolve()
    path = state / "farm.toml"
    if not path.exists():
        _fail(f"no farm config: pass --config, set ${config_mod.ENV_VAR}, or start a farm with "
              f"'./nightly.bash --keep' (looked for {path})")
    return config_mod.load(path)


@main.group("keys")
def keys_group() -> None:
    """Signing keys: the nightly's, and the registry of worker hosts' (docs/security.md, 'Keys')."""


@keys_group.command("new")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the private key (0600); it must not exist.")
def keys_new(out: Path) -> None:
    """Make a key pair: the private key into --out, the public key printed (for `keys add`, or a
    host's [farm] nightly_keys)."""
    from gearfarm.formats.seal import Signer

    if out.exists():
        _fail(f"{out} exists: a key is never overwritten (a host's old key would stop verifying); "
              "pick another file, or revoke and delete the old key first")
    signer = Signer.generate()
    config_mod.write_private(out, signer.pem())
    click.echo(signer.public_text)
    console.print(f"key {signer.kid} written to {out} (0600)", highlight=False)


@keys_group.command("show")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def keys_show(config_path: str | None, state_dir: Path | None) -> None:
    """Print the public keys of this config's signing_key (the nightly's) and host_key."""
    from gearfarm.formats.seal import SealError, Signer

    cfg = _config_or_embedded(config_path, state_dir)
    shown = False
    for what, name in (("nightly", cfg.farm.signing_key), (f"host {cfg.host_name()}", cfg.farm.host_key)):
        if name:
            try:
                signer = Signer.load(cfg.path(name))
            except SealError as e:
                _fail(str(e))
            click.echo(f"{what}\t{signer.kid}\t{signer.public_text}")
            shown = True
    if not shown:
        _fail("this config names no signing_key and no host_key")


def _registry(config_path: str | None, state_dir: Path | None):  # noqa: ANN202 - Registry, imported late
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB

    return Registry(ResultsDB(_config_or_embedded(config_path, state_dir).database.url))


@keys_group.command("add")
@click.argument("host")
@click.argument("public_key")
@click.option("--role", "roles", required=True, help="Comma-separated roles the host serves: build, test, perf.")
@click.option("--target", "targets", required=True, help="Comma-separated targets it serves, or '*' for all.")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def keys_add(host: str, public_key: str, roles: str, targets: str, config_path: str | None,
             state_dir: Path | None) -> None:
    """Register HOST's PUBLIC_KEY (ed25519:..., as `keys new` printed it, or @FILE holding it):
    the ledger then applies the records it signs for these roles and targets. Adding a key the
    host already has changes its roles and targets."""
    from gearfarm.db.registry import RegistryError
    from gearfarm.formats.seal import SealError

    if public_key.startswith("@"):
        try:
            public_key = Path(public_key[1:]).read_text().strip()
        except OSError as e:
            _fail(f"cannot read the public key from {public_key[1:]}: {e}")
    try:
        e = _registry(config_path, state_dir).add(host, public_key, _csv(roles) or [], _csv(targets) or [])
    except (RegistryError, SealError) as err:
        _fail(str(err))
    click.echo(f"registered key {e.kid} of host {e.host}: {', '.join(e.roles)} on {', '.join(e.targets)}")


@keys_group.command("list")
@click.option("--all", "show_all", is_flag=True, help="Revoked keys too.")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def keys_list(show_all: bool, config_path: str | None, state_dir: Path | None) -> None:
    """The registered host keys: id, host, roles, targets, since when (and revoked when)."""
    for e in _registry(config_path, state_dir).entries():
        if e.active or show_all:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.added_at))
            gone = "" if e.active else "\trevoked " + time.strftime("%Y-%m-%d %H:%M", time.localtime(e.revoked_at))
            click.echo(f"{e.kid}\t{e.host}\t{','.join(e.roles)}\t{','.join(e.targets)}\tadded {when}{gone}")


@keys_group.command("revoke")
@click.argument("who")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def keys_revoke(who: str, config_path: str | None, state_dir: Path | None) -> None:
    """Revoke a key (by its id) or every key of a host (by its name): from now on the ledger
    rejects what it signs (within seconds on every collector and nightly)."""
    from gearfarm.db.registry import RegistryError

    try:
        gone = _registry(config_path, state_dir).revoke(who)
    except RegistryError as e:
        _fail(str(e))
    for e in gone:
        click.echo(f"revoked key {e.kid} of host {e.host}")


@main.group("artifact")
def artifact_group() -> None:
    """Builds for people: download one, checked (docs/security.md, 'Artifacts for people')."""


@artifact_group.command("get")
@click.option("--project", help="The project (default: the only or first configured one).")
@click.option("--target", required=True, help="The target, e.g. linux-x86_64.")
@click.option("--rev", help="A revision (or the start of one): its newest passed build.")
@click.option("--run", "run_id", help="The build of this run.")
@click.option("--last-good", is_flag=True, help="The newest build whose tests all passed (the default).")
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where the archive, its provenance and the unpacked files go.")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def artifact_get(project: str | None, target: str, rev: str | None, run_id: str | None, last_good: bool, out: Path,
                 config_path: str | None, state_dir: Path | None) -> None:
    """Download a build, check its sha256 against the signed build record and its provenance's
    signature against the registry, unpack it and say what was verified. Exit 1 when a check
    fails, naming it."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import download

    if sum(x is not None for x in (rev, run_id)) + last_good > 1:
        _fail("give one of --rev, --run and --last-good")
    cfg = _config_or_embedded(config_path, state_dir)
    name = project or cfg.project_list()[0].name
    db = ResultsDB(cfg.database.url)
    try:
        rec = download.find_build(db, name, target, rev=rev, run=run_id)
        checked = download.get(db, ArtifactStore(cfg.s3, retry_for=30), rec, out)
    except download.NotFound as e:
        _fail(str(e))
    except download.VerifyError as e:
        console.print(f"[bold red]REFUSED:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_FAILED)
    except StoreError as e:
        _fail(f"cannot download from S3: {e}")
    for line in checked.lines:
        click.echo(f"verified: {line}")


@artifact_group.command("verify")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--provenance", "prov", type=click.Path(dir_okay=False, path_type=Path),
              help="The provenance (default: provenance.intoto.json beside the archive).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def artifact_verify(path: Path, prov: Path | None, config_path: str | None, state_dir: Path | None) -> None:
    """Check a downloaded archive (or the folder `artifact get` filled) against its signed
    provenance and the farm's registry of host keys. Exit 1 when a check fails, naming it."""
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import download

    archive = path / "artifact.tar.zst" if path.is_dir() else path
    registry = Registry(ResultsDB(_config_or_embedded(config_path, state_dir).database.url))
    try:
        checked = download.verify(registry, archive, prov)
    except download.VerifyError as e:
        console.print(f"[bold red]REFUSED:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_FAILED)
    for line in checked.lines:
        click.echo(f"verified: {line}")


@main.command("tls", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def tls_cmd(args: tuple[str, ...]) -> None:
    """The farm CA: ca, server, client, revoke, crl, list (as python -m gearfarm.hosts.tls)."""
    from gearfarm.hosts import tls

    sys.exit(tls.main(list(args), prog="gearfarm tls"))


@main.group("store")
def store_group() -> None:
    """The farm's S3 store."""


def _as_of(value: str | None) -> float | None:
    """--as-of: epoch seconds or an ISO date/time (UTC when it names no zone)."""
    import datetime

    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        _fail(f"--as-of {value!r}: give epoch seconds or an ISO date such as 2027-01-31")
    return (at if at.tzinfo else at.replace(tzinfo=datetime.UTC)).timestamp()


def _retention(config_path: str | None, state_dir: Path | None, days: float | None, as_of: str | None) -> tuple:
    from gearfarm.db.results import ResultsDB
    from gearfarm.run import retention

    now = _as_of(as_of)
    cfg = _config_or_embedded(config_path, state_dir)
    if days is not None:
        if days < 1:
            _fail("--days must be at least 1")
        cfg.retention.days = days
    db = ResultsDB(cfg.database.url)
    store = ArtifactStore(cfg.s3, retry_for=60)
    try:
        return cfg, db, store, retention.survey(cfg, db, store, now)
    except (retention.RetentionError, StoreError) as e:
        _fail(str(e))


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


@store_group.command("usage")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--days", type=float, help="The age limit to show (default [retention] days).")
@click.option("--all", "show_all", is_flag=True, help="List every entry, not only what is kept for a reason.")
@click.option("--as-of", help="Apply the policy as of this date (ISO, or epoch seconds) instead of now.")
def store_usage_cmd(config_path: str | None, state_dir: Path | None, days: float | None, show_all: bool,
                    as_of: str | None) -> None:
    """What the store holds, what the retention policy keeps and why, and what `gearfarm store
    prune` would delete."""
    from rich.table import Table

    cfg, _, _, entries = _retention(config_path, state_dir, days, as_of)
    kept = [e for e in entries if not e.expired]
    gone = [e for e in entries if e.expired]
    t = Table(title=f"kept by the retention policy ([retention] days = {cfg.retention.days:g})")
    for col in ("kind", "what", "size", "last used", "why kept"):
        t.add_column(col)
    for e in entries if show_all else [e for e in kept if not e.young]:
        t.add_row(e.kind, e.name[:40], _mib(e.size), time.strftime("%Y-%m-%d", time.gmtime(e.last_used)),
                  "EXPIRED" if e.expired else "; ".join(e.reasons))
    Console(width=200).print(t)
    young = [e for e in kept if e.young]
    valued = [e for e in kept if not e.young]
    click.echo(f"kept for a reason: {len(valued)} entries, {_mib(sum(e.size for e in valued))}; "
               f"younger than {cfg.retention.days:g} days: {len(young)}, {_mib(sum(e.size for e in young))}; "
               f"expired (gearfarm store prune deletes them): {len(gone)}, {_mib(sum(e.size for e in gone))}")


@store_group.command("prune")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--days", type=float, help="Prune what was not used for this many days (default [retention] days).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--as-of", help="Apply the policy as of this date (ISO, or epoch seconds) instead of now.")
def store_prune_cmd(config_path: str | None, state_dir: Path | None, days: float | None, dry_run: bool,
                    as_of: str | None) -> None:
    """Delete the builds, sources and run files the retention policy no longer keeps (see
    `gearfarm store usage`). Run it by hand or daily (docker/systemd/gearfarm-prune.timer)."""
    from gearfarm.run import retention

    _, db, store, entries = _retention(config_path, state_dir, days, as_of)
    gone = [e for e in entries if e.expired]
    for e in gone:
        click.echo(f"{'would prune' if dry_run else 'pruning'} {e.prefix} ({len(e.keys)} objects"
                   f"{f' and {e.local}' if e.local else ''}, {_mib(e.size)}, "
                   f"last used {time.strftime('%Y-%m-%d', time.gmtime(e.last_used))})")
    if dry_run:
        click.echo(f"dry run: {len(gone)} entries, {_mib(sum(e.size for e in gone))} would be deleted")
        return
    try:
        deleted, freed, folders = retention.prune(db, store, entries)
    except (retention.RetentionError, StoreError, OSError) as e:
        _fail(str(e))
    click.echo(f"pruned {len(gone)} entries: {deleted} objects and {folders} run folders on disk, {_mib(freed)} freed; "
               f"{sum(1 for e in entries if not e.expired)} entries kept")


@store_group.command("roles")
@click.option("--config", "config_path",
              help="A config whose [s3] keys are a MinIO admin's (default: $GEARFARM_CONFIG).")
@click.option("--roles", "role_names", default="build,test,perf,collector", show_default=True,
              help="Comma-separated worker roles to make users for.")
@click.option("--targets", "target_names", default=None,
              help="Comma-separated targets the hosts that get these keys serve (default: all): the users "
                   "may write only these targets' artifacts and files. Make one set of users per group of "
                   "hosts that serve the same targets.")
def store_roles_cmd(config_path: str | None, role_names: str, target_names: str | None) -> None:
    """Make each worker role's MinIO user, with a policy that allows only what the role does
    (builds write artifacts, tests and benchmarks their own steps' files, the collector reads
    results) for the targets given, and print the [s3.roles.*] sections for the hosts' configs."""
    import secrets as secrets_mod

    from gearfarm.config import S3Keys
    from gearfarm.s3.keys import ALL_TARGETS, ROLE_WRITES, part
    from gearfarm.s3.minio import MinioError, make_role_users

    cfg = _load_config(config_path)
    if cfg is None:
        _fail(f"store roles needs a config with a MinIO admin's keys in [s3]: pass --config or set "
              f"${config_mod.ENV_VAR}")
    wanted = _csv(role_names) or []
    bad = [r for r in wanted if r not in ROLE_WRITES]
    if bad or not wanted:
        _fail(f"--roles {role_names!r}: give some of {', '.join(ROLE_WRITES)}")
    targets = tuple(_csv(target_names) or ALL_TARGETS)
    try:
        for t in targets:
            if t != "*":
                part(t)
    except ValueError:
        _fail(f"--targets {target_names!r}: a target is a name like linux-x86_64 (letters, digits, '.', '-', '_')")
    roles = {r: S3Keys(access_key=f"gearfarm-{r}-{secrets_mod.token_hex(3)}", secret_key=secrets_mod.token_hex(20))
             for r in wanted}
    try:
        make_role_users(cfg.s3, roles, {r: targets for r in roles})
    except MinioError as e:
        _fail(str(e))
    click.echo("# Put each role's section into the config of the hosts that run that role (and no other)"
               + ("" if targets == ALL_TARGETS else f", for targets {', '.join(targets)}") + ".")
    for r, k in roles.items():
        click.echo(f'[s3.roles.{r}]\naccess_key = "{k.access_key}"\nsecret_key = "{k.secret_key}"\n')


@main.command("status")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--job-servers", is_flag=True,
              help="Only the job servers (a worker host's health check: it has no database to read).")
def status_cmd(config_path: str | None, state_dir: Path | None, job_servers: bool) -> None:
    """gearmand's queues and workers per function, the runs in progress, and the result
    records the ledger rejected (forged, unknown job, malformed)."""
    from rich.table import Table

    from gearfarm.db.results import ResultsDB
    from gearfarm.formats.result import TERMINAL

    cfg = _config_or_embedded(config_path, state_dir)
    # Piped output (cron mail, CI logs) gets a wide table rather than wrapped names.
    out = Console() if sys.stdout.isatty() else Console(width=200)
    answered = []
    for host, port in cfg.gearman.addresses():
        try:
            fns = admin.status(host, port, ssl_context=ssl_context(cfg))
            workers = admin.workers(host, port, ssl_context=ssl_context(cfg))
        except (OSError, GearmanError) as e:
            out.print(f"[red]gearmand {host}:{port} unreachable: {e}[/]")
            continue
        answered.append(f"{host}:{port}")
        t = Table(title=f"gearmand {host}:{port}")
        for col in ("function", "queued", "running", "workers", "worker ids"):
            t.add_column(col)
        for fn in sorted(fns):
            ids = sorted({w.client_id for w in workers if fn in w.functions})
            t.add_row(fn, str(fns[fn].queued), str(fns[fn].running), str(fns[fn].workers), " ".join(ids))
        out.print(t)
    if job_servers:
        if not answered:
            _fail(f"no gearmand answered (tried {', '.join(cfg.gearman.servers)})")
        return
    db = ResultsDB(cfg.database.url)
    t = Table(title="runs")
    for col in ("run", "project", "rev", "state", "done", "expected", "failed"):
        t.add_column(col)
    for run in db.runs(limit=10):
        recs = db.jobs(run.run_id)
        done = sum(1 for r in recs if r.status in TERMINAL)
        failed = sum(1 for r in recs if r.status not in ("passed", "skipped"))
        t.add_row(run.run_id, run.project, run.rev[:12], run.state, str(done), str(len(run.expected)), str(failed))
    out.print(t)
    day = db.delivery_counts(since=time.time() - 86400)
    ever = db.delivery_counts()
    out.print(f"result records rejected: {day.get('rejected', 0)} in the last 24 h, {ever.get('rejected', 0)} in all "
              f"(forged, unsigned, malformed or for a job no run expects; the collector's log names each); "
              f"late: {ever.get('late', 0)}; superseded by a newer attempt: {ever.get('superseded', 0)}",
              highlight=False)
    if not answered:
        _fail(f"no gearmand answered (tried {', '.join(cfg.gearman.servers)}); is the farm running?")


@main.group("farm")
def farm_group() -> None:
    """Manage the embedded farm."""


@farm_group.command("stop")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def farm_stop(state_dir: Path | None) -> None:
    """Stop an embedded farm left running by `nightly --keep`."""
    from gearfarm.run.farm import stop_from_state

    state = (state_dir or Path(os.environ.get("GEARFARM_STATE", _repo_root() / "state"))).resolve()
    stopped = stop_from_state(state)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"no farm running in {state}")


@main.group("web", invoke_without_command=True)
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG, else the embedded farm's.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--listen", help="host:port to serve on (default: [web] listen, 127.0.0.1:8080).")
@click.pass_context
def web_group(ctx: click.Context, config_path: str | None, state_dir: Path | None, listen: str | None) -> None:
    """Serve the dashboard (status, runs, logs, test history, regressions and triage, /api/,
    an Atom feed), from the results database and the artifact store or the copies on disk:
    no farm needs to be running. `gearfarm web user add NAME` makes an account."""
    ctx.obj = (config_path, state_dir)
    if ctx.invoked_subcommand is not None:
        return
    from gearfarm.web import app as web

    cfg = _config_or_embedded(config_path, state_dir)
    where = listen or cfg.web.listen
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        _fail(f"--listen {where!r} is not host:port")
    click.echo(f"gearfarm dashboard on http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        web.serve(cfg, where)
    except OSError as e:
        _fail(f"cannot listen on {where}: {e}; pick another port with --listen or [web] listen")


@web_group.group("user")
def web_user() -> None:
    """Dashboard accounts (needed to triage, cancel and start runs; reading needs none)."""


def _web_db(ctx: click.Context) -> ResultsDB:
    from gearfarm.db.results import ResultsDB

    config_path, state_dir = ctx.obj  # set by `gearfarm web`, inherited by its subcommands
    return ResultsDB(_config_or_embedded(config_path, state_dir).database.url)


@web_user.command("add")
@click.argument("name")
@click.pass_context
def web_user_add(ctx: click.Context, name: str) -> None:
    """Make an account; prints its token once (only its digest is stored)."""
    from gearfarm.db import account

    try:
        token = account.add(_web_db(ctx), name)
    except account.AccountError as e:
        _fail(str(e))
    click.echo(f"account {name}; token (shown once, keep it): {token}")


@web_user.command("remove")
@click.argument("name")
@click.pass_context
def web_user_remove(ctx: click.Context, name: str) -> None:
    from gearfarm.db import account

    try:
        account.remove(_web_db(ctx), name)
    except account.AccountError as e:
        _fail(str(e))
    click.echo(f"account {name} removed")


@web_user.command("list")
@click.pass_context
def web_user_list(ctx: click.Context) -> None:
    from gearfarm.db import account

    for name in account.names(_web_db(ctx)):
        click.echo(name)


@main.command("report")
@click.argument("run_id")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--send", is_flag=True, help="Mail the report again (SMTP as [mail] says).")
def report_cmd(run_id: str, config_path: str | None, state_dir: Path | None, send: bool) -> None:
    """Re-render a run's report from the results database; --send mails it again."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import document as report
    from gearfarm.report import publisher

    cfg = _config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    run = db.get_run(run_id)
    if run is None:
        _fail(f"no run {run_id!r} in {cfg.database.url}; known: {', '.join(r.run_id for r in db.runs(10))}")
    assert run is not None
    if run.parent_run_id:
        _fail(f"{run_id} is the re-run of {run.parent_run_id}; its results are in that run's report")
    # The logs' copies on disk were made when the run was first published; with S3 down they stay.
    store: ArtifactStore | None = ArtifactStore(cfg.s3, retry_for=5)
    try:
        store.check()  # type: ignore[union-attr]
    except StoreError as e:
        console.print(f"[yellow]S3 unavailable; the report links the copies of the logs on disk:[/] {escape(str(e))}",
                      highlight=False)
        store = None
    # The message that went out stays as it was unless it is sent again.
    pub = publisher.publish(cfg, db, store, [run], {run_id: db.jobs(run_id)}, send_mail=send, write_mail=send)
    click.echo(report.render_text(pub.report))
    click.echo(f"report: {pub.paths['html']}")
    if send and not cfg.mail.host:
        click.echo(f"no [mail] host configured; the message is in {pub.delivery.eml if pub.delivery else '-'}")
    elif send and pub.delivery is not None and pub.delivery.error:
        console.print(f"[bold red]mail not sent:[/] {escape(pub.delivery.error)}; the message is in {pub.delivery.eml}",
                      highlight=False)
        sys.exit(EXIT_FARM)
    elif send:
        click.echo(f"mail sent to {', '.join(pub.delivery.recipients if pub.delivery else [])}")


@main.command("history")
@click.argument("test")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", help="Only this target.")
@click.option("--project", help="Only this project.")
def history_cmd(test: str, config_path: str | None, state_dir: Path | None, target: str | None,
                project: str | None) -> None:
    """A test's results across runs and targets, each with its verdict (new, known, fixed,
    flaky). TEST is a test case name, or SUITE/NAME."""
    from rich.table import Table

    from gearfarm.db import history
    from gearfarm.db.results import ResultsDB

    cfg = _config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    rows = [row for row in history.history_of(db, test, project=project) if target is None or row[1] == target]
    if not rows:
        _fail(f"no results for test {test!r}")
    t = Table(title=f"history of {test}")
    for col in ("run", "project", "rev", "target", "suite", "status", "verdict"):
        t.add_column(col)
    for run, tgt, suite, status, verdict in rows:
        t.add_row(run.run_id, run.project, run.rev[:12], tgt, suite, status, verdict)
    Console(width=200).print(t)

@main.command("bisect")
@click.argument("range_", metavar="GOOD..BAD")
@click.option("--test", "test", help="A failing test, as SUITE/NAME.")
@click.option("--benchmark", help="A benchmark that moved (with --metric).")
@click.option("--metric", help="The benchmark's metric that moved.")
@click.option("--target", required=True, help="The target it happened on.")
@click.option("--project", help="The project (default: the config's first).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--builds", type=int, help="Budget: builds made (reused ones are free); default [bisect] builds.")
@click.option("--jobs", "max_jobs", type=int, help="Budget: test or benchmark jobs.")
@click.option("--hours", type=float, help="Budget: wall time.")
@click.option("--confirm", type=int, help="Tests: runs of each end before searching.")
@click.option("--repeat", type=int, help="Tests: runs of each middle revision.")
@click.option("--change", type=float, default=0.05, show_default=True,
              help="Benchmarks: the relative change sought at BAD (0.05 = 5 %, either direction).")
@click.option("--max-pairs", type=int,
              help="Benchmarks: A/B pairs per revision, at most.")
@click.option("--seed", type=int, default=1, show_default=True, help="The {seed} the suite or benchmark runs with.")
def bisect_cmd(range_: str, test: str | None, benchmark: str | None, metric: str | None, target: str,
               project: str | None, config_path: str | None, state_dir: Path | None, builds: int | None,
               max_jobs: int | None, hours: float | None, confirm: int | None, repeat: int | None, change: float,
               max_pairs: int | None, seed: int) -> None:
    """Find the commit in GOOD..BAD that broke TEST, or moved BENCHMARK's METRIC, on TARGET,
    with the farm's own workers (a lab's config, or an embedded farm kept running with
    './nightly.bash --keep'). Exit 0 with a culprit, 1 without one (flaky, no change, budget
    spent, unbuildable), 2 if the farm cannot bisect. Budgets and repetitions not given come
    from the config's [bisect] section."""
    from gearfarm.bisection import driver as bisection
    from gearfarm.bisection import search as bisect
    from gearfarm.db.results import ResultsDB

    good, sep, bad = range_.partition("..")
    if not sep or not good or not bad:
        _fail(f"range {range_!r}: give it as GOOD..BAD (the last good revision, then the first bad one)")
    subject: bisection.Subject
    if test is not None and benchmark is None and metric is None:
        suite, slash, case = test.partition("/")
        if not slash or not suite or not case:
            _fail(f"test {test!r}: give it as SUITE/NAME (for example unit/limits_and_bad_arguments)")
        subject = bisection.TestSubject(suite, case)
    elif test is None and benchmark and metric:
        subject = bisection.PerfSubject(benchmark, metric)
    else:
        _fail("say what to bisect: --test SUITE/NAME, or --benchmark NAME with --metric METRIC")
    cfg = _config_or_embedded(config_path, state_dir)
    b = cfg.bisect
    builds = b.builds if builds is None else builds
    max_jobs = b.jobs if max_jobs is None else max_jobs
    hours = b.hours if hours is None else hours
    confirm = b.confirm if confirm is None else confirm
    repeat = b.repeat if repeat is None else repeat
    max_pairs = b.max_pairs if max_pairs is None else max_pairs
    if min(builds, max_jobs, confirm, repeat, max_pairs) < 1 or hours <= 0 or not 0 < abs(change) < 10:
        _fail("--builds, --jobs, --confirm, --repeat, --max-pairs and --hours must be positive, "
              "--change a relative change such as 0.05")
    try:
        proj = cfg.project(project) if project else cfg.project_list()[0]
    except ConfigError as e:
        _fail(str(e))
    db = ResultsDB(cfg.database.url)
    settings = bisection.Settings(bisect.Budget(builds, max_jobs, hours * 3600), confirm, repeat, seed,
                                  abs(change), max_pairs)
    runner = bisection.Runner(cfg, db, ArtifactStore(cfg.s3, retry_for=60), proj, target, subject, settings,
                              say=lambda m: console.print(m, highlight=False))
    try:
        row = runner.run(good, bad)
    except bisection.BisectionError as e:
        _fail(str(e))
    click.echo(bisection.describe(row))
    _exit_now(EXIT_OK if row.culprit_rev else EXIT_FAILED)


@main.group("perf")
def perf_group() -> None:
    """Performance history: change points and annotations."""


@perf_group.command("changes")
@click.option("--values", help="A plain comma-separated series (oldest first) instead of the database.")
@click.option("--lower-is-better", is_flag=True, help="With --values: the metric is a latency or a size.")
@click.option("--target", default="linux-x86_64", show_default=True)
@click.option("--benchmark", help="Benchmark name (default: every series of the newest run).")
@click.option("--metric", help="Metric name (default: all of the benchmark's).")
@click.option("--project", help="Only this project (default: every project with runs).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_changes(values: str | None, lower_is_better: bool, target: str, benchmark: str | None, metric: str | None,
                 project: str | None, config_path: str | None, state_dir: Path | None) -> None:
    """Change points of performance series, with their size, interval and revisions."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.perf import analysis as perf
    from gearfarm.perf import changepoint

    if values is not None:
        try:
            nums = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            _fail("--values takes numbers separated by commas, e.g. --values 100,101,99,80,81")
        try:
            cps = changepoint.detect(nums, higher_is_better=not lower_is_better)
        except ValueError as e:
            _fail(str(e))
        for c in cps:
            click.echo(f"index {c.index}: {c.direction} {c.change:+.1%} [{c.ci_low:+.1%}, {c.ci_high:+.1%}] "
                       f"p={c.p_value:.2g}")
        if not cps:
            click.echo("no change")
        return
    cfg = _config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    expected = db.expected_changes()
    shown = 0
    for name in [project] if project else db.projects():
        latest = db.runs(limit=1, project=name)
        if not latest:
            continue
        run = latest[0]
        higher = perf.directions(db, run)
        for t, host_class, b, m in db.perf_keys(run.run_id):
            if t != target or (benchmark and b != benchmark) or (metric and m != metric):
                continue
            series, changes, _ = perf.series_changes(db, run, t, host_class, b, m, higher.get((b, m), True),
                                                     expected.get((b, m, t), set()))
            shown += 1
            click.echo(f"{run.project}: {b} {m} on {t} (host class {host_class}, {len(series)} nights): "
                       + ("no change" if not changes else ""))
            for c in changes:
                click.echo(f"  {c.direction} {c.change:+.1%} [{c.ci_low:+.1%}, {c.ci_high:+.1%}] p={c.p_value:.2g} "
                           f"first bad {c.first_bad_rev[:12]} last good {(c.last_good_rev or '?')[:12]}")
    if not shown:
        _fail(f"no performance series for {target} {benchmark or ''} {metric or ''} in the newest runs")


@perf_group.command("expect")
@click.option("--benchmark", required=True)
@click.option("--metric", required=True)
@click.option("--target", required=True)
@click.option("--rev", required=True, help="The change's first bad revision (as reported).")
@click.option("--note", default="", help="Why the change is expected.")
@click.option("--project", help="The project whose repository has REV (default: the first configured).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_expect(benchmark: str, metric: str, target: str, rev: str, note: str, project: str | None,
                config_path: str | None, state_dir: Path | None) -> None:
    """Mark a performance change as expected: it stops being reported."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.run import snapshot

    cfg = _config_or_embedded(config_path, state_dir)
    try:
        proj = cfg.project(project) if project else cfg.project_list()[0]
        full = snapshot.resolve(snapshot.repository(cfg, proj), rev)
    except (ConfigError, snapshot.SourceError) as e:
        _fail(str(e))
    added = ResultsDB(cfg.database.url).annotate(benchmark, metric, target, full, note)
    click.echo(f"{'marked' if added else 'already marked'} as expected: {benchmark} {metric} on {target} at "
               f"{full[:12]}")


if __name__ == "__main__":
    main()
