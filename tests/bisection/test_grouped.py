"""Bisection grouped by (project, target, range) on a real farm (issue #35, point 7): grid's
commit 9 breaks seven of its cases at once. Two nightlies (commit 1, then commit 16) find seven
new failures in one range; the farm bisects them as ONE group: every probe run judges all seven
cases together, each revision is built at most once (counted from the probe runs' build
records, reused builds apart), each failure's record names commit 9 and the group, and the
report and the follow-up mail show the group with one line per failure."""

from __future__ import annotations

import email
import email.policy
from collections import Counter
from collections.abc import Iterator

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import Bisection, ResultsDB, Run
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.bisect_projects import GRID_CASES, GRID_CATALOG, GRID_CULPRIT, grid_repo, nightly

TARGET = "linux-x86_64"
Farm = tuple[EmbeddedFarm, list[str]]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    base = tmp_path_factory.mktemp("grouped")
    revs = grid_repo(base / "grid")
    f = EmbeddedFarm(base / "state", base / "grid",
                     projects=[ProjectConfig(name="grid", repo=str(base / "grid"), catalog=".gearfarm/catalog.toml")])
    f.start([catalog_mod.parse(GRID_CATALOG, "grid")], [TARGET])
    try:
        yield f, revs
    finally:
        f.stop()


def _probe_runs(db: ResultsDB, rows: list[Bisection]) -> list[Run]:
    prefixes = {b.run_prefix for b in rows}
    return [run for run in db.runs(limit=1000, reruns=True) if run.parent_run_id in prefixes]


def test_one_commit_that_breaks_seven_tests_is_bisected_once(farm: Farm) -> None:
    f, revs = farm
    for run_id, rev in (("g1", revs[0]), ("g2", revs[-1])):
        p = nightly(f.config_path, "grid", rev, run_id)
        assert p.returncode == (0 if run_id == "g1" else 1), p.stdout + p.stderr
    out = p.stdout + p.stderr
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    rows = db.bisections(origin_run_ids=["g2"])
    culprit = revs[GRID_CULPRIT - 1]
    runs = _probe_runs(db, rows)
    records = [r for run in runs for r in db.jobs(run.run_id)]
    # Builds made (not reused), per revision, from the probe runs' build records.
    made = Counter(r.rev for r in records if r.kind == "build" and r.status in ("passed", "failed")
                   and not r.reused_artifact)
    tests = [r for r in records if r.kind == "test"]
    seconds = max(b.finished_at or 0.0 for b in rows) - min(b.created_at for b in rows)
    print(f"{len(rows)} failure(s) in {len({b.run_prefix for b in rows})} bisection(s): {len(runs)} probe runs, "
          f"{len(tests)} test jobs, {sum(made.values())} builds made ({len(made)} revisions, at most "
          f"{max(made.values(), default=0)} each), {seconds:.1f}s\n{out}")
    assert sorted(b.subject["case"] for b in rows) == sorted(GRID_CASES), out
    assert len({b.run_prefix for b in rows}) == 1, f"{len(rows)} bisections of one range, not one group"
    assert all(b.state == "found" and b.culprit_rev == culprit for b in rows), [(b.state, b.culprit_rev) for b in rows]
    assert all(b.detail["subject"] == "grid: a coarser step (faster)" and b.detail["confidence"] > 0.9 for b in rows)
    # Each record names its group: its first failure's id, the seven members, what the group spent.
    group = {b.detail["group"]["id"] for b in rows}
    assert len(group) == 1 and rows[-1].id in group, group
    assert all(sorted(b.detail["group"]["failures"]) == sorted(f"tap/{c}" for c in GRID_CASES) for b in rows)
    # Each revision was built at most once, and the count recorded is the one the probe runs show.
    assert made and max(made.values()) == 1, made
    assert all(b.detail["group"]["builds"] == sum(made.values()) for b in rows)
    # Every probe run judged all seven cases at once, in one test job (the suite's `only`).
    assert tests and all(sorted(c.name for c in r.cases) == sorted(GRID_CASES) for r in tests), \
        [[c.name for c in r.cases] for r in tests]
    assert len(tests) == len(runs) == rows[0].detail["group"]["jobs"]
    # Both ends four times, each middle twice: at most 4 middles in 15 commits.
    assert len(runs) <= 4 + 4 + 2 * 4, len(runs)
    # The report and the follow-up mail show the group: one line per failure, with its culprit.
    run_dir = f.state / "runs" / "g2"
    text = (run_dir / "report.txt").read_text()
    assert "BISECTION" in text and f"7 failures, 15 commits {revs[0][:12]}..{revs[-1][:12]}" in text, text
    msg = email.message_from_bytes((run_dir / "bisection.eml").read_bytes(), policy=email.policy.default)
    assert culprit[:10] in msg["Subject"] and "7 failures" in msg["Subject"], msg["Subject"]
    body = msg.get_body(preferencelist=("plain",)).get_content()
    assert all(f"tap/{c}: found, culprit {culprit}" in body for c in GRID_CASES), body
    assert all(f"tap/{c}: found, culprit {culprit}" in out for c in GRID_CASES), out


def test_two_groups_side_by_side_build_each_revision_once(farm: Farm) -> None:
    """Two groups of one target whose ranges overlap (first seen on different nights: bad ends
    commit 15 and 14), run at once by run_all: both start at commit 2 and meet again in the
    middle; a revision one of them is building is not built again by the other."""
    from gearfarm.bisection import driver
    from gearfarm.bisection.subject import TestSubject
    from gearfarm.s3.store import ArtifactStore

    f, revs = farm
    cfg = config_mod.load(f.config_path)
    db = ResultsDB(cfg.database.url)
    project = cfg.project("grid")
    found = [driver.Candidate(project, TARGET, (TestSubject("tap", "one"), TestSubject("tap", "two")), revs[1],
                              revs[14]),
             driver.Candidate(project, TARGET, (TestSubject("tap", "three"),), revs[1], revs[13])]
    said: list[str] = []
    out = driver.run_all(cfg, db, ArtifactStore(cfg.s3, retry_for=60), found, say=said.append)
    assert all(isinstance(rows, list) for rows in out), out
    rows = [b for group in out if isinstance(group, list) for b in group]
    assert len({b.run_prefix for b in rows}) == 2
    assert all(b.culprit_rev == revs[GRID_CULPRIT - 1] for b in rows), "\n".join(said)
    records = [(run.run_id, r) for run in _probe_runs(db, rows) for r in db.jobs(run.run_id)]
    made = Counter(r.rev for _, r in records if r.kind == "build" and not r.reused_artifact
                   and r.status in ("passed", "failed"))
    both = {r.rev for _, r in records if r.kind == "build"}
    print(f"two groups: {len(records)} probe jobs over {len(both)} revisions, builds made {dict(made)}")
    assert made and max(made.values()) == 1, made
    # They did run side by side: a probe job of each ran while one of the other did.
    jobs = {prefix: [r for run_id, r in records if run_id.startswith(prefix + ".") and r.started_at and r.finished_at]
            for prefix in {b.run_prefix for b in rows}}
    a, b = jobs.values()
    assert any(x.started_at < y.finished_at and y.started_at < x.finished_at for x in a for y in b)  # type: ignore[operator]
