"""`gearfarm report` (a run's report again, mailed again on request) and `gearfarm history` (a
test across runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from gearfarm.cli.common import config_or_embedded, console, fail
from gearfarm.formats.exitcode import EXIT_FARM


@click.command("report")
@click.argument("run_id")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--send", is_flag=True, help="Mail the report again (SMTP as [mail] says).")
def report_cmd(run_id: str, config_path: str | None, state_dir: Path | None, send: bool) -> None:
    """Re-render a run's report from the results database; --send mails it again."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import document as report
    from gearfarm.report import publisher

    cfg = config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    run = db.get_run(run_id)
    if run is None:
        fail(f"no run {run_id!r} in {cfg.database.url}; known: {', '.join(r.run_id for r in db.runs(10))}")
    assert run is not None
    if run.parent_run_id:
        fail(f"{run_id} is the re-run of {run.parent_run_id}; its results are in that run's report")
    # The logs' copies on disk were made when the run was first published: with S3 down (a
    # stopped embedded farm) the report is made from the database and links those, and says so
    # in one line rather than waiting for S3.
    from gearfarm.hosts import reach
    from gearfarm.s3.store import ArtifactStore, StoreError

    store: ArtifactStore | None = None
    down: reach.Down | StoreError | None = reach.check(cfg, (reach.S3,))
    if down is None:
        store = ArtifactStore(cfg.s3, retry_for=5)
        try:
            store.check()
        except StoreError as e:
            down, store = e, None
    if down is not None:
        console.print(f"[yellow]the report links the logs' copies on disk:[/] {escape(str(down))}", highlight=False)
    # The message that went out stays as it was unless it is sent again.
    pub = publisher.publish(cfg, db, store, [run], {run_id: db.jobs(run_id, cases=False)}, send_mail=send,
                            write_mail=send)
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


@click.command("history")
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

    cfg = config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    rows = [row for row in history.history_of(db, test, project=project) if target is None or row[1] == target]
    if not rows:
        fail(f"no results for test {test!r}")
    t = Table(title=f"history of {test}")
    for col in ("run", "project", "rev", "target", "suite", "status", "verdict"):
        t.add_column(col)
    for run, tgt, suite, status, verdict in rows:
        t.add_row(run.run_id, run.project, run.rev[:12], tgt, suite, status, verdict)
    Console(width=200).print(t)
