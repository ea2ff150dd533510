"""The `gearfarm` command: nightly, worker, collector, status, report, history, farm stop."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from gearfarm import catalog as catalog_mod
from gearfarm import config as config_mod
from gearfarm import nightly, publisher, report
from gearfarm.catalog import CatalogError
from gearfarm.config import Config, ConfigError
from gearfarm.connection import gearman_client, ssl_context
from gearfarm.gearman import Client, GearmanError, admin
from gearfarm.ledger import Ledger
from gearfarm.result import TERMINAL
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.store import ResultsDB, Run

console = Console(stderr=True, soft_wrap=True)
EXIT_OK, EXIT_FAILED, EXIT_FARM = 0, 1, 2


def _fail(msg: str) -> NoReturn:
    console.print(f"[bold red]error:[/] {msg}", highlight=False)
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
@click.option("--rev", default="HEAD", show_default=True, help="Engine revision to build.")
@click.option("--targets", help="Comma-separated targets (default: all in the catalog).")
@click.option("--suites", help="Comma-separated suites (default: each target's list; 'none' for build only).")
@click.option("--benchmarks", help="Comma-separated benchmarks for perf targets (default: all; 'none').")
@click.option("--run-id", help="Run id (default: time and revision). Resubmitting an id adds nothing.")
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), help="Engine repository.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Embedded farm state (default: $GEARFARM_STATE or <repo>/state).")
@click.option("--keep", is_flag=True, help="Leave the embedded farm running (stop: gearfarm farm stop).")
@click.option("--no-worker-wait", type=float, help="Seconds before a job with no worker is recorded so.")
@click.option("--deadline", type=float, help="Seconds by which the run must end.")
def nightly_cmd(config_path: str | None, rev: str, targets: str | None, suites: str | None, benchmarks: str | None,
                run_id: str | None, seed: int, repo: Path | None, state_dir: Path | None, keep: bool,
                no_worker_wait: float | None, deadline: float | None) -> None:
    """Run a whole nightly: build every target, test, collect, report."""
    # cron and CI stop jobs with SIGTERM: unwind so the embedded farm is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_FARM))
    cfg = _load_config(config_path)
    repo = (repo or (cfg.path(cfg.farm.repo) if cfg else None) or _repo_root()).resolve()
    try:
        full_rev = nightly.resolve_rev(repo, rev)
        cat = catalog_mod.load_at_rev(repo, full_rev)
        run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{full_rev[:12]}"
        plan = nightly.plan(cat, run_id, full_rev, _csv(targets), _csv(suites), _csv(benchmarks), seed)
    except (CatalogError, nightly.RunError, ValueError) as e:
        _fail(str(e))
    farm = None
    if cfg is None:
        from gearfarm.farm import EmbeddedFarm, FarmError
        from gearfarm.gearmand import GearmandError
        from gearfarm.s3.minio import MinioError

        state = (state_dir or Path(os.environ.get("GEARFARM_STATE", repo / "state"))).resolve()
        farm = EmbeddedFarm(state, repo)
        console.print(f"starting the embedded farm in {state} …")
        try:
            cfg = farm.start(cat, plan.targets, perf=any(plan.benchmarks.values()))
        except (GearmandError, MinioError, FarmError, OSError) as e:
            farm.stop()
            _fail(f"the embedded farm could not start: {e}")
        for role, missing in farm.missing.items():
            for t, why in missing.items():
                console.print(f"[yellow]no {role} worker for {t}:[/] {why}")
    assert cfg is not None
    if no_worker_wait is not None:
        cfg.farm.no_worker_wait = no_worker_wait
    if deadline is not None:
        cfg.farm.run_deadline = deadline
    try:
        code = _run_nightly(cfg, plan)
    finally:
        if farm is not None and not keep:
            farm.stop()
        elif farm is not None:
            console.print(f"farm left running (config {farm.config_path}); stop it with: gearfarm farm stop")
    sys.exit(code)


def _run_nightly(cfg: Config, plan: nightly.Plan) -> int:
    db = ResultsDB(cfg.database.url)
    ledger = Ledger(db)
    store = ArtifactStore(cfg.s3, retry_for=60)
    try:
        store.check()
        table = nightly.preflight(cfg)
    except (StoreError, nightly.RunError) as e:
        _fail(str(e))
    for t in plan.targets:
        fn = f"build:{t}"
        if table.get(fn) is None or table[fn].workers == 0:
            console.print(f"[yellow]preflight: no worker registered for {fn}; its jobs are recorded as "
                          f"'no worker' after {cfg.farm.no_worker_wait:.0f}s[/]")
    with gearman_client(cfg) as client:
        try:
            created = nightly.submit(cfg, db, client, plan)
        except GearmanError as e:
            _fail(f"cannot submit to gearmand: {e}")
        console.print(f"run {plan.run_id} {'submitted' if created else 'already known; resubmitted'}: "
                      f"rev {plan.rev[:12]}, {len(plan.targets)} targets, {len(plan.expected)} jobs")
        try:
            records = _watch(cfg, db, ledger, store, client, plan)
            # New failures are re-run once before the report, so it can tell flaky from broken.
            nightly.rerun_new_failures(cfg, db, ledger, store, client, plan, records,
                                       say=lambda m: console.print(m, highlight=False))
        except nightly.RunError as e:
            _fail(str(e))
    problems: list[str] = []
    try:
        # Closed first, then read: the report holds everything applied before the close, and
        # anything after it is recorded as late.
        nightly.close(ledger, store, plan.run_id)
        db.finish_run(plan.run_id, "finished")
        records = db.jobs(plan.run_id)
        run = db.get_run(plan.run_id)
        assert run is not None
    except SQLAlchemyError as e:
        problems.append(f"results database unavailable at the end of the run ({str(e).splitlines()[0]}): the run "
                        "is not closed; the report is made from the results seen while waiting")
        run = Run(run_id=plan.run_id, rev=plan.rev, created_at=plan.deadline - cfg.farm.run_deadline,
                  finished_at=time.time(), expected=[str(j) for j in plan.expected], targets=plan.targets,
                  state="finished", notes={"seed": plan.seed}, parent_run_id=None)
    pub = publisher.publish(cfg, db, store, run, records)
    problems = problems + pub.problems
    click.echo(report.render_text(pub.report))
    click.echo(f"report: {pub.paths['html']}")
    if pub.delivery is not None and not pub.delivery.error:
        d = pub.delivery
        click.echo(f"mail: {'sent to ' + ', '.join(d.recipients) if d.sent else d.eml}")
    for p in problems:
        console.print(f"[bold red]farm problem:[/] {p}", highlight=False)
    bad = [r for r in records if r.status not in ("passed", "skipped")]
    if problems:
        return EXIT_FARM
    return EXIT_FAILED if bad or pub.report["missing"] else EXIT_OK


def _watch(cfg: Config, db: ResultsDB, ledger: Ledger, store: ArtifactStore, client: Client,
           plan: nightly.Plan) -> list:
    def table_of(states: dict[str, str], fns: dict[str, admin.FunctionStatus]) -> Table:
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

    if console.is_terminal:
        with Live(console=console, refresh_per_second=2) as live:
            return nightly.wait(cfg, db, ledger, store, client, plan, lambda s, f: live.update(table_of(s, f)))
    last: dict[str, str] = {}

    def lines(states: dict[str, str], _fns: dict[str, admin.FunctionStatus]) -> None:
        for j in map(str, plan.expected):
            if states.get(j) and states.get(j) != last.get(j):
                console.print(f"  {j[len(plan.run_id) + 1:]:<40} {states[j]}", highlight=False)
        last.update(states)

    return nightly.wait(cfg, db, ledger, store, client, plan, lines)


@main.command("worker")
@click.option("--role", type=click.Choice(["build", "test", "perf", "collector"]), required=True)
@click.option("--targets", help="Comma-separated targets to serve (default: all this host can serve).")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def worker_cmd(role: str, targets: str | None, config_path: str | None) -> None:
    """Run a worker: registers exactly the functions this host can serve."""
    cfg = _load_config(config_path)
    if cfg is None:
        _fail(f"a worker needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    if role == "collector":
        from gearfarm.workers import collector

        collector.serve(cfg)
        return
    from gearfarm import probe
    from gearfarm.job import function_name
    from gearfarm.workers import base, build, perf, test

    repo = cfg.path(cfg.farm.repo)
    try:
        cat = catalog_mod.load_at_rev(repo, "HEAD")
        wanted = _csv(targets)
        for t in wanted or []:
            cat.target(t)
    except CatalogError as e:
        _fail(str(e))
    ok, missing = probe.servable(cat, role, wanted)
    if wanted and missing:
        _fail("; ".join(f"this host cannot serve {role} for {t}: {why}" for t, why in missing.items()))
    if not ok:
        _fail(f"this host can serve no target for role {role}: " + "; ".join(f"{t}: {w}" for t, w in missing.items()))
    handler = {"build": build.handle, "test": test.handle, "perf": perf.handle}[role]
    base.serve(cfg, role, {function_name(role, t): handler for t in ok})  # type: ignore[arg-type]


@main.command("collector")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def collector_cmd(config_path: str | None) -> None:
    """Run the collector: stores every result record in the results database."""
    cfg = _load_config(config_path)
    if cfg is None:
        _fail(f"the collector needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    from gearfarm.workers import collector

    collector.serve(cfg)


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


@main.command("status")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def status_cmd(config_path: str | None, state_dir: Path | None) -> None:
    """gearmand's queues and workers per function, the runs in progress, and the result
    records the ledger rejected (forged, unknown job, malformed)."""
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
    db = ResultsDB(cfg.database.url)
    t = Table(title="runs")
    for col in ("run", "rev", "state", "done", "expected", "failed"):
        t.add_column(col)
    for run in db.runs(limit=10):
        recs = db.jobs(run.run_id)
        done = sum(1 for r in recs if r.status in TERMINAL)
        failed = sum(1 for r in recs if r.status not in ("passed", "skipped"))
        t.add_row(run.run_id, run.rev[:12], run.state, str(done), str(len(run.expected)), str(failed))
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
    from gearfarm.farm import stop_from_state

    state = (state_dir or Path(os.environ.get("GEARFARM_STATE", _repo_root() / "state"))).resolve()
    stopped = stop_from_state(state)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"no farm running in {state}")


@main.command("report")
@click.argument("run_id")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--send", is_flag=True, help="Mail the report again (SMTP as [mail] says).")
def report_cmd(run_id: str, config_path: str | None, state_dir: Path | None, send: bool) -> None:
    """Re-render a run's report from the results database; --send mails it again."""
    cfg = _config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    run = db.get_run(run_id)
    if run is None:
        _fail(f"no run {run_id!r} in {cfg.database.url}; known: {', '.join(r.run_id for r in db.runs(10))}")
    assert run is not None
    if run.parent_run_id:
        _fail(f"{run_id} is the re-run of {run.parent_run_id}; its results are in that run's report")
    # Links need S3; a report re-rendered while S3 is down is still a report, without them.
    store: ArtifactStore | None = ArtifactStore(cfg.s3, retry_for=5)
    try:
        store.check()  # type: ignore[union-attr]
    except StoreError as e:
        console.print(f"[yellow]S3 unavailable, the report has no links:[/] {e}", highlight=False)
        store = None
    # The message that went out stays as it was unless it is sent again.
    pub = publisher.publish(cfg, db, store, run, db.jobs(run_id), send_mail=send, write_mail=send)
    click.echo(report.render_text(pub.report))
    click.echo(f"report: {pub.paths['html']}")
    if send and not cfg.mail.host:
        click.echo(f"no [mail] host configured; the message is in {pub.delivery.eml if pub.delivery else '-'}")
    elif send and pub.delivery is not None and pub.delivery.error:
        console.print(f"[bold red]mail not sent:[/] {pub.delivery.error}; the message is in {pub.delivery.eml}",
                      highlight=False)
        sys.exit(EXIT_FARM)
    elif send:
        click.echo(f"mail sent to {', '.join(pub.delivery.recipients if pub.delivery else [])}")


@main.command("history")
@click.argument("test")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", help="Only this target.")
def history_cmd(test: str, config_path: str | None, state_dir: Path | None, target: str | None) -> None:
    """A test's results across runs and targets, each with its verdict (new, known, fixed,
    flaky). TEST is a test case name, or SUITE/NAME."""
    from gearfarm import history

    cfg = _config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    rows = [row for row in history.history_of(db, test) if target is None or row[1] == target]
    if not rows:
        _fail(f"no results for test {test!r}")
    t = Table(title=f"history of {test}")
    for col in ("run", "rev", "target", "suite", "status", "verdict"):
        t.add_column(col)
    for run, tgt, suite, status, verdict in rows:
        t.add_row(run.run_id, run.rev[:12], tgt, suite, status, verdict)
    Console(width=200).print(t)

@main.group("perf")
def perf_group() -> None:
    """Performance history: change points and annotations."""


@perf_group.command("changes")
@click.option("--values", help="A plain comma-separated series (oldest first) instead of the database.")
@click.option("--lower-is-better", is_flag=True, help="With --values: the metric is a latency or a size.")
@click.option("--target", default="linux-x86_64", show_default=True)
@click.option("--benchmark", help="Benchmark name (default: every series of the newest run).")
@click.option("--metric", help="Metric name (default: all of the benchmark's).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_changes(values: str | None, lower_is_better: bool, target: str, benchmark: str | None, metric: str | None,
                 config_path: str | None, state_dir: Path | None) -> None:
    """Change points of performance series, with their size, interval and revisions."""
    from gearfarm import changepoint, perf

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
    runs = [r for r in db.runs(limit=1) if r.parent_run_id is None]
    if not runs:
        _fail(f"no runs in {cfg.database.url}")
    run = runs[0]
    higher = perf.directions(cfg.path(cfg.farm.repo), run.rev)
    expected = db.expected_changes()
    shown = 0
    for t, host_class, b, m in db.perf_keys(run.run_id):
        if t != target or (benchmark and b != benchmark) or (metric and m != metric):
            continue
        series, changes, _ = perf.series_changes(db, run, t, host_class, b, m, higher.get((b, m), True),
                                                 expected.get((b, m, t), set()))
        shown += 1
        click.echo(f"{b} {m} on {t} (host class {host_class}, {len(series)} nights): "
                   + ("no change" if not changes else ""))
        for c in changes:
            click.echo(f"  {c.direction} {c.change:+.1%} [{c.ci_low:+.1%}, {c.ci_high:+.1%}] p={c.p_value:.2g} "
                       f"first bad {c.first_bad_rev[:12]} last good {(c.last_good_rev or '?')[:12]}")
    if not shown:
        _fail(f"no performance series for {target} {benchmark or ''} {metric or ''} in run {run.run_id}")


@perf_group.command("expect")
@click.option("--benchmark", required=True)
@click.option("--metric", required=True)
@click.option("--target", required=True)
@click.option("--rev", required=True, help="The change's first bad revision (as reported).")
@click.option("--note", default="", help="Why the change is expected.")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_expect(benchmark: str, metric: str, target: str, rev: str, note: str, config_path: str | None,
                state_dir: Path | None) -> None:
    """Mark a performance change as expected: it stops being reported."""
    cfg = _config_or_embedded(config_path, state_dir)
    try:
        full = nightly.resolve_rev(cfg.path(cfg.farm.repo), rev)
    except nightly.RunError as e:
        _fail(str(e))
    added = ResultsDB(cfg.database.url).annotate(benchmark, metric, target, full, note)
    click.echo(f"{'marked' if added else 'already marked'} as expected: {benchmark} {metric} on {target} at "
               f"{full[:12]}")


if __name__ == "__main__":
    main()
