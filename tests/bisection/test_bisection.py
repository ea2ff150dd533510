"""Bisection on a real farm (issue #16): small C projects of 16 commits, built, tested and
measured by the embedded farm's workers through gearmand and MinIO. A test broken at commit 11
is bisected to commit 11 with at most 6 builds made (reused builds not counted, counted from the
probe runs' build records); a test that fails at random on 30 % of runs is reported flaky and no
middle revision is ever probed for it; a 5 % wall-clock slowdown planted at commit 6 is bisected
to commit 6 on this noisy 2-core machine, and a range with no change gives no culprit; the
probe runs stay out of the nightly runs. A nightly's two new failures of one range, broken by
two different commits, are one group whose failures each name their own culprit."""

from __future__ import annotations

import email
import email.policy
import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.hosts import process
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.store import ArtifactStore
from tests.bisect_projects import CATALOG, SPIN_CATALOG, calc_repo, nightly, spin_repo
from tests.farmkit import gearfarm, start_web

TARGET = "linux-x86_64"
Farm = tuple[EmbeddedFarm, dict[str, list[str]]]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    base = tmp_path_factory.mktemp("bisection")
    revs = {"calc": calc_repo(base / "calc"), "spin": spin_repo(base / "spin")}
    f = EmbeddedFarm(base / "state", base / "calc",
                     projects=[ProjectConfig(name=n, repo=str(base / n), catalog=".gearfarm/catalog.toml")
                               for n in revs])
    f.start([catalog_mod.parse(CATALOG, "calc"), catalog_mod.parse(SPIN_CATALOG, "spin")], [TARGET], perf=True)
    try:
        yield f, revs
    finally:
        f.stop()


def _bisect(f: EmbeddedFarm, project: str, good: str, bad: str, *what: str) -> tuple[int, str]:
    p = gearfarm("bisect", f"{good}..{bad}", *what, "--project", project, "--target", TARGET,
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


def test_a_test_failing_at_random_is_reported_flaky_and_not_bisected(farm: Farm) -> None:
    f, repos = farm
    revs = repos["calc"]
    code, out = _bisect(f, "calc", revs[0], revs[-1], "--test", "chance/coin")
    assert code == 1, out
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    b = db.bisections(project="calc")[0]
    assert b.state == "flaky" and b.culprit_rev is None, out
    statuses = {p["rev"]: p["statuses"] for p in b.detail["probes"]}
    both = any("passed" in s and "failed" in s for s in statuses.values())
    middle = set(statuses) - {revs[0], revs[-1]}
    if middle:
        # The ends looked clean: four passes at the good end and four failures at the bad one
        # (0.7^4 x 0.3^4 = 0.2 % of the time). Then the search went on, and a middle revision
        # showed the coin: nothing was blamed.
        assert set(statuses[revs[0]]) == {"passed"} and set(statuses[revs[-1]]) == {"failed"}, statuses
        assert both, statuses
        return
    # Only the ends were run. Either it passed and failed at one of them; or (0.7^8 = 6 % of the
    # time) it passed all eight runs, and its failure at the first bad revision did not come back;
    # or (0.3^4 x 0.7^4 = 0.2 %) it failed all four at the good end and passed all four at the bad.
    assert both or ("failed" not in statuses[revs[-1]] and "did not come back" in out) \
        or (set(statuses[revs[0]]) == {"failed"} and f"{revs[0][:12]} (last good) judged bad on repetition" in out), \
        statuses
    assert "flaky" in out


def test_a_test_broken_at_commit_11_is_bisected_to_it_with_at_most_6_builds(farm: Farm) -> None:
    f, repos = farm
    revs = repos["calc"]
    # Only the named case is judged: mul, broken at commit 5, does not matter here.
    code, out = _bisect(f, "calc", revs[0], revs[-1], "--test", "tap/add")
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
    # Every probe ran the failing case alone (the suite's `only`), not the whole suite.
    probed = [r for run in db.runs(limit=500, reruns=True) if run.parent_run_id == b.run_prefix
              for r in db.jobs(run.run_id) if r.kind == "test"]
    assert probed and all([c.name for c in r.cases] == ["add"] for r in probed), [r.cases for r in probed]
    # The verdicts on either side of the culprit: its parent passed every run, it failed every run.
    by_rev = {p["rev"]: p for p in b.detail["probes"]}
    assert set(by_rev[revs[9]]["statuses"]) == {"passed"} and set(by_rev[revs[10]]["statuses"]) == {"failed"}
    assert f"tap/add: found, culprit {revs[10]}" in out
    # Probe runs are children of the bisection: never a nightly run.
    assert not db.runs(limit=500)


def test_a_5_percent_wall_clock_slowdown_is_bisected_to_its_commit(farm: Farm) -> None:
    f, repos = farm
    revs = repos["spin"]
    code, out = _bisect(f, "spin", revs[0], revs[-1], "--benchmark", "spin", "--metric", "ops_per_sec")
    print(out)
    assert code == 0, out
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    b = db.bisections(project="spin")[0]
    assert b.state == "found" and b.culprit_rev == revs[5], out
    assert b.detail["subject"] == "work: one more mixing step per round (safer)"
    by_rev = {p["rev"]: p for p in b.detail["probes"]}
    # The first bad end differs from the known-good build by about the planted 5 % (slower).
    assert by_rev[revs[-1]]["result"] == "different" and -0.09 < by_rev[revs[-1]]["change"] < -0.02
    assert by_rev[revs[5]]["verdict"] == "bad" and by_rev[revs[4]]["verdict"] == "good"


def test_a_range_with_no_change_has_no_culprit(farm: Farm) -> None:
    f, repos = farm
    revs = repos["spin"]
    code, out = _bisect(f, "spin", revs[0], revs[4], "--benchmark", "spin", "--metric", "ops_per_sec")
    print(out)
    assert code == 1, out
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    b = db.bisections(project="spin")[0]
    assert b.state == "no_culprit" and b.culprit_rev is None, out
    # Nothing in between was judged: the first bad end is the same as the good build.
    assert {p["rev"] for p in b.detail["probes"]} == {revs[0], revs[4]}


def test_a_nightly_bisects_two_failures_with_two_culprits_as_one_group(farm: Farm) -> None:
    """Nightly n1 at commit 2, nightly n2 at commit 16: mul (broken at 5) and add (broken at 11)
    are new failures of one range, confirmed by their re-runs; the nightly bisects them as one
    group (one probe run judges both), each names its own culprit, and the report and the
    follow-up mail show the group. (Not from commit 1: the range c01..c16 of add was bisected
    by hand above, and a range is bisected once.)"""
    f, repos = farm
    revs = repos["calc"]
    for run_id, rev in (("n1", revs[1]), ("n2", revs[-1])):
        p = nightly(f.config_path, "calc", rev, run_id)
        assert p.returncode == (0 if run_id == "n1" else 1), p.stdout + p.stderr
    out = p.stdout + p.stderr
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    found = {b.subject["case"]: b for b in db.bisections(origin_run_ids=["n2"])}
    assert sorted(found) == ["add", "mul"], out
    assert found["mul"].culprit_rev == revs[4] and found["add"].culprit_rev == revs[10], out
    # One group: one search, whose probe runs ran both cases at once; no revision built twice.
    assert found["mul"].run_prefix == found["add"].run_prefix, out
    assert found["mul"].detail["group"]["failures"] == found["add"].detail["group"]["failures"]
    probed = [r for run in db.runs(limit=500, reruns=True) if run.parent_run_id == found["add"].run_prefix
              for r in db.jobs(run.run_id)]
    assert all(sorted(c.name for c in r.cases) == ["add", "mul"] for r in probed if r.kind == "test")
    built, reused = _probe_builds(db, found["add"].run_prefix)
    assert len(built) == len(set(built)) == found["add"].detail["builds"], built
    print(f"one group, two culprits: {len(built)} builds made, {len(reused)} reused, "
          f"{found['add'].detail['group']['runs']} probe runs")
    # The report now holds both, and the follow-up mail names both culprits.
    run_dir = f.state / "runs" / "n2"
    text = (run_dir / "report.txt").read_text()
    assert "BISECTION" in text and revs[4] in text and revs[10] in text and "2 failures, 14 commits" in text
    # Between the two culprits the failures disagree: the group's evidence says which is which.
    assert "mixed good: tap/add; bad: tap/mul" in text, text
    assert "calc: mul rounds (faster)" in text and "calc: add rounds up past one (faster)" in text
    msg = email.message_from_bytes((run_dir / "bisection.eml").read_bytes(), policy=email.policy.default)
    assert revs[4][:10] in msg["Subject"] and revs[10][:10] in msg["Subject"], msg["Subject"]
    assert (run_dir / "report.eml").exists()  # the nightly's own message, sent before
    body = msg.get_body(preferencelist=("plain",)).get_content()
    assert "culprit " + revs[10] in body and "culprit " + revs[4] in body, body
    # The dashboard's run page and its JSON show them too.
    proc, url = start_web(f.config_path, f.state / "web.log")
    try:
        api = json.load(urllib.request.urlopen(f"{url}/api/run/n2", timeout=30))
        page = urllib.request.urlopen(f"{url}/run/n2", timeout=30).read().decode()
    finally:
        process.stop(proc, timeout=10)
    assert {b["what"]: b["culprit"] for b in api["bisections"]} == {"tap/add": revs[10], "tap/mul": revs[4]}
    assert 'id="bisection"' in page and "calc: mul rounds (faster)" in page and revs[10][:12] in page


def test_a_bisection_that_cannot_start_says_what_to_fix(farm: Farm) -> None:
    f, repos = farm
    revs = repos["calc"]
    cases = [((revs[-1], revs[0], "--test", "tap/add"), "is not an ancestor of"),
             ((revs[0], revs[-1], "--test", "nosuch/add"), "does not run suite 'nosuch'; its suites: tap, chance"),
             ((revs[0], revs[-1], "--benchmark", "spin", "--metric", "x"),
              "unknown benchmark 'spin'; known benchmarks: none"),
             ((revs[0], revs[-1]), "say what to bisect: --test SUITE/NAME, or --benchmark NAME with --metric")]
    db = ResultsDB(config_mod.load(f.config_path).database.url)
    before = len(db.bisections(project="calc"))
    for args, message in cases:
        code, out = _bisect(f, "calc", *args)
        assert code == 2 and message in out, out
    assert len(db.bisections(project="calc")) == before  # nothing recorded, nothing run


def test_a_bisection_after_pruning_finds_its_culprit_from_kept_builds_and_rebuilds(farm: Farm) -> None:
    """Pruned as of two months from now, the store keeps the revisions earlier bisections judged
    and loses the rest; bisecting spin again over another range (from commit 2) reuses the kept
    builds, rebuilds the pruned ones from the repository, and names commit 6 again."""
    f, repos = farm
    revs = repos["spin"]
    cfg = config_mod.load(f.config_path)
    db = ResultsDB(cfg.database.url)
    if not db.bisections(project="spin"):  # run alone (-k): judge some revisions first
        assert _bisect(f, "spin", revs[0], revs[-1], "--benchmark", "spin", "--metric", "ops_per_sec")[0] == 0
    judged = {p["rev"] for b in db.bisections(project="spin") for p in b.detail["probes"]}
    p = gearfarm("store", "prune", "--config", str(f.config_path), "--as-of", str(time.time() + 60 * 86400))
    assert p.returncode == 0, p.stdout + p.stderr
    store = ArtifactStore(cfg.s3, retry_for=10)
    stored = {rev for rev in revs if any(store.list(f"artifacts/{rev}/"))}
    assert stored == judged & set(revs), f"after pruning, builds of {sorted(stored)}; judged {sorted(judged)}"
    assert revs[1] not in stored
    code, out = _bisect(f, "spin", revs[1], revs[-1], "--benchmark", "spin", "--metric", "ops_per_sec")
    assert code == 0, out
    b = db.bisections(project="spin")[0]
    assert b.state == "found" and b.culprit_rev == revs[5], out
    built, reused = _probe_builds(db, b.run_prefix)
    print(f"after pruning: {len(set(built))} revisions rebuilt, {len(set(reused))} kept builds reused\n{out}")
    assert set(built) and set(built).isdisjoint(stored) and revs[1] in built
    assert set(reused) and set(reused) <= stored | set(built)
