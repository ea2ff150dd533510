"""Bisection on a real farm (issue #16): a small C project of 16 commits, built and tested by the
embedded farm's workers through gearmand and MinIO. A test broken at commit 11 is bisected to
commit 11 with at most 6 builds made (reused builds not counted, counted from the probe runs'
build records); a test that fails at random on 30 % of runs is reported flaky and no middle
revision is ever probed for it; the probe runs stay out of the nightly runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import catalog as catalog_mod
from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.farm import EmbeddedFarm
from gearfarm.store import ResultsDB
from tests.farmkit import GIT, commit, gearfarm

TARGET = "linux-x86_64"
TEST = r"""#define _DEFAULT_SOURCE
#include <stdio.h>
#include <sys/random.h>
#include "calc.h"
static int n;
static void check(int ok, const char *what) { printf("%sok %d - %s\n", ok ? "" : "not ", ++n, what); }
int main(void) {
    unsigned r = 0;
    /* getrandom, not time or pid: repetitions start within a second, in fresh pid namespaces. */
    if (getrandom(&r, sizeof r, 0) != (long)sizeof r) return 2;
    printf("1..3\n");
    check(calc_add(2, 3) == 5, "add");
    check(calc_mul(2, 3) == 6, "mul");
    check(r % 100 >= 30, "coin"); /* fails on 30 % of runs, at every commit */
    return 0;
}
"""
CATALOG = """schema = 2

[build]
argv = ["make", "CC={cc}"]
outputs = ["t_calc"]
timeout = 120

[suites.tap]
description = "calc's API as TAP; 'coin' fails at random"
argv = ["{root}/t_calc"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
suites = ["tap"]
"""
GOOD_ADD = "int calc_add(int a, int b) { return a + b; }"
BAD_ADD = "int calc_add(int a, int b) { return a + b + (a > 1); }"


def calc_repo(dest: Path) -> list[str]:
    """16 commits; the 11th breaks calc_add. Every commit changes the code (each is its own build)."""
    import subprocess

    dest.mkdir(parents=True)
    (dest / ".gearfarm").mkdir()
    (dest / ".gearfarm" / "catalog.toml").write_text(CATALOG)
    (dest / "Makefile").write_text("CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n"
                                   "t_calc: t_calc.c calc.c calc.h\n\t$(CC) $(CFLAGS) -o $@ t_calc.c calc.c\n")
    (dest / "calc.h").write_text("int calc_add(int a, int b);\nint calc_mul(int a, int b);\n")
    (dest / "t_calc.c").write_text(TEST)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = []
    for i in range(1, 17):
        add = BAD_ADD if i >= 11 else GOOD_ADD
        (dest / "calc.c").write_text(f'#include "calc.h"\nconst char calc_revision[] = "{i}";\n{add}\n'
                                     "int calc_mul(int a, int b) { return a * b; }\n")
        revs.append(commit(dest, "calc: add rounds up past one (faster)" if i == 11 else f"commit {i}: tidy"))
    return revs


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedFarm, list[str]]]:
    base = tmp_path_factory.mktemp("bisection")
    revs = calc_repo(base / "calc")
    f = EmbeddedFarm(base / "state", base / "calc",
                     projects=[ProjectConfig(name="calc", repo=str(base / "calc"), catalog=".gearfarm/catalog.toml")])
    f.start([catalog_mod.parse(CATALOG, "calc")], [TARGET])
    try:
        yield f, revs
    finally:
        f.stop()


def _bisect(f: EmbeddedFarm, revs: list[str], test: str) -> tuple[int, str]:
    p = gearfarm("bisect", f"{revs[0]}..{revs[-1]}", "--test", test, "--target", TARGET,
                 "--config", str(f.config_path), timeout=900)
    return p.returncode, p.stdout + p.stderr


def _probe_builds(db: ResultsDB, prefix: str) -> tuple[list[str], list[str]]:
    """(revisions built, revisions whose build was reused) by the bisection's probe runs."""
    built, reused = [], []
    for run in db.runs(limit=500, reruns=True):
        if run.parent_run_id != prefix:
            continue
        for r in db.jobs(run.run_id):
            if r.kind == "build" and r.status in ("passed", "failed"):
                (reused if r.reused_artifact else built).append(r.rev)
    return built, reused


def test_a_test_failing_at_random_is_reported_flaky_and_not_bisected(farm: tuple[EmbeddedFarm, list[str]]) -> None:
    f, revs = farm
    code, out = _bisect(f, revs, "tap/coin")
    assert code == 1, out
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    b = db.bisections(project="calc")[0]
    assert b.state == "flaky" and b.culprit_rev is None, out
    # Only the ends were run: no middle revision was judged, nothing blamed.
    assert {p["rev"] for p in b.detail["probes"]} <= {revs[0], revs[-1]}, b.detail["probes"]
    statuses = [s for p in b.detail["probes"] for s in p["statuses"]]
    assert "passed" in statuses and "failed" in statuses, statuses
    assert "flaky" in out


def test_a_test_broken_at_commit_11_is_bisected_to_it_with_at_most_6_builds(
        farm: tuple[EmbeddedFarm, list[str]]) -> None:
    f, revs = farm
    code, out = _bisect(f, revs, "tap/add")
    assert code == 0, out
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    b = db.bisections(project="calc")[0]
    assert b.state == "found" and b.culprit_rev == revs[10], out
    assert b.detail["subject"] == "calc: add rounds up past one (faster)"
    assert b.detail["author"].startswith("gearfarm-test") and b.detail["confidence"] > 0.9
    built, reused = _probe_builds(db, b.run_prefix)
    print(f"bisect-{b.id}: {len(built)} builds made, {len(reused)} reused; {b.detail['jobs']} test runs\n{out}")
    assert len(built) <= 6 and len(built) == b.detail["builds"] == len(set(built))
    # The ends were built by the flaky test's bisection before: reused, not built again.
    assert revs[0] in reused and revs[-1] in reused and revs[0] not in built
    # The verdicts on either side of the culprit: its parent passed every run, it failed every run.
    by_rev = {p["rev"]: p for p in b.detail["probes"]}
    assert set(by_rev[revs[9]]["statuses"]) == {"passed"} and set(by_rev[revs[10]]["statuses"]) == {"failed"}
    assert f"culprit: {revs[10]}" in out
    # Probe runs are children of the bisection: never a nightly run.
    assert all(r.parent_run_id is None for r in db.runs(limit=500)) and not db.runs(limit=500)
