"""`gearfarm bisect`: the commit that broke a test (or each of several tests, bisected as one
group) or moved a benchmark, found with the farm's own workers."""

from __future__ import annotations

from pathlib import Path

import click

from gearfarm.cli.common import config_or_embedded, console, exit_now, fail, need_farm
from gearfarm.config import ConfigError
from gearfarm.formats.exitcode import EXIT_FAILED, EXIT_OK


@click.command("bisect")
@click.argument("range_", metavar="GOOD..BAD")
@click.option("--test", "tests", multiple=True,
              help="A failing test, as SUITE/NAME; given again, the tests are bisected as one group.")
@click.option("--benchmark", help="A benchmark that moved (with --metric).")
@click.option("--metric", help="The benchmark's metric that moved.")
@click.option("--target", required=True, help="The target it happened on.")
@click.option("--project", help="The project (default: the config's first).")
@click.option("--config", "config_path")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--builds", type=int, help="Budget: builds made (reused ones are free); default [bisect] builds.")
@click.option("--jobs", "max_jobs", type=int, help="Budget: test or benchmark jobs.")
@click.option("--hours", type=float, help="Budget: wall time.")
@click.option("--confirm", type=int, help="Tests: runs of each end before searching.")
@click.option("--repeat", type=int, help="Tests: runs of each middle revision.")
@click.option("--change", type=float, default=0.05, show_default=True,
              help="Benchmarks: the relative change sought at BAD (0.05 = 5 %, either direction).")
@click.option("--max-pairs", type=int,
              help="Benchmarks: A/B pairs per revision, at most.")
@click.option("--seed", type=int, default=1, show_default=True, help="The {seed} the suite or benchmark runs with.")
def bisect_cmd(range_: str, tests: tuple[str, ...], benchmark: str | None, metric: str | None, target: str,
               project: str | None, config_path: str | None, state_dir: Path | None, builds: int | None,
               max_jobs: int | None, hours: float | None, confirm: int | None, repeat: int | None, change: float,
               max_pairs: int | None, seed: int) -> None:
    """Find the commit in GOOD..BAD that broke each TEST, or moved BENCHMARK's METRIC, on
    TARGET, with the farm's own workers (a lab's config, or an embedded farm kept running with
    './nightly.bash --keep'). Several tests are one group: one search judges them all at each
    revision, and each gets its own culprit. Exit 0 with a culprit for every test, 1 without
    (flaky, no change, budget spent, unbuildable), 2 if the farm cannot bisect. Budgets (of the
    whole group) and repetitions not given come from the config's [bisect] section."""
    from gearfarm.bisection.subject import BisectionError, PerfSubject, Settings, Subject, TestSubject

    good, sep, bad = range_.partition("..")
    if not sep or not good or not bad:
        fail(f"range {range_!r}: give it as GOOD..BAD (the last good revision, then the first bad one)")
    subjects: list[Subject] = []
    if tests and benchmark is None and metric is None:
        for test in dict.fromkeys(tests):
            suite, slash, case = test.partition("/")
            if not slash or not suite or not case:
                fail(f"test {test!r}: give it as SUITE/NAME (for example unit/limits_and_bad_arguments)")
            subjects.append(TestSubject(suite, case))
    elif not tests and benchmark and metric:
        subjects.append(PerfSubject(benchmark, metric))
    else:
        fail("say what to bisect: --test SUITE/NAME, or --benchmark NAME with --metric METRIC")
    cfg = config_or_embedded(config_path, state_dir)
    b = cfg.bisect
    builds = b.builds if builds is None else builds
    max_jobs = b.jobs if max_jobs is None else max_jobs
    hours = b.hours if hours is None else hours
    confirm = b.confirm if confirm is None else confirm
    repeat = b.repeat if repeat is None else repeat
    max_pairs = b.max_pairs if max_pairs is None else max_pairs
    if min(builds, max_jobs, confirm, repeat, max_pairs) < 1 or hours <= 0 or not 0 < abs(change) < 10:
        fail("--builds, --jobs, --confirm, --repeat, --max-pairs and --hours must be positive, "
             "--change a relative change such as 0.05")
    try:
        proj = cfg.project(project) if project else cfg.project_list()[0]
    except ConfigError as e:
        fail(str(e))
    need_farm(cfg, "gearmand", "s3")  # its probe runs are the farm's jobs
    from gearfarm.bisection import driver as bisection
    from gearfarm.bisection import search as bisect
    from gearfarm.db.results import ResultsDB
    from gearfarm.s3.store import ArtifactStore

    db = ResultsDB(cfg.database.url)
    settings = Settings(bisect.Budget(builds, max_jobs, hours * 3600), confirm, repeat, seed,
                        abs(change), max_pairs)
    runner = bisection.bisector(cfg, db, ArtifactStore(cfg.s3, retry_for=60), proj, target, subjects, settings,
                                say=lambda m: console.print(m, highlight=False))
    try:
        rows = runner.run(good, bad)
    except BisectionError as e:
        fail(str(e))
    click.echo(bisection.describe(rows))
    exit_now(EXIT_OK if all(r.culprit_rev for r in rows) else EXIT_FAILED)
