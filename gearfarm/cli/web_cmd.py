"""`gearfarm web`: the dashboard, and its accounts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from gearfarm.cli.common import config_or_embedded, fail

if TYPE_CHECKING:
    from gearfarm.db.results import ResultsDB


@click.group("web", invoke_without_command=True)
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG, else the embedded farm's.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--listen", help="host:port to serve on (default: [web] listen, 127.0.0.1:8631).")
@click.pass_context
def web_group(ctx: click.Context, config_path: str | None, state_dir: Path | None, listen: str | None) -> None:
    """Serve the dashboard (status, runs, logs, test history, regressions and triage, /api/,
    an Atom feed), from the results database and the artifact store or the copies on disk:
    no farm needs to be running. `gearfarm web user add NAME` makes an account."""
    ctx.obj = (config_path, state_dir)
    if ctx.invoked_subcommand is not None:
        return
    try:
        from gearfarm.web import app as web
    except ModuleNotFoundError as e:
        # A plain `pip install gearfarm` has no web framework: the dashboard is an extra.
        fail(f"the dashboard needs {e.name}, which this install lacks: pip install 'gearfarm[dashboard]' "
             "(in a checkout: make setup-dashboard)")

    cfg = config_or_embedded(config_path, state_dir)
    where = listen or cfg.web.listen
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        fail(f"--listen {where!r} is not host:port")
    click.echo(f"gearfarm dashboard on http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        web.serve(cfg, where)
    except OSError as e:
        fail(f"cannot listen on {where}: {e}; pick another port with --listen or [web] listen")


@web_group.group("user")
def web_user() -> None:
    """Dashboard accounts (needed to triage, cancel and start runs; reading needs none)."""


def _web_db(ctx: click.Context) -> ResultsDB:
    from gearfarm.db.results import ResultsDB

    config_path, state_dir = ctx.obj  # set by `gearfarm web`, inherited by its subcommands
    return ResultsDB(config_or_embedded(config_path, state_dir).database.url)


@web_user.command("add")
@click.argument("name")
@click.pass_context
def web_user_add(ctx: click.Context, name: str) -> None:
    """Make an account; prints its token once (only its digest is stored)."""
    from gearfarm.db import account

    try:
        token = account.add(_web_db(ctx), name)
    except account.AccountError as e:
        fail(str(e))
    click.echo(f"account {name}; token (shown once, keep it): {token}")


@web_user.command("remove")
@click.argument("name")
@click.pass_context
def web_user_remove(ctx: click.Context, name: str) -> None:
    from gearfarm.db import account

    try:
        account.remove(_web_db(ctx), name)
    except account.AccountError as e:
        fail(str(e))
    click.echo(f"account {name} removed")


@web_user.command("list")
@click.pass_context
def web_user_list(ctx: click.Context) -> None:
    from gearfarm.db import account

    for name in account.names(_web_db(ctx)):
        click.echo(name)
