"""The run's JUnit file (gearfarm.step.junit.write_run): what a case that says nothing shows; and
reading a suite's JUnit file (parse): streaming, bounded in memory and cases, entities refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gearfarm.formats.result import CASES_MAX, CaseResult, ResultRecord
from gearfarm.step import junit

ROOT = Path(__file__).resolve().parents[2]


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


# -- reading a suite's JUnit file: streaming, bounded, defused (issue #76, case 7) ---------------

BIG_CASE = ('<testcase classname="big" name="case {i}" time="0.5"><system-out>{out}</system-out>'
            '{verdict}</testcase>\n')


def write_big(path: Path, cases: int, out_bytes: int) -> int:
    """A JUnit file of ``cases`` cases, each with ``out_bytes`` of output; every 1000th fails."""
    out = "x" * (out_bytes - 1) + "\n"
    with path.open("w") as f:
        f.write('<?xml version="1.0"?>\n<testsuites><testsuite name="big">\n')
        for i in range(cases):
            verdict = '<failure message="boom">it failed</failure>' if i % 1000 == 999 else ""
            f.write(BIG_CASE.format(i=i, out=out, verdict=verdict))
        f.write("</testsuite></testsuites>\n")
    return path.stat().st_size


READER = """
import json, sys
from pathlib import Path
from gearfarm.step import junit
cases = junit.parse(Path(sys.argv[1]))
status = Path("/proc/self/status").read_text()
hwm = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"cases": len(cases), "failed": sum(c.status == "failed" for c in cases), "hwm_kib": hwm}))
"""


def test_a_400mib_junit_file_is_read_streaming_in_little_memory(tmp_path: Path) -> None:
    """ElementTree held the whole tree: reading this file took a process to 1.3 GB (VmHWM)."""
    path = tmp_path / "junit.xml"
    size = write_big(path, 4100, 100 * 1024)
    assert size > 400 * 1024 * 1024
    p = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    path.unlink()
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert (got["cases"], got["failed"]) == (4100, 4)
    assert got["hwm_kib"] < 120 * 1024, f"the reader peaked at {got['hwm_kib']} KiB"


def test_a_file_cut_at_its_cap_yields_the_cases_before_the_cut(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    write_big(path, 50, 1000)
    data = path.read_bytes()
    cut = data.index(b"case 20") + 3  # in the middle of case 20's start tag
    path.write_bytes(data[:cut])
    cases = junit.parse(path, truncated=True)
    assert [c.name for c in cases] == [f"case {i}" for i in range(20)]
    with pytest.raises(junit.JUnitError, match="cannot read JUnit XML junit.xml"):
        junit.parse(path)
    # A limit reads only the head of a file: the cases complete within it.
    path.write_bytes(data)
    assert len(junit.parse(path, limit=cut, truncated=True)) == 20


def test_entities_are_refused_so_a_billion_laughs_costs_nothing(tmp_path: Path) -> None:
    lol = ['<!ENTITY lol0 "lol">'] + [f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10)]
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0"?><!DOCTYPE t [{"".join(lol)}]>'
                    '<testsuite><testcase name="a"><failure message="&lol9;"/></testcase></testsuite>')
    t0 = time.monotonic()
    with pytest.raises(junit.JUnitError, match="declares an XML entity"):
        junit.parse(path)
    path.write_text('<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                    '<testsuite><testcase name="&x;"/></testsuite>')
    with pytest.raises(junit.JUnitError, match="declares an XML entity"):
        junit.parse(path)
    assert time.monotonic() - t0 < 5


def test_cases_past_the_records_limit_are_counted_and_no_failure_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    with path.open("w") as f:
        f.write("<testsuite>")
        for i in range(CASES_MAX + 10):
            bad = i >= CASES_MAX and (i - CASES_MAX) % 3 == 0
            f.write(f'<testcase name="t{i}">{"<failure/>" if bad else ""}</testcase>')
        f.write("</testsuite>")
    statuses: list[str] = []
    cases = junit.parse(path, statuses=statuses)
    assert len(cases) == len(statuses) == CASES_MAX + 1
    last = cases[-1]
    assert last.status == "failed" and last.name == f"(cases past {CASES_MAX})"
    assert last.message.startswith(f"10 more cases past the {CASES_MAX} a record keeps one by one: 4 failed, 6 passed")
    assert f"t{CASES_MAX}, t{CASES_MAX + 3}, t{CASES_MAX + 6}, t{CASES_MAX + 9}" in last.message
