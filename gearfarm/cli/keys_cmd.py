"""`gearfarm keys`: the nightly's signing key, and the registry of worker hosts' keys."""

from __future__ import annotations

import time
from pathlib import Path

import click

from gearfarm import config as config_mod
from gearfarm.cli.common import config_or_embedded, console, csv, fail


@click.group("keys")
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
        fail(f"{out} exists: a key is never overwritten (a host's old key would stop verifying); "
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

    cfg = config_or_embedded(config_path, state_dir)
    shown = False
    for what, name in (("nightly", cfg.farm.signing_key), (f"host {cfg.host_name()}", cfg.farm.host_key)):
        if name:
            try:
                signer = Signer.load(cfg.path(name))
            except SealError as e:
                fail(str(e))
            click.echo(f"{what}\t{signer.kid}\t{signer.public_text}")
            shown = True
    if not shown:
        fail("this config names no signing_key and no host_key")


def _registry(config_path: str | None, state_dir: Path | None):  # noqa: ANN202 - Registry, imported late
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB

    return Registry(ResultsDB(config_or_embedded(config_path, state_dir).database.url))


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
            fail(f"cannot read the public key from {public_key[1:]}: {e}")
    try:
        e = _registry(config_path, state_dir).add(host, public_key, csv(roles) or [], csv(targets) or [])
    except (RegistryError, SealError) as err:
        fail(str(err))
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
        fail(str(e))
    for e in gone:
        click.echo(f"revoked key {e.kid} of host {e.host}")
