"""Performance every night: paired A/B perf jobs measured alone on the host, change points over
the nightly series, and the report's performance section. A scripted sequence of nightlies over
a temporary engine repository in which one commit makes iiBench 20 % slower must name exactly
that commit. (The wall-clock version of the scenario is tests/scenario.py, run by
bench/perf_scenario.py.)"""

from __future__ import annotations

import email
import json
from email import policy
from pathlib import Path

import pytest

from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import commit, counted_iibench, gearfarm, make_repo, slow_down_inserts

TARGET = "linux-x86_64"
BENCH = counted_iibench(rows=20000, repetitions=1)


def report_of(state: Path, run_id: str) -> dict:  # type: ignore[type-arg]
    return json.loads((state / "runs" / run_id / "report.json").read_text())


@pytest.fixture(scope="module")
def perf_farm(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("perf")
    repo = make_repo(base / "repo")
    cat = repo / "jobs" / "catalog.toml"
    cat.write_text(cat.read_text() + BENCH)
    commit(repo, "a quick iibench for the nightly perf job")
    farm = EmbeddedFarm(base / "state", repo)
    farm.start(catalog_mod.load_file(repo / "jobs" / "catalog.toml"), [TARGET], roles=("build",), perf=True)
    yield repo, farm
    farm.stop()


def nightly(farm: EmbeddedFarm, run_id: str) -> None:
    p = gearfarm("nightly", "--config", str(farm.config_path), "--targets", TARGET, "--suites", "none",
                 "--benchmarks", "iibench-quick", "--run-id", run_id, timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert report_of(farm.state, run_id)["matrix"][TARGET]["perf-iibench-quick"]["status"] == "passed", p.stdout


def test_a_20_percent_slower_commit_is_named_as_the_first_bad_revision(perf_farm) -> None:  # type: ignore[no-untyped-def]
    repo, farm = perf_farm
    revs = {}
    for night in range(1, 7):
        revs[night] = commit(repo, f"night {night}: no performance change")
        nightly(farm, f"p{night}")
    slow_down_inserts(repo)
    revs[7] = commit(repo, "night 7: iibench 20% slower")
    nightly(farm, "p7")
    for night in (8, 9):
        revs[night] = commit(repo, f"night {night}: no further change")
        nightly(farm, f"p{night}")

    # No night before the slow commit carries an alarm.
    for night in range(1, 7):
        assert report_of(farm.state, f"p{night}")["performance"] == [], night
    alarms = [e for night in (7, 8, 9) for e in report_of(farm.state, f"p{night}")["performance"]]
    assert alarms, "the 20% regression was never reported"
    for e in alarms:
        assert (e["direction"], e["benchmark"]) == ("regression", "iibench-quick")
        assert e["first_bad_rev"] == revs[7] and e["last_good_rev"] == revs[6]
        assert e["ci_low"] <= e["change"] <= e["ci_high"]
    counted = [e for e in alarms if e["metric"] == "instructions"]
    assert counted and all(0.15 < e["change"] < 0.35 for e in counted), counted
    last = report_of(farm.state, "p9")
    assert last["headline"].startswith("1 performance regression")
    # Paired A/B: the perf job ran tonight's build against the last good one, and against the
    # reference build pinned on night 2 (night 1's, the last good build then) as a third side.
    job = next(j for j in last["jobs"] if j["step"] == "perf-iibench-quick")
    variants = {s["variant"] for s in job["samples"]}
    assert variants == {"new", "baseline", "reference", "ratio", "ref_ratio"}
    assert job["baseline_rev"] == revs[8] and job["reference_rev"] == revs[1]
    pinned = next(j for j in report_of(farm.state, "p2")["jobs"] if j["step"] == "perf-iibench-quick")
    # Pinned tonight: the reference is the baseline, measured once, its pairs' ratios both ways.
    assert pinned["reference_rev"] == pinned["baseline_rev"] == revs[1]
    assert {s["variant"] for s in pinned["samples"]} == {"new", "baseline", "ratio", "ref_ratio"}

    def ref_ratio(run_id: str) -> float:
        rec = next(j for j in report_of(farm.state, run_id)["jobs"] if j["step"] == "perf-iibench-quick")
        [r] = [s["value"] for s in rec["samples"] if s["variant"] == "ref_ratio" and s["metric"] == "instructions"]
        return r

    # Every night after the slow commit measures it again against the same reference.
    assert all(abs(ref_ratio(f"p{n}") - 1) < 0.05 for n in range(2, 7))
    assert all(1.15 < ref_ratio(f"p{n}") < 1.35 for n in (7, 8, 9))
    assert any("vs reference" in f for f in [(farm.state / "runs" / "p9" / "report.txt").read_text()])
    html = (farm.state / "runs" / "p9" / "report.html").read_text()
    assert 'id="performance"' in html and "<svg" in html
    msg = email.message_from_bytes((farm.state / "runs" / "p9" / "report.eml").read_bytes(), policy=policy.default)
    assert any(part.get_content_type() == "image/png" for part in msg.walk())

    # Marking the change as expected silences it.
    p = gearfarm("perf", "expect", "--config", str(farm.config_path), "--benchmark", "iibench-quick",
                 "--metric", "instructions", "--target", TARGET, "--rev", revs[7], "--note", "intended")
    assert p.returncode == 0, p.stderr
    p = gearfarm("report", "p9", "--config", str(farm.config_path))
    assert p.returncode == 0, p.stderr
    assert report_of(farm.state, "p9")["performance"] == []


def test_a_night_whose_binary_is_its_baseline_is_measured_alone_and_cannot_alarm(perf_farm) -> None:  # type: ignore[no-untyped-def]
    """A commit that leaves the engine alone: the perf job pairs tonight's build with the last
    good one, sees from the manifests that they are byte for byte the same binary, and the
    analysis takes the night as no change. The record says how quiet the host was."""
    repo, farm = perf_farm
    before = commit(repo, "a change that leaves the engine alone")
    nightly(farm, "s1")
    rev = commit(repo, "docs only: the engine is untouched")
    nightly(farm, "s2")
    rep = report_of(farm.state, "s2")
    assert rep["rev"] == rev
    (fig,) = [f for f in rep["perf_figures"] if f["metric"] == "instructions"]
    assert fig["baseline_identical"] is True and fig["baseline_rev"] == before and fig["pairs"] == 1
    assert [e for e in rep["performance"] if e["first_bad_run"] == "s2"] == []
    job = next(j for j in rep["jobs"] if j["step"] == "perf-iibench-quick")
    assert job["quietness"]["other_jobs_max"] == 0 and job["quietness"]["samples"] >= 2
    assert "Tonight's figures" in (farm.state / "runs" / "s2" / "report.html").read_text()
