"""`gearfarm status` (job servers, runs, rejected records) and `gearfarm farm stop` (the
embedded farm)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.console import Console

from gearfarm.cli.common import config_or_embedded, fail, farm_state_dir, need_farm
from gearfarm.gearman import GearmanError, admin
from gearfarm.hosts.connection import ssl_context


@click.command("status")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--job-servers", is_flag=True,
              help="Only the job servers (a worker host's health check: it has no database to read).")
def status_cmd(config_path: str | None, state_dir: Path | None, job_servers: bool) -> None:
    """gearmand's queues and workers per function, the runs in progress, and the result
    records the ledger rejected (forged, unknown job, malformed)."""
    cfg = config_or_embedded(config_path, state_dir)
    # A stopped farm: one message saying so and how to start it, before any table.
    need_farm(cfg, "gearmand")
    from rich.table import Table

    from gearfarm.db.results import ResultsDB
    from gearfarm.formats.result import TERMINAL

    # Piped output (cron mail, CI logs) gets a wide table rather than wrapped names.
    out = Console() if sys.stdout.isatty() else Console(width=200)
    tables, errors = [], []
    for host, port in cfg.gearman.addresses():
        try:
            fns = admin.status(host, port, ssl_context=ssl_context(cfg))
            workers = admin.workers(host, port, ssl_context=ssl_context(cfg))
        except (OSError, GearmanError) as e:
            errors.append(f"gearmand {host}:{port} unreachable: {e}")
            continue
        t = Table(title=f"gearmand {host}:{port}")
        for col in ("function", "queued", "running", "workers", "worker ids"):
            t.add_column(col)
        for fn in sorted(fns):
            ids = sorted({w.client_id for w in workers if fn in w.functions})
            t.add_row(fn, str(fns[fn].queued), str(fns[fn].running), str(fns[fn].workers), " ".join(ids))
        tables.append(t)
    if not tables:  # something accepts connections there, but no gearmand answers through it
        fail("no gearmand answered: " + "; ".join(errors))
    for line in errors:  # the others answered: these are part of the status
        out.print(f"[red]{line}[/]", highlight=False)
    for t in tables:
        out.print(t)
    if job_servers:
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


@click.group("farm")
def farm_group() -> None:
    """Manage the embedded farm."""


@farm_group.command("stop")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def farm_stop(state_dir: Path | None) -> None:
    """Stop an embedded farm left running by `nightly --keep`."""
    from gearfarm.run.farm import stop_from_state

    state = farm_state_dir(state_dir)
    stopped = stop_from_state(state)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"no farm running in {state}")
