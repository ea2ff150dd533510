"""Reading and writing JUnit XML: suites report through it, and the farm publishes the whole
run as one file a Jenkins job can read."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gearfarm.formats.result import CaseResult, ResultRecord


class JUnitError(ValueError):
    pass


def parse(path: Path) -> list[CaseResult]:
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        raise JUnitError(f"cannot read JUnit XML {path.name}: {e}") from e
    cases: list[CaseResult] = []
    for tc in root.iter("testcase"):
        status = "passed"
        message = ""
        for tag, st in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = tc.find(tag)
            if el is not None:
                status = st
                message = (el.get("message") or "") + ("\n" + el.text if el.text else "")
                break
        if status in ("failed", "error") and not message.strip():
            message = _output(tc)
        try:
            t = float(tc.get("time") or 0)
        except ValueError:
            t = 0.0
        cases.append(CaseResult(classname=tc.get("classname", ""), name=tc.get("name", "?"),
                                status=status, time=t, message=message.strip()[:4000]))
    return cases


def _output(tc: ET.Element) -> str:
    """A failed case's own output, when its <failure> says nothing: ctest writes
    <failure message=""/> and puts what the test printed (its assertion, usually last) in
    <system-out>; other runners use <system-err>. The end is kept: that is where it failed."""
    text = "\n".join((el.text or "").strip() for tag in ("system-out", "system-err") for el in tc.findall(tag))
    text = text.strip()
    return text if len(text) <= 4000 else "…" + text[-3999:]


# XML 1.0 allows tab, newline, carriage return and these ranges only: a suite's output with a
# stray control byte would otherwise make the whole file unreadable to Jenkins.
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    """``value`` with characters XML cannot carry shown as \\xNN (so nothing vanishes unseen)."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", value)


def write_run(records: list[ResultRecord], path: Path) -> None:
    """One JUnit file for a whole run: a testsuite per (target, step), in the shape Jenkins'
    JUnit and xUnit plugins read (validated against the xUnit plugin's junit-10.xsd in the
    tests): failures and errors apart, skipped counted, times in seconds."""
    root = ET.Element("testsuites")
    for rec in sorted(records, key=lambda r: r.job_id):
        suite = ET.SubElement(root, "testsuite", name=f"{rec.target}.{rec.step}")
        cases = rec.cases or [None]
        counts = {"failure": 0, "error": 0, "skipped": 0}
        total = 0.0
        for c in cases:
            if c is None:
                total += rec.duration or 0
                el = ET.SubElement(suite, "testcase", classname=f"{rec.target}", name=rec.step,
                                   time=f"{rec.duration or 0:.3f}")
                # A job that did not get to its tests (a failed build, a timeout, the farm's own
                # trouble) is an error of the job, not a test's failure.
                kind = {"passed": None, "skipped": "skipped", "failed": "failure"}.get(rec.status, "error")
                msg = rec.message
            else:
                total += c.time
                el = ET.SubElement(suite, "testcase", classname=f"{rec.target}.{c.classname}", name=_text(c.name),
                                   time=f"{c.time:.3f}")
                kind = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(c.status)
                msg = c.message
            if kind is None:
                continue
            counts[kind] += 1
            # (with nothing said, the case's own status: a TAP "# SKIP" without a reason is
            # "skipped", not the job's "passed")
            child = ET.SubElement(el, kind, message=_text((msg or (rec.status if c is None else c.status))[:200]))
            if kind != "skipped":
                child.set("type", rec.status if c is None else c.status)
                child.text = _text(msg)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(counts["failure"]))
        suite.set("errors", str(counts["error"]))
        suite.set("skipped", str(counts["skipped"]))
        suite.set("time", f"{total:.3f}")
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
