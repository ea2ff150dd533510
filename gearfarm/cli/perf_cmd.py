"""`gearfarm perf`: performance series' change points, and changes marked as expected."""

from __future__ import annotations

from pathlib import Path

import click

from gearfarm.cli.common import config_or_embedded, fail
from gearfarm.config import ConfigError
from gearfarm.formats.words import counted


@click.group("perf")
def perf_group() -> None:
    """Performance history: change points and annotations."""


@perf_group.command("changes")
@click.option("--values", help="A plain comma-separated series (oldest first) instead of the database.")
@click.option("--lower-is-better", is_flag=True, help="With --values: the metric is a latency or a size.")
@click.option("--target", default="linux-x86_64", show_default=True)
@click.option("--benchmark", help="Benchmark name (default: every series of the newest run).")
@click.option("--metric", help="Metric name (default: all of the benchmark's).")
@click.option("--project", help="Only this project (default: every project with runs).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_changes(values: str | None, lower_is_better: bool, target: str, benchmark: str | None, metric: str | None,
                 project: str | None, config_path: str | None, state_dir: Path | None) -> None:
    """Change points of performance series, with their size, interval and revisions."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.perf import analysis as perf
    from gearfarm.perf import changepoint

    if values is not None:
        try:
            nums = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            fail("--values takes numbers separated by commas, e.g. --values 100,101,99,80,81")
        try:
            cps = changepoint.detect(nums, higher_is_better=not lower_is_better)
        except ValueError as e:
            fail(str(e))
        for c in cps:
            click.echo(f"index {c.index}: {c.direction} {c.change:+.1%} [{c.ci_low:+.1%}, {c.ci_high:+.1%}] "
                       f"p={c.p_value:.2g}")
        if not cps:
            click.echo("no change")
        return
    cfg = config_or_embedded(config_path, state_dir)
    db = ResultsDB(cfg.database.url)
    expected = db.expected_changes()
    shown = 0
    for name in [project] if project else db.projects():
        latest = db.runs(limit=1, project=name)
        if not latest:
            continue
        run = latest[0]
        higher = perf.directions(db, run)
        for t, host_class, b, m in db.perf_keys(run.run_id):
            if t != target or (benchmark and b != benchmark) or (metric and m != metric):
                continue
            series, changes, _ = perf.series_changes(db, run, t, host_class, b, m, higher.get((b, m), True),
                                                     expected.get((b, m, t), set()))
            shown += 1
            click.echo(f"{run.project}: {b} {m} on {t} (host class {host_class}, {counted(len(series), 'night')}): "
                       + ("no change" if not changes else ""))
            for c in changes:
                click.echo(f"  {c.direction} {c.change:+.1%} [{c.ci_low:+.1%}, {c.ci_high:+.1%}] p={c.p_value:.2g} "
                           f"first bad {c.first_bad_rev[:12]} last good {(c.last_good_rev or '?')[:12]}")
    if not shown:
        fail(f"no performance series for {target} {benchmark or ''} {metric or ''} in the newest runs")


@perf_group.command("expect")
@click.option("--benchmark", required=True)
@click.option("--metric", required=True)
@click.option("--target", required=True)
@click.option("--rev", required=True, help="The change's first bad revision (as reported).")
@click.option("--note", default="", help="Why the change is expected.")
@click.option("--project", help="The project whose repository has REV (default: the first configured).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
def perf_expect(benchmark: str, metric: str, target: str, rev: str, note: str, project: str | None,
                config_path: str | None, state_dir: Path | None) -> None:
    """Mark a performance change as expected: it stops being reported."""
    from gearfarm.db.results import ResultsDB
    from gearfarm.run import snapshot

    cfg = config_or_embedded(config_path, state_dir)
    try:
        proj = cfg.project(project) if project else cfg.project_list()[0]
        full = snapshot.resolve(snapshot.repository(cfg, proj), rev)
    except (ConfigError, snapshot.SourceError) as e:
        fail(str(e))
    added = ResultsDB(cfg.database.url).annotate(benchmark, metric, target, full, note)
    click.echo(f"{'marked' if added else 'already marked'} as expected: {benchmark} {metric} on {target} at "
               f"{full[:12]}")
