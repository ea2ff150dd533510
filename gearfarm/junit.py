"""Reading and writing JUnit XML: suites report through it, and the farm publishes the whole
run as one file a Jenkins job can read."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gearfarm.result import CaseResult, ResultRecord


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
        try:
            t = float(tc.get("time") or 0)
        except ValueError:
            t = 0.0
        cases.append(CaseResult(classname=tc.get("classname", ""), name=tc.get("name", "?"),
                                status=status, time=t, message=message.strip()[:4000]))
    return cases


def write_run(records: list[ResultRecord], path: Path) -> None:
    """One JUnit file for a whole run: a testsuite per (target, step)."""
    root = ET.Element("testsuites")
    for rec in sorted(records, key=lambda r: r.job_id):
        suite = ET.SubElement(root, "testsuite", name=f"{rec.target}.{rec.step}")
        cases = rec.cases or [None]
        fails = 0
        for c in cases:
            if c is None:
                el = ET.SubElement(suite, "testcase", classname=f"{rec.target}", name=rec.step,
                                   time=f"{rec.duration or 0:.3f}")
                bad, msg = rec.status not in ("passed", "skipped"), rec.message
                if rec.status == "skipped":
                    ET.SubElement(el, "skipped", message=rec.message)
            else:
                el = ET.SubElement(suite, "testcase", classname=f"{rec.target}.{c.classname}", name=c.name,
                                   time=f"{c.time:.3f}")
                bad, msg = c.status in ("failed", "error"), c.message
                if c.status == "skipped":
                    ET.SubElement(el, "skipped")
            if bad:
                fails += 1
                ET.SubElement(el, "failure", message=(msg or rec.status)[:200]).text = msg
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(fails))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
