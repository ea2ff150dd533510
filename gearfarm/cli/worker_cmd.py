"""`gearfarm worker` and `gearfarm collector`: a host's long-running processes, serving the
functions this host can serve."""

from __future__ import annotations

import re

import click
from rich.markup import escape

from gearfarm import config as config_mod
from gearfarm.cli.common import console, csv, exit_now, fail, load_config
from gearfarm.config import Config, ConfigError
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import CatalogError


@click.command("worker")
@click.option("--role", required=True,
              help="build, test, perf or collector; or several of build, test and perf, comma-separated: one "
                   "worker slot (one job at a time) serving them all ('-' separates them too). A trailing .N "
                   "names the slot and is otherwise ignored (systemd: gearfarm-worker@build-test.1, @perf.1).")
@click.option("--targets", help="Comma-separated targets to serve (default: all this host can serve).")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def worker_cmd(role: str, targets: str | None, config_path: str | None) -> None:
    """Run a worker: registers exactly the functions this host can serve, the jobs on the
    longest path of a nightly first (run one per core for a host's slots)."""
    cfg = load_config(config_path)
    if cfg is None:
        fail(f"a worker needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    # "build-test.2" (systemd's instance names cannot hold a comma) is "build,test" in slot 2:
    # the slot's number is for the unit's instance name only.
    roles = csv(re.sub(r"\.[0-9]+$", "", role).replace("-", ",")) or []
    if roles == ["collector"]:
        from gearfarm.workers import collector

        collector.serve(cfg)
        exit_now()
    bad = [r for r in roles if r not in ("build", "test", "perf")]
    if bad or not roles or len(set(roles)) < len(roles):
        fail(f"--role {role!r}: give build, test, perf or collector, or several of build, test and perf "
             "separated by commas (e.g. --role build,test)")
    from gearfarm.formats.job import function_name
    from gearfarm.hosts import probe
    from gearfarm.run import priority
    from gearfarm.step.sandbox import SandboxError
    from gearfarm.workers import base, build, perf, test

    wanted = csv(targets)
    for t in wanted or []:
        if not catalog_mod.TARGET_RE.match(t):
            fail(f"--targets: {t!r} is not a target name <os>-<arch> (e.g. linux-x86_64)")
    # No repository here: what the projects' targets are comes from the catalogs the nightly
    # stored in S3. Each job's own catalog decides what runs.
    # With --targets given, the check is a courtesy: an S3 that is away does not hold the worker up.
    cats, notes = _latest_catalogs(cfg, retry_for=2.0 if wanted else 30.0, role=roles[0])
    for note in notes:
        console.print(f"[yellow]{escape(note)}[/]", highlight=False)
    if not cats and not wanted:
        fail("no project has a catalog in S3 yet (no nightly has run), so this worker cannot tell which targets "
             "it may serve: name them with --targets, e.g. --targets linux-x86_64")
    try:
        assignment = probe.assign(cats, roles, wanted, label=role)
    except probe.AssignmentError as e:
        fail(str(e))
    if wanted:
        for (r, t), w in assignment.unserved.items():
            console.print(f"[yellow]not serving {r} for {t}: {escape(w)}[/]", highlight=False)
    served = assignment.served
    defs = {name: t for c in reversed(cats) for name, t in c.targets.items()}
    durations = priority.Durations.of_host(cfg.path(cfg.farm.state_dir))
    pairs = priority.order([(r, t) for r in roles for t in served[r]], defs, durations.load())
    handlers = {"build": build.handle, "test": test.handle, "perf": perf.handle}
    try:
        base.serve(cfg, [(r, function_name(r, t), handlers[r]) for r, t in pairs],  # type: ignore[misc]
                   prefer=priority.Preference(pairs, defs, durations) if len(pairs) > 1 else None)
    except (ConfigError, SandboxError) as e:  # no key, or no way to confine jobs: refuse, saying how
        fail(str(e))
    exit_now()



def _latest_catalogs(cfg: Config, retry_for: float, role: str) -> tuple[list[catalog_mod.Catalog], list[str]]:
    """The newest catalog of every configured project, from S3 (see gearfarm.run.snapshot), read
    with ``role``'s keys."""
    import json

    from gearfarm.run import snapshot
    from gearfarm.s3 import keys
    from gearfarm.s3.store import ArtifactStore, StoreError

    store = ArtifactStore(cfg.s3.for_role(role), retry_for=retry_for)
    cats, notes = [], []
    for project in cfg.project_list():
        try:
            if not store.exists(keys.project_latest(project.name)):
                continue
            latest = json.loads(store.get_bytes(keys.project_latest(project.name)))
            cats.append(snapshot.fetch_catalog(store, latest["catalog_sha256"]))
        except (StoreError, CatalogError, ValueError, KeyError) as e:
            notes.append(f"project {project.name}: its newest catalog cannot be read from S3 ({e}); ignored")
    return cats, notes


@click.command("collector")
@click.option("--config", "config_path", help="Farm config (TOML); default $GEARFARM_CONFIG.")
def collector_cmd(config_path: str | None) -> None:
    """Run the collector: stores every result record in the results database."""
    cfg = load_config(config_path)
    if cfg is None:
        fail(f"the collector needs a farm config: pass --config or set ${config_mod.ENV_VAR}")
    from gearfarm.workers import collector

    collector.serve(cfg)
    exit_now()
