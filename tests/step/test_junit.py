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
