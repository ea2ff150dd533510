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


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at debug level.")
def main(verbose: bool) -> None:
    """gearfarm: nightly builds, tests and benchmarks on Gearman."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # alembic says "Context impl SQLiteImpl" at every open of the database: noise in cron mail.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


for command in (nightly_cmd.nightly_cmd, worker_cmd.worker_cmd, worker_cmd.collector_cmd, project_cmd.project_group,
                keys_cmd.keys_group, artifact_cmd.artifact_group, store_cmd.store_group, tls_cmd.tls_group,
                status_cmd.status_cmd, status_cmd.farm_group, web_cmd.web_group, report_cmd.report_cmd,
                report_cmd.history_cmd, bisect_cmd.bisect_cmd, perf_cmd.perf_group):
    main.add_command(command)


if __name__ == "__main__":
    main()
