"""The run's report document (gearfarm.report.document): what its matrix says of a cell that
has no result."""

from __future__ import annotations

import re

from gearfarm.db.results import Run
from gearfarm.formats.result import ResultRecord
from gearfarm.report import document

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
