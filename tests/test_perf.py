"""Performance every night: paired A/B perf jobs measured alone on the host, each night's
paired estimate, change points over the nightly series, and the report's performance section.
One repetition of the scripted wall-clock scenario (tests/scenario.py; bench/perf_scenario.py
runs ten): quiet nightlies, then a commit that makes iiBench's inserts 5 % slower, then more
nightlies — the slowdown must be named at its revision on the first night it is built, and no
quiet night may alarm."""

from __future__ import annotations

import email
import json
from email import policy
from pathlib import Path

import pytest

from tests.farmkit import commit, gearfarm
from tests.scenario import BENCHMARK, METRIC, TARGET, Scenario, describe


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    sc = Scenario(tmp_path_factory.mktemp("perf"))
    sc.start()
    yield sc
    sc.stop()


def test_a_5_percent_wall_clock_slowdown_is_named_on_its_first_night(scenario: Scenario) -> None:
    result = scenario.repetition(quiet=4, after=1)
    table = "\n".join(describe(n) for n in result["nights"])
    print(table)
    assert result["false_alarms"] == [], table
    assert result["flagged"], table
    slow = result["slow"]
    (alarm,) = [e for e in slow.alarms if e["first_bad_rev"] == slow.rev]
    previous = scenario.nights[scenario.nights.index(slow) - 1]
    assert alarm["last_good_rev"] == previous.rev
    assert alarm["ci_low"] <= alarm["change"] <= alarm["ci_high"] < 0
    # The night's figure is the paired estimate with its interval, over the catalog's pairs.
    fig = slow.figure
    assert fig and fig["pairs"] == scenario.pairs and fig["baseline_rev"] == previous.rev
    assert fig["ci_low"] <= fig["change"] <= fig["ci_high"] < 0
    assert fig["baseline_identical"] is False

    state = scenario.farm.state  # type: ignore[union-attr]
    rep = json.loads((state / "runs" / slow.run_id / "report.json").read_text())
    assert rep["headline"].startswith("1 performance regression")
    job = next(j for j in rep["jobs"] if j["step"] == f"perf-{BENCHMARK}")
    assert {s["variant"] for s in job["samples"]} == {"new", "baseline", "ratio"}
    # Measured alone: the record says no other farm job ran while it measured.
    assert job["quietness"]["other_jobs_max"] == 0 and job["quietness"]["samples"] >= 2
    html = (state / "runs" / slow.run_id / "report.html").read_text()
    assert 'id="performance"' in html and "<svg" in html and 'id="figures"' in html
    msg = email.message_from_bytes((state / "runs" / slow.run_id / "report.eml").read_bytes(),
                                   policy=policy.default)
    assert any(part.get_content_type() == "image/png" for part in msg.walk())

    # Marking the change as expected silences it.
    cfg = str(scenario.farm.config_path)  # type: ignore[union-attr]
    p = gearfarm("perf", "expect", "--config", cfg, "--benchmark", BENCHMARK, "--metric", METRIC,
                 "--target", TARGET, "--rev", slow.rev, "--note", "intended")
    assert p.returncode == 0, p.stderr
    p = gearfarm("report", slow.run_id, "--config", cfg)
    assert p.returncode == 0, p.stderr
    rep = json.loads((state / "runs" / slow.run_id / "report.json").read_text())
    assert [e for e in rep["performance"] if e["first_bad_rev"] == slow.rev] == []


def test_a_night_whose_binary_is_its_baseline_cannot_alarm(scenario: Scenario) -> None:
    """A commit that leaves the engine alone: the perf job pairs tonight's build with the last
    good one, sees from the manifests that they are byte for byte the same binary, and the
    analysis takes the night as no change whatever its figures say."""
    last = scenario.nights[-1]
    rev = commit(scenario.repo, "docs only: the engine is untouched")
    cfg = str(scenario.farm.config_path)  # type: ignore[union-attr]
    p = gearfarm("nightly", "--config", cfg, "--targets", TARGET, "--suites", "none", "--benchmarks", BENCHMARK,
                 "--run-id", "same-binary", timeout=900)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    state: Path = scenario.farm.state  # type: ignore[union-attr]
    rep = json.loads((state / "runs" / "same-binary" / "report.json").read_text())
    assert rep["rev"] == rev
    (fig,) = [f for f in rep["perf_figures"] if f["metric"] == METRIC]
    assert fig["baseline_identical"] is True and fig["baseline_rev"] == last.rev
    assert [e for e in rep["performance"] if e["first_bad_run"] == "same-binary"] == []
