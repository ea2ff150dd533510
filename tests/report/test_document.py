"""The run's report document (gearfarm.report.document): what its matrix says of a cell that
has no result, the test cases it counts, its templates kept compiled, and the modules a night
loads for it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gearfarm.db.results import Run
from gearfarm.formats.job import Source
from gearfarm.formats.result import ResultRecord
from gearfarm.night.sequence import report_modules
from gearfarm.report import document
from gearfarm.run.nightly import Plan

LINUX, WINDOWS = "linux-x86_64", "windows-x86_64"


def _record(target: str, step: str) -> ResultRecord:
    kind = "build" if step == "build" else "test"
    return ResultRecord(job_id=f"r1:{target}:{step}", run_id="r1", target=target, kind=kind, step=step,
                        name=None if kind == "build" else step.removeprefix("test-"), rev="a" * 40, status="passed",
                        started_at=1.0, finished_at=2.0)


def test_the_matrix_tells_a_missing_result_from_a_step_the_target_does_not_run() -> None:
    # Linux runs test-model and its result never came; Windows does not run test-model at all.
    expected = [f"r1:{LINUX}:build", f"r1:{LINUX}:test-unit", f"r1:{LINUX}:test-model",
                f"r1:{WINDOWS}:build", f"r1:{WINDOWS}:test-unit"]
    run = Run(run_id="r1", rev="a" * 40, created_at=0.0, finished_at=3.0, expected=expected,
              targets=[LINUX, WINDOWS], state="finished", notes={}, parent_run_id=None, project="engine")
    records = [_record(LINUX, "build"), _record(LINUX, "test-unit"), _record(WINDOWS, "build"),
               _record(WINDOWS, "test-unit"), _record(LINUX, "test-model")][:4]
    rep = document.build(run, records)
    assert rep.missing == [f"r1:{LINUX}:test-model"]
    assert rep.absent(LINUX, "test-model") == "missing" and rep.absent(WINDOWS, "test-model") == "n/a"
    text = document.render_text(rep)
    assert re.search(rf"^{LINUX} .* test-model=missing", text, re.M), text
    assert re.search(rf"^{WINDOWS} .* test-model=n/a", text, re.M), text
    html = document.render_html(rep)
    assert '<td class="missing" title="expected, no result">missing</td>' in html
    assert '<td class="na" title="not one of this target&#39;s steps">n/a</td>' in html


def test_the_report_and_the_mail_count_test_cases_per_suite_and_target() -> None:
    from gearfarm.formats.result import CaseResult

    def cases(passed: int, skipped: int) -> list[CaseResult]:
        return ([CaseResult(name=f"p{i}", status="passed") for i in range(passed)]
                + [CaseResult(name=f"s{i}", status="skipped") for i in range(skipped)])

    expected = [f"r1:{t}:{s}" for t in (LINUX, WINDOWS) for s in ("build", "test-unit")]
    run = Run(run_id="r1", rev="a" * 40, created_at=0.0, finished_at=3.0, expected=expected,
              targets=[LINUX, WINDOWS], state="finished", notes={}, parent_run_id=None, project="engine")
    records = [_record(LINUX, "build"), _record(WINDOWS, "build"),
               _record(LINUX, "test-unit").model_copy(update={"cases": cases(162, 1)}),
               _record(WINDOWS, "test-unit").model_copy(update={"cases": cases(160, 3)})]
    rep = document.build(run, records)
    # The headline counts what a reader counts: cases, not jobs.
    assert rep.headline == "all green: 322 passed, 4 skipped cases in 4 jobs on 2 targets", rep.headline
    text = document.render_text(rep)
    assert re.search(rf"^  test-unit +{LINUX} +162 passed, 1 skipped$", text, re.M), text
    assert re.search(rf"^  test-unit +{WINDOWS} +160 passed, 3 skipped$", text, re.M), text
    assert "<small>162 passed, 1 skipped</small>" in document.render_html(rep)
    assert "162 passed, 1 skipped" in document.render_mail_text([rep])
    # A build-only night has no cases to count: its jobs are.
    builds = Run(run_id="r1", rev="a" * 40, created_at=0.0, finished_at=3.0, expected=expected[::2],
                 targets=[LINUX, WINDOWS], state="finished", notes={}, parent_run_id=None, project="engine")
    assert document.build(builds, records[:2]).headline == "all green: 2 jobs on 2 targets passed"


def _rendered(rep: document.Report) -> str:
    document._env.cache.clear()  # type: ignore[union-attr]  # a new process: no template loaded yet
    return document.render_text(rep) + document.render_html(rep)


def test_a_nightly_compiles_the_report_templates_once_and_a_damaged_cache_loses_no_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling them was half of a 100-job night's report (docs/speed.md, thirty-first round),
    paid again by every nightly process; kept compiled, a broken cache must never cost a report."""
    monkeypatch.setenv("GEARFARM_CACHE", str(tmp_path / "cache"))
    compiled: list[str] = []
    real = document._env.compile
    monkeypatch.setattr(document._env, "compile", lambda source, name=None, *a, **k: compiled.append(name)
                        or real(source, name, *a, **k))
    run = Run(run_id="r1", rev="a" * 40, created_at=0.0, finished_at=3.0, expected=[f"r1:{LINUX}:build"],
              targets=[LINUX], state="finished", notes={}, parent_run_id=None, project="engine")
    rep = document.build(run, [_record(LINUX, "build")])
    first = _rendered(rep)
    kept = sorted((tmp_path / "cache" / "templates").iterdir())
    assert compiled and len(kept) == len(set(compiled)), (compiled, kept)
    compiled.clear()
    assert _rendered(rep) == first and compiled == [], f"compiled again: {compiled}"
    for f in kept:  # cut short, as by a full disk or a crash: Jinja's own reader raises on it
        f.write_bytes(f.read_bytes()[:20])
    assert _rendered(rep) == first and compiled, "a damaged cache failed the report or was read as code"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GEARFARM_CACHE", str(tmp_path / "file" / "cache"))  # no directory can be made there
    assert _rendered(rep) == first


def test_a_night_without_benchmarks_never_loads_the_plotting_and_statistics_modules() -> None:
    """The nightly loads its report's modules while the jobs run, on the cores they run on.
    scipy and matplotlib (the change points and the plots) were 1-1.5 s of that CPU in every
    night, needed only by a night that measures benchmarks. What a night without them loads
    leaves both out, checked in a fresh interpreter (a module of the report importing either at
    its top would bring it back); a night with a benchmark still loads them early."""
    def plan(benchmarks: list[str]) -> Plan:
        return Plan("r1", Source("engine", "a" * 40, "5" * 64, "6" * 64), [LINUX], {LINUX: ["unit"]},
                    {LINUX: benchmarks})

    tests_only = report_modules([plan([])])
    code = ("import importlib, sys\n"
            f"for m in {tests_only!r}: importlib.import_module(m)\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'scipy', 'matplotlib'}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    assert loaded == "[]", f"a night without benchmarks loads {loaded}"
    assert {"gearfarm.report.publisher", "gearfarm.report.document"} <= set(tests_only)
    with_benchmarks = report_modules([plan([]), plan(["btree"])])
    assert {"gearfarm.perf.changepoint", "gearfarm.perf.plot"} <= set(with_benchmarks)
