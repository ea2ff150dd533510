"""The run's JUnit file (gearfarm.step.junit.write_run): what a case that says nothing shows."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gearfarm.formats.result import CaseResult, ResultRecord
from gearfarm.step import junit


def test_a_skip_without_a_reason_is_shown_as_skipped_not_as_the_jobs_status(tmp_path: Path) -> None:
    rec = ResultRecord(job_id="r:linux-x86_64:test-unit", run_id="r", target="linux-x86_64", kind="test",
                       step="test-unit", name="unit", rev="a" * 40, status="passed",
                       cases=[CaseResult(classname="unit", name="later", status="skipped", message=""),
                              CaseResult(classname="unit", name="why", status="skipped", message="no network"),
                              CaseResult(classname="unit", name="ok", status="passed")])
    out = tmp_path / "junit.xml"
    junit.write_run([rec], out)
    cases = {tc.get("name"): tc for tc in ET.parse(out).getroot().iter("testcase")}
    skipped = {n: tc.find("skipped") for n, tc in cases.items()}
    assert skipped["later"] is not None and skipped["later"].get("message") == "skipped"
    assert skipped["why"] is not None and skipped["why"].get("message") == "no network"
    assert skipped["ok"] is None
    assert ET.parse(out).getroot().find("testsuite").get("skipped") == "2"  # type: ignore[union-attr]


def test_a_time_that_is_no_number_a_record_keeps_reads_as_zero(tmp_path: Path) -> None:
    """A suite's JUnit may say any time; NaN and infinity are no time a record keeps (its model
    refuses them: the results database does not store them), so the case keeps 0 and the
    suite's record is made, as for a time that is not a number at all."""
    out = tmp_path / "junit.xml"
    out.write_text('<testsuite><testcase name="a" time="nan"/><testcase name="b" time="-inf"/>'
                   '<testcase name="c" time="Infinity"/><testcase name="d" time="x"/>'
                   '<testcase name="e" time="0.25"/><testcase name="f" time="1"/></testsuite>')
    cases = junit.parse(out)
    assert [(c.name, c.time) for c in cases] == [("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.0), ("e", 0.25),
                                                  ("f", 1.0)]
    ResultRecord(job_id="r:linux-x86_64:test-unit", run_id="r", target="linux-x86_64", kind="test",
                 step="test-unit", name="unit", rev="a" * 40, status="passed", cases=cases)
