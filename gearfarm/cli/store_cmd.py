"""`gearfarm store`: the S3 store's usage, pruning and per-role users."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console

from gearfarm import config as config_mod
from gearfarm.cli.common import config_or_embedded, csv, fail, load_config, need_farm
from gearfarm.formats.words import counted


@click.group("store")
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
        fail(f"--as-of {value!r}: give epoch seconds or an ISO date such as 2027-01-31")
    return (at if at.tzinfo else at.replace(tzinfo=datetime.UTC)).timestamp()


def _retention(config_path: str | None, state_dir: Path | None, days: float | None, as_of: str | None) -> tuple:
    now = _as_of(as_of)
    cfg = config_or_embedded(config_path, state_dir)
    if days is not None:
        if days < 1:
            fail("--days must be at least 1")
        cfg.retention.days = days
    need_farm(cfg, "s3")
    from gearfarm.db.results import ResultsDB
    from gearfarm.run import retention
    from gearfarm.s3.store import ArtifactStore, StoreError

    db = ResultsDB(cfg.database.url)
    store = ArtifactStore(cfg.s3, retry_for=60)
    try:
        return cfg, db, store, retention.survey(cfg, db, store, now)
    except (retention.RetentionError, StoreError) as e:
        fail(str(e))


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
    click.echo(f"kept for a reason: {counted(len(valued), 'entry')}, {_mib(sum(e.size for e in valued))}; "
               f"younger than {counted(cfg.retention.days, 'day')}: {len(young)}, {_mib(sum(e.size for e in young))}; "
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
    `gearfarm store usage`). Run it by hand or daily (docker/systemd/gearfarm-prune.timer): with
    nothing to delete it prints nothing, so cron mails only what it deleted or why it could not."""
    from gearfarm.run import retention
    from gearfarm.s3.store import StoreError

    _, db, store, entries = _retention(config_path, state_dir, days, as_of)
    gone = [e for e in entries if e.expired]
    for e in gone:
        click.echo(f"{'would prune' if dry_run else 'pruning'} {e.prefix} ({counted(len(e.keys), 'object')}"
                   f"{f' and {e.local}' if e.local else ''}, {_mib(e.size)}, "
                   f"last used {time.strftime('%Y-%m-%d', time.gmtime(e.last_used))})")
    if dry_run:
        click.echo(f"dry run: {counted(len(gone), 'entry')}, {_mib(sum(e.size for e in gone))} would be deleted")
        return
    try:
        deleted, freed, folders = retention.prune(db, store, entries)  # refuses an empty database, gone or not
    except (retention.RetentionError, StoreError, OSError) as e:
        fail(str(e))
    if gone:  # nothing deleted, nothing said: no mail from cron
        click.echo(f"pruned {counted(len(gone), 'entry')}: {counted(deleted, 'object')} and "
                   f"{counted(folders, 'run folder')} on disk, {_mib(freed)} freed; "
                   f"{counted(sum(1 for e in entries if not e.expired), 'entry')} kept")


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

    cfg = load_config(config_path)
    if cfg is None:
        fail(f"store roles needs a config with a MinIO admin's keys in [s3]: pass --config or set "
             f"${config_mod.ENV_VAR}")
    need_farm(cfg, "s3")
    wanted = csv(role_names) or []
    bad = [r for r in wanted if r not in ROLE_WRITES]
    if bad or not wanted:
        fail(f"--roles {role_names!r}: give some of {', '.join(ROLE_WRITES)}")
    targets = tuple(csv(target_names) or ALL_TARGETS)
    try:
        for t in targets:
            if t != "*":
                part(t)
    except ValueError:
        fail(f"--targets {target_names!r}: a target is a name like linux-x86_64 (letters, digits, '.', '-', '_')")
    roles = {r: S3Keys(access_key=f"gearfarm-{r}-{secrets_mod.token_hex(3)}", secret_key=secrets_mod.token_hex(20))
             for r in wanted}
    try:
        make_role_users(cfg.s3, roles, {r: targets for r in roles})
    except MinioError as e:
        fail(str(e))
    click.echo("# Put each role's section into the config of the hosts that run that role (and no other)"
               + ("" if targets == ALL_TARGETS else f", for targets {', '.join(targets)}") + ".")
    for r, k in roles.items():
        click.echo(f'[s3.roles.{r}]\naccess_key = "{k.access_key}"\nsecret_key = "{k.secret_key}"\n')
