"""`gearfarm artifact`: a build downloaded for people, checked against its signed records."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from gearfarm.cli.common import config_or_embedded, console, fail, need_farm
from gearfarm.formats.exitcode import EXIT_FAILED


@click.group("artifact")
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
    if sum(x is not None for x in (rev, run_id)) + last_good > 1:
        fail("give one of --rev, --run and --last-good")
    cfg = config_or_embedded(config_path, state_dir)
    need_farm(cfg, "s3")
    from gearfarm.db.results import ResultsDB
    from gearfarm.report import download
    from gearfarm.s3.store import ArtifactStore, StoreError

    name = project or cfg.project_list()[0].name
    db = ResultsDB(cfg.database.url)
    try:
        rec = download.find_build(db, name, target, rev=rev, run=run_id)
        checked = download.get(db, ArtifactStore(cfg.s3, retry_for=30), rec, out)
    except download.NotFound as e:
        fail(str(e))
    except download.VerifyError as e:
        console.print(f"[bold red]REFUSED:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_FAILED)
    except StoreError as e:
        fail(f"cannot download from S3: {e}")
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
    registry = Registry(ResultsDB(config_or_embedded(config_path, state_dir).database.url))
    try:
        checked = download.verify(registry, archive, prov)
    except download.VerifyError as e:
        console.print(f"[bold red]REFUSED:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_FAILED)
    for line in checked.lines:
        click.echo(f"verified: {line}")
