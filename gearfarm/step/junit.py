"""Reading and writing JUnit XML: suites report through it, and the farm publishes the whole
run as one file a Jenkins job can read."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

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
        if not math.isfinite(t):  # "nan", "inf": no time a record keeps (gearfarm.formats.result)
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


# What an attribute's value cannot hold as it is: markup, quotes, control characters (as
# entities or \xNN), and what XML 1.0 has no character for. Most names hold none of them.
_UNSAFE = re.compile('[&<>"\x00-\x1f\ud800-\udfff\ufffe\uffff]')


def _attr(value: str) -> str:
    if not _UNSAFE.search(value):
        return f'"{value}"'
    return quoteattr(_text(value), {"\n": "&#10;", "\r": "&#13;", "\t": "&#09;"})


_KIND = {"failed": "failure", "error": "error", "skipped": "skipped"}


def write_run(records: list[ResultRecord], path: Path, cases: Mapping[str, Sequence[Sequence[Any]]] | None = None,
              not_run: tuple[str, str] | None = None) -> None:
    """One JUnit file for a whole run: a testsuite per (target, step), in the shape Jenkins'
    JUnit and xUnit plugins read (validated against the xUnit plugin's junit-10.xsd in the
    tests): failures and errors apart, skipped counted, times in seconds. ``cases``: job id ->
    its cases as (job id, classname, name, status, seconds, message) (gearfarm.db.cases.RunCases.every;
    default: each record's own). ``not_run``: (project, why) of a run whose project could not run
    at all, one error of its own (a CI job marked unstable must show why).

    Written as text, element by element, not through ElementTree: a 5,000-job night has
    200,000 cases, and building them as a tree and serialising it took 6 s (docs/speed.md)."""
    with path.open("w", encoding="utf-8") as out:
        out.write("<?xml version='1.0' encoding='utf-8'?>\n<testsuites>")
        if not_run is not None:
            project, why = not_run
            out.write(f'<testsuite name={_attr(project)} tests="1" failures="0" errors="1" skipped="0" time="0.000">'
                      f'<testcase classname={_attr(project)} name="not run" time="0.000"><error '
                      f'message={_attr(why[:200])} type="not_run">{escape(_text(why))}</error></testcase></testsuite>')
        for rec in sorted(records, key=lambda r: r.job_id):
            own = ([(rec.job_id, c.classname, c.name, c.status, c.time, c.message) for c in rec.cases]
                   if cases is None else cases.get(rec.job_id, []))
            counts = {"failure": 0, "error": 0, "skipped": 0}
            total = 0.0
            body = []
            for c in own or (None,):
                if c is None:
                    total += rec.duration or 0
                    head = (f"<testcase classname={_attr(rec.target)} name={_attr(rec.step)} "
                            f'time="{rec.duration or 0:.3f}"')
                    # A job that did not get to its tests (a failed build, a timeout, the farm's
                    # own trouble) is an error of the job, not a test's failure.
                    kind = {"passed": None, "skipped": "skipped", "failed": "failure"}.get(rec.status, "error")
                    msg, status = rec.message, rec.status
                else:
                    _, classname, name, status, secs, msg = c
                    total += secs
                    head = (f"<testcase classname={_attr(f'{rec.target}.{classname}')} name={_attr(name)} "
                            f'time="{secs:.3f}"')
                    kind = _KIND.get(status)
                if kind is None:
                    body.append(head + " />")
                    continue
                counts[kind] += 1
                # (with nothing said, the case's own status: a TAP "# SKIP" without a reason is
                # "skipped", not the job's "passed")
                first = _attr((msg or status)[:200])
                if kind == "skipped":
                    body.append(f"{head}><skipped message={first} /></testcase>")
                else:
                    body.append(f"{head}><{kind} message={first} type={_attr(status)}>{escape(_text(msg))}"
                                f"</{kind}></testcase>")
            out.write(f"<testsuite name={_attr(f'{rec.target}.{rec.step}')} tests=\"{len(own) or 1}\" "
                      f'failures="{counts["failure"]}" errors="{counts["error"]}" skipped="{counts["skipped"]}" '
                      f'time="{total:.3f}">')
            out.write("".join(body))
            out.write("</testsuite>")
        out.write("</testsuites>")
