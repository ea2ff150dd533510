"""`gearfarm nightly`: one night of every project's builds, tests and benchmarks, on a lab's
farm or an embedded one started for it, shown on the terminal as it goes."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from gearfarm import config as config_mod
from gearfarm.cli.common import console, csv, exit_now, fail, farm_state_dir, load_config, repo_root
from gearfarm.config import Config, ConfigError, FarmConfig, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import CatalogError
from gearfarm.formats.exitcode import EXIT_FARM
from gearfarm.formats.words import counted

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from gearfarm.gearman import admin
    from gearfarm.run import nightly


@click.command("nightly")
@click.option("--config", "config_path", help="Lab config (TOML); default: $GEARFARM_CONFIG, else embedded.")
@click.option("--projects", "projects_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Run these [[projects]] (a TOML file, keys as in a lab config) on the embedded farm.")
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
@click.option("--run-id-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write each run's id, project and dashboard link to FILE as it is submitted, one line each, "
                   "tab-separated (e.g. for a Jenkins build's description).")
def nightly_cmd(config_path: str | None, projects_file: Path | None, project_names: str | None, rev: str | None,
                targets: str | None, suites: str | None, benchmarks: str | None, run_id: str | None, seed: int,
                repo: Path | None,
                state_dir: Path | None, keep: bool, slots: int | None, no_worker_wait: float | None,
                deadline: float | None, report_dir: Path | None, run_id_file: Path | None) -> None:
    """Run a whole nightly: every project's build on every target, tests, collect, one report."""
    from gearfarm.run import nightly

    if run_id_file is not None:
        # Emptied first: a CI workspace's file from an earlier night never names tonight's runs.
        try:
            run_id_file.write_text("")
        except OSError as e:
            fail(f"cannot write the run id file {run_id_file}: {e}")

    # cron and CI stop jobs with SIGTERM: unwind so the embedded farm is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_FARM))
    cfg = load_config(config_path)
    if cfg is not None and projects_file is not None:
        given = "--config" if config_path else "$GEARFARM_CONFIG"
        fail(f"--projects runs its projects on the embedded farm, but {given} names a lab ({cfg.source}): put "
             "the projects in that config's [[projects]], or unset it")
    settings = None
    if projects_file is not None:
        try:
            settings = config_mod.load_projects(projects_file)
        except ConfigError as e:
            fail(str(e))
    if cfg is not None and slots is not None:
        fail("--slots sets the embedded farm's worker slots; with --config, each lab host has as many slots as "
             "worker processes it runs (docs/lab.md)")
    default_repo = (repo or (cfg.path(cfg.farm.repo) if cfg else None) or repo_root()).resolve()
    # Before the embedded farm exists, its config is only where projects and paths come from.
    # (with the projects file's [farm]: the catalogs are checked against its max_timeout)
    base = cfg or Config(farm=FarmConfig(repo=str(default_repo),
                                         state_dir=str(farm_state_dir(state_dir, default_repo)),
                                         **(settings.farm.model_dump(exclude={"slots"}) if settings else {})),
                         projects=settings.projects if settings else [])
    if repo is not None and not base.projects:
        base.farm.repo = str(default_repo)
    try:
        projects = _select_projects(base, project_names)
        if len(projects) > 1 and (rev or run_id):
            raise nightly.RunError(f"--rev and --run-id name one project's run: add --project (configured: "
                                   f"{', '.join(p.name for p in projects)})")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        loaded, not_run = _load(base, projects, rev, lambda name, r: run_id or f"{stamp}-{name}-{_id_part(r)}")
        # Checked now, before anything starts; planned once the sources are in S3.
        todo: list[tuple[nightly.Loaded, str, nightly.Selection]] = []
        wanted = csv(targets)
        for lp in loaded:
            # --targets, else the project's own [[projects]] targets, else all of its catalog's.
            narrowed = [_narrow(lp.catalog, kind, names, len(loaded) > 1)
                        for kind, names in (("targets", lp.targets if wanted is None else wanted),
                                            ("suites", csv(suites)), ("benchmarks", csv(benchmarks)))]
            sel = nightly.select(lp.catalog, *narrowed)
            if sel.targets:
                todo.append((lp, run_id or f"{stamp}-{lp.name}-{lp.rev[:12]}", sel))
            else:
                console.print(f"[yellow]project {lp.name}: none of --targets {targets} is in its catalog; "
                              "not built tonight[/]", highlight=False)
        if loaded:
            _check_known(loaded, csv(targets), csv(suites), csv(benchmarks))
        if not todo and not not_run:
            raise nightly.RunError("no project has anything to build with these --targets")
    except (CatalogError, nightly.RunError, ConfigError, ValueError) as e:
        fail(str(e))
    farm = None
    if cfg is None:
        from gearfarm.hosts.gearmand import GearmandError
        from gearfarm.run.farm import EmbeddedFarm, FarmError
        from gearfarm.s3.minio import MinioError

        state = farm_state_dir(state_dir, default_repo)
        farm = EmbeddedFarm(state, default_repo, slots=slots or 0, projects=base.projects,
                            settings=settings.farm if settings else None)
        console.print(f"starting the embedded farm in {state} …")
        try:
            cfg = farm.start([lp.catalog for lp, _, _ in todo], sorted({t for _, _, sel in todo for t in sel.targets}),
                             perf=any(any(sel.benchmarks.values()) for _, _, sel in todo))
        except (GearmandError, MinioError, FarmError, OSError) as e:
            farm.stop()
            fail(f"the embedded farm could not start: {e}")
        for role, missing in farm.missing.items():
            for t, why in missing.items():
                console.print(f"[yellow]no {role} worker for {t}:[/] {escape(why)}")
    assert cfg is not None
    if no_worker_wait is not None:
        cfg.farm.no_worker_wait = no_worker_wait
    if deadline is not None:
        cfg.farm.run_deadline = deadline
    try:
        code = _run_nightly(cfg, todo, seed, report_dir, run_id_file, not_run)
    finally:
        if farm is not None and not keep:
            farm.stop()
        elif farm is not None:
            farm.detach()
            console.print(f"farm left running (config {farm.config_path}); stop it with: gearfarm farm stop")
    exit_now(code)



def _load(cfg: Config, projects: list[ProjectConfig], rev: str | None, run_id: Callable[[str, str], str]
          ) -> tuple[list[nightly.Loaded], list[tuple[nightly.ProjectError, str]]]:
    """Each project at tonight's revision, and those that cannot be loaded (their revision, their
    catalog), each with its run's id (``run_id(project, rev)``): such a project fails its own
    night only (its run is recorded as failed and reported), and every other project runs."""
    from gearfarm.run import nightly

    loaded, not_run = [], []
    for p in projects:
        try:
            loaded.append(nightly.load_project(cfg, p, rev))
        except nightly.ProjectError as e:
            console.print(f"[bold red]project {escape(p.name)} does not run tonight:[/] {escape(str(e))}",
                          highlight=False)
            not_run.append((e, run_id(p.name, e.rev)))
    return loaded, not_run


def _select_projects(cfg: Config, names: str | None) -> list[ProjectConfig]:
    wanted = csv(names)
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

    def __init__(self, run_id_file: Path | None = None, web_url: str | None = None) -> None:
        self.live: Live | None = None
        self.last: dict[str, str] = {}
        # Run id -> its job ids in the plan's order, made once: the plan's jobs were made and
        # printed afresh at every poll, jobs (or targets × jobs, on a terminal) each 0.2 s.
        self.order: dict[str, dict[str, int]] = {}
        self.run_id_file, self.web_url = run_id_file, web_url

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
                 f"{plan.project}, rev {plan.rev[:12]}, {counted(len(plan.targets), 'target')}, "
                 f"{counted(len(plan.expected), 'job')}")
        if self.run_id_file is not None:
            from gearfarm.report.links import DashboardLinks

            link = DashboardLinks(self.web_url).run(plan.run_id) if self.web_url else ""
            with self.run_id_file.open("a") as f:
                f.write(f"{plan.run_id}\t{plan.project}\t{link}\n")

    def progress(self, plan: nightly.Plan, states: dict[str, str], functions: dict[str, admin.FunctionStatus]) -> None:
        if console.is_terminal:
            from rich.live import Live

            if self.live is None:
                self.live = Live(console=console, refresh_per_second=2)
                self.live.start()
            self.live.update(_table(plan, self._order(plan), states, functions))
            return
        order = self._order(plan)
        changed = [j for j, st in states.items() if st and st != self.last.get(j)]
        for j in sorted(changed, key=lambda j: order.get(j, len(order))):
            # The project first: a night of several projects has each one's linux-x86_64:build.
            console.print(f"  {plan.project + ': ' + j[len(plan.run_id) + 1:]:<48} {states[j]}", highlight=False)
        self.last.update(states)

    def _order(self, plan: nightly.Plan) -> dict[str, int]:
        got = self.order.get(plan.run_id)
        if got is None:
            got = self.order[plan.run_id] = {str(j): i for i, j in enumerate(plan.expected)}
        return got

    def waited(self, plan: nightly.Plan, records: list) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _table(plan: nightly.Plan, order: dict[str, int], states: dict[str, str],
           fns: dict[str, admin.FunctionStatus]) -> Table:
    from rich.table import Table

    from gearfarm.formats.result import TERMINAL

    by_target: dict[str, list[str]] = {t: [] for t in plan.targets}
    for j in order:  # run:target:step
        by_target.setdefault(j.split(":")[1], []).append(states.get(j, ""))

    t = Table(title=f"run {plan.run_id} ({plan.project})")
    t.add_column("target")
    for col in ("queued", "running", "passed", "failed", "other"):
        t.add_column(col)
    for target in plan.targets:
        st = by_target[target]
        running = sum(fns[f].running for f in fns if f.endswith(":" + target))
        queued = sum(1 for s in st if s not in TERMINAL) - running
        t.add_row(target, str(max(queued, 0)), str(running), str(st.count("passed")),
                  str(st.count("failed") + st.count("timed_out")),
                  str(sum(1 for s in st if s in ("skipped", "no_worker", "infra"))))
    return t


def _id_part(rev: str) -> str:
    """A revision as a part of a run id: its first 12 characters, or "unresolved" for a name
    that resolved to no commit (any character a branch name may have made safe)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", rev[:12]) or "unresolved"


def _run_nightly(cfg: Config, todo: list[tuple[nightly.Loaded, str, nightly.Selection]], seed: int,
                 report_dir: Path | None = None, run_id_file: Path | None = None,
                 not_run: list[tuple[nightly.ProjectError, str]] | None = None) -> int:
    from gearfarm.night.sequence import NightError, NotRun, Project, run_night

    observer = _ConsoleObserver(run_id_file, cfg.web.url)
    failed = [NotRun(e.project, e.rev, rid, str(e), e.farm) for e, rid in not_run or []]
    try:
        return run_night(cfg, [Project(lp, rid, sel) for lp, rid, sel in todo], seed, observer, report_dir, failed)
    except NightError as e:
        observer.close()  # the live table stops before the error is printed under it
        fail(str(e))
    finally:
        observer.close()

