"""The `gearfarm` command: the group, its options and logging; each command group lives in its
own module beside this one (nightly_cmd, worker_cmd, project_cmd, keys_cmd, artifact_cmd,
store_cmd, tls_cmd, status_cmd, web_cmd, report_cmd, bisect_cmd, perf_cmd)."""

from __future__ import annotations

import logging

import click

from gearfarm.cli import (
    artifact_cmd,
    bisect_cmd,
    keys_cmd,
    nightly_cmd,
    perf_cmd,
    project_cmd,
    report_cmd,
    status_cmd,
    store_cmd,
    tls_cmd,
    web_cmd,
    worker_cmd,
)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """--version: the installed distribution's version (pyproject.toml's, the one source)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata

    try:
        version = metadata.version("gearfarm")
    except metadata.PackageNotFoundError:
        version = "unknown (the gearfarm package is not installed: pip install .)"
    click.echo(f"gearfarm {version}")
    ctx.exit()


class _Main(click.Group):
    """The command group, which turns a farm service that did not answer the command's own work
    (the results database, when it is opened deep inside a command) into its one-line message."""

    def invoke(self, ctx: click.Context) -> object:
        from gearfarm.cli.common import fail
        from gearfarm.db import DatabaseUnavailable

        try:
            return super().invoke(ctx)
        except DatabaseUnavailable as e:
            fail(str(e))


@click.group(cls=_Main)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print the installed gearfarm's version and exit.")
@click.option("-v", "--verbose", is_flag=True,
              help="Log more: gearfarm's debug messages, and the libraries' (boto3, SQLAlchemy, alembic, waitress, "
                   "...) information messages, which are otherwise not shown.")
def main(verbose: bool) -> None:
    """gearfarm: nightly builds, tests and benchmarks on Gearman."""
    _logging(verbose)


def _logging(verbose: bool) -> None:
    """Logging for every command: gearfarm's own messages from INFO up (a worker's and the
    nightly's log); the libraries' only from WARNING up unless --verbose, so a command that
    succeeds says nothing it was not asked (alembic's "Context impl SQLiteImpl" at every open
    of the database, waitress's "Serving on", matplotlib's font cache: cron mailed them)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The libraries' DEBUG (botocore logs every request's headers) stays out even then.
    logging.getLogger("gearfarm").setLevel(logging.DEBUG if verbose else logging.INFO)


for command in (nightly_cmd.nightly_cmd, worker_cmd.worker_cmd, worker_cmd.collector_cmd, project_cmd.project_group,
                keys_cmd.keys_group, artifact_cmd.artifact_group, store_cmd.store_group, tls_cmd.tls_group,
                status_cmd.status_cmd, status_cmd.farm_group, web_cmd.web_group, report_cmd.report_cmd,
                report_cmd.history_cmd, bisect_cmd.bisect_cmd, perf_cmd.perf_group):
    main.add_command(command)


if __name__ == "__main__":
    main()
