"""`gearfarm project check`: a project's catalog checked, and its build tried here, before its
first nightly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from gearfarm.cli.common import console, fail, load_config
from gearfarm.config import Config, ConfigError, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import CatalogError
from gearfarm.formats.exitcode import EXIT_FAILED, EXIT_OK
from gearfarm.formats.words import counted
from gearfarm.hosts import process
from gearfarm.step import sandbox, wine

if TYPE_CHECKING:
    from gearfarm.run.nightly import Loaded
    from gearfarm.step.sandbox import Sandbox


@click.group("project")
def project_group() -> None:
    """A project's catalog: check it, and try its build, before its first nightly."""


@project_group.command("check")
@click.option("--config", "config_path", help="Farm config naming the project (default $GEARFARM_CONFIG).")
@click.option("--project", "name", help="A configured project (default: the only or first one).")
@click.option("--repo", help="A repository (path or URL) to check instead of a configured project.")
@click.option("--catalog", "catalog_path", help="The catalog's path in the repository (default jobs/catalog.toml).")
@click.option("--catalog-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A catalog file on disk, for repositories that cannot carry one.")
@click.option("--rev", help="Revision to check (default: the project's branch).")
@click.option("--target", help="Target to build once (default: the first this host can build).")
@click.option("--no-run", is_flag=True, help="Only validate the catalog and print what the farm would run.")
def project_check(config_path: str | None, name: str | None, repo: str | None, catalog_path: str | None,
                  catalog_file: Path | None, rev: str | None, target: str | None, no_run: bool) -> None:
    """Validate a project's catalog at a revision, print what the farm would run for each
    target, and (where this host can) build one target and run its suites once, locally,
    through the same code as the farm's workers. Exit 0: all good; 1: the build or a suite
    failed; 2: the catalog or the repository is wrong."""
    import tempfile

    from gearfarm.run import nightly, snapshot
    from gearfarm.s3 import artifact
    from gearfarm.s3.store import sha256_file
    from gearfarm.step import runner as step

    cfg = load_config(config_path) or Config()
    project = _project_to_check(cfg, name, repo, catalog_path, catalog_file)
    with tempfile.TemporaryDirectory(prefix="gearfarm-check-") as tmp_name:
        tmp = Path(tmp_name)
        if cfg.source is None:
            cfg.farm.state_dir = str(tmp / "state")  # a URL's mirror lives only as long as the check
        try:
            lp = nightly.load_project(cfg, project, rev)
        except (CatalogError, nightly.RunError) as e:
            fail(str(e))
        cat = lp.catalog
        click.echo(f"project {project.name}: catalog valid at {lp.rev[:12]} ({counted(len(cat.targets), 'target')}, "
                   f"{counted(len(cat.suites), 'suite')}, {counted(len(cat.benchmarks), 'benchmark')})")
        _print_submodules(lp)
        for t in cat.targets.values():
            _print_target(cat, t)
        if no_run:
            return
        chosen = _target_to_build(cat, target)
        tgt = cat.target(chosen)
        click.echo(f"\nbuilding {chosen} here, from the snapshot of {lp.rev[:12]} …")
        archive = tmp / f"source{artifact.ARCHIVE_SUFFIX}"
        try:
            snapshot.pack(lp.repo, lp.rev, archive, lp.mirrors)
        except snapshot.SourceError as e:
            fail(f"project {project.name}: {e}")
        root, scratch = tmp / "root", tmp / "scratch"
        scratch.mkdir()
        artifact.safe_extract(archive, root, sha256_file(archive), "source snapshot")
        log_path = tmp / "build.log"
        # Confined as a worker would confine it (the project's code runs on the user's machine).
        box = sandbox.for_config(cfg)
        run = step.run_build(cat, tgt, root, scratch, log_path, box, project=project.name)
        if run.status != "passed":
            click.echo(process.log_tail(log_path, 40))
            message = run.message(cat.build_for(tgt).timeout)
            console.print(f"[bold red]build {run.status}:[/] {escape(message)} (log above)", highlight=False)
            sys.exit(EXIT_FAILED)
        click.echo(f"build passed; artifact would hold {counted(len(run.outputs), 'file')}:")
        for f in run.outputs[:20]:
            click.echo(f"  {f}")
        if len(run.outputs) > 20:
            click.echo(f"  … and {len(run.outputs) - 20} more")
        # Through a real artifact, as test workers get it: what is not in the outputs is not there.
        packed_path = tmp / f"artifact{artifact.ARCHIVE_SUFFIX}"
        packed = artifact.pack(root, run.outputs, {"rev": lp.rev, "target": chosen}, packed_path)
        failed = _try_suites(cfg, cat, tgt, tmp, archive, packed_path, packed["archive_sha256"], box)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _print_submodules(lp: Loaded) -> None:
    """The submodules the snapshot will hold (fetched now, as the nightly fetches them)."""
    from gearfarm.run import snapshot

    assert lp.mirrors is not None
    try:
        mods = snapshot.modules(lp.repo, lp.rev, lp.mirrors)
    except snapshot.SourceError as e:
        fail(str(e))
    if mods:
        click.echo(f"\nsubmodules ({len(mods)}, each at the commit the tree records):")
    for m in mods:
        resolved = f" = {m.fetch_url}" if m.fetch_url != m.url else ""
        click.echo(f"  {m.path} at {m.commit[:12]} from {m.url}{resolved}")


def _project_to_check(cfg: Config, name: str | None, repo: str | None, catalog_path: str | None,
                      catalog_file: Path | None) -> ProjectConfig:
    """--repo, else the configured project, with --catalog or --catalog-file in place of its own."""
    if repo is not None:
        return ProjectConfig(name=name or "check", repo=repo, catalog=catalog_path,
                             catalog_file=str(catalog_file.resolve()) if catalog_file else None)
    try:
        project = cfg.project(name) if name else cfg.project_list()[0]
    except ConfigError as e:
        fail(str(e))
    if catalog_file is not None or catalog_path is not None:
        project = project.model_copy(update={"catalog": catalog_path, "catalog_file": str(catalog_file.resolve())
                                             if catalog_file else None})
    return project


def _target_to_build(cat: catalog_mod.Catalog, target: str | None) -> str:
    """--target if this host can build it, else the first target it can."""
    from gearfarm.hosts import probe

    if target is None:
        ok, missing = probe.servable(cat, "build")
        if not ok:
            fail("this host can build none of the targets: " + "; ".join(f"{t}: {w}" for t, w in missing.items()))
        return ok[0]
    try:
        cat.target(target)
    except CatalogError as e:
        fail(str(e))
    reason = probe.probe(cat.target(target), "build")
    if reason:
        fail(f"this host cannot build {target}: {reason}")
    return target


def _try_suites(cfg: Config, cat: catalog_mod.Catalog, tgt: catalog_mod.Target, tmp: Path, archive: Path,
                packed_path: Path, packed_sha256: str, box: Sandbox) -> int:
    """Run each of ``tgt``'s suites once on the packed build, as a test worker would; the
    number that failed."""
    from gearfarm.hosts import probe
    from gearfarm.s3 import artifact
    from gearfarm.s3.store import sha256_file
    from gearfarm.step import runner as step

    failed = 0
    for sname in tgt.suites:
        suite = cat.suite(sname)
        reason = probe.probe(tgt, "test")
        if reason:
            click.echo(f"suite {sname}: not run here ({reason})")
            continue
        tree = tmp / f"tree-{sname}"
        if suite.source:
            artifact.safe_extract(archive, tree, sha256_file(archive), "source snapshot")
        artifact.unpack(packed_path, tree, packed_sha256)
        (tmp / f"scratch-{sname}").mkdir()
        slog = tmp / f"{sname}.log"
        prefix = wine.job_prefix(box, cfg.path(cfg.farm.state_dir) / "wine", tgt.runner, tmp / f"job-{sname}")
        res = step.run_suite(cat, tgt, suite, tree, tmp / f"scratch-{sname}", slog, 1, box, prefix)
        counts = {st: sum(1 for c in res.cases if c.status == st)
                  for st in ("passed", "failed", "error", "skipped")}
        click.echo(f"suite {sname} ({suite.format}): {res.status}, {counted(len(res.cases), 'test case')} "
                   + ", ".join(f"{n} {st}" for st, n in counts.items() if n)
                   + (f" — {res.message}" if res.message else ""))
        for c in res.cases:
            if c.status in ("failed", "error"):
                click.echo(f"    {c.status}: {c.name} {c.message.splitlines()[0] if c.message else ''}")
        if res.status != "passed":
            failed += 1
            click.echo(process.log_tail(slog, 15))
    return failed


def _print_target(cat: catalog_mod.Catalog, t: catalog_mod.Target) -> None:
    shown = {"root": "{root}", "scratch": "{scratch}", "junit": "{junit}", "seed": "{seed}"}
    vals = catalog_mod.values(cat, t, shown)

    def cmd(argv: list[str], runner: bool = False) -> str:
        return " ".join((t.runner if runner else []) + catalog_mod.expand(argv, vals, t.runner))

    click.echo(f"\ntarget {t.name}" + (f" (runner: {' '.join(t.runner)})" if t.runner else "")
               + (f", needs {', '.join(t.tools)}" if t.tools else ""))
    build = cat.build_for(t)  # the target's own: what its build worker will run
    click.echo(f"  build   (in {build.cwd}): {cmd(build.argv)}")
    if build.env:
        click.echo(f"          env: {' '.join(f'{k}={v.format_map(vals)}' for k, v in build.env.items())}")
    click.echo(f"          outputs: {', '.join(o.format_map(vals) for o in build.outputs)}")
    if t.build is not None:  # where it differs from the others', say so and where
        click.echo(f"          [targets.{t.name}.build] sets {', '.join(t.build.keys_set())}"
                   + (" over [build]" if cat.build is not None else " (no [build])"))
    for sname in t.suites:
        s_ = cat.suite(sname)
        click.echo(f"  test-{sname} ({s_.format}, in {s_.cwd}): {cmd(s_.argv, s_.runner)}")
    if t.perf:
        for bname, b in cat.benchmarks.items():
            click.echo(f"  perf-{bname} ({', '.join(b.metrics)}): {cmd(b.argv, b.runner)}")

