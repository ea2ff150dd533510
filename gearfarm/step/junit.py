"""Reading and writing JUnit XML: suites report through it, and the farm publishes the whole
run as one file a Jenkins job can read."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.parsers import expat
from xml.sax.saxutils import escape, quoteattr

from gearfarm.formats.result import CASES_MAX, CaseResult, ResultRecord


class JUnitError(ValueError):
    pass


# What one case keeps of its texts while the file streams by: a message's head, its output's
# tail (where a failure usually is); a record keeps 4,000 characters of either.
MESSAGE_KEEP = 8000
CHUNK = 1024 * 1024
_VERDICTS = (("failure", "failed"), ("error", "error"), ("skipped", "skipped"))


class Overflow:
    """The cases past CASES_MAX of a results file: counted by status, the first failures named,
    and summed up in one case at the end, failed when any of them failed."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.failed: list[str] = []

    def add(self, name: str, status: str) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        if status in ("failed", "error") and len(self.failed) < 10:
            self.failed.append(name)

    def case(self, classname: str) -> CaseResult | None:
        total = sum(self.counts.values())
        if not total:
            return None
        bad = self.counts.get("failed", 0) + self.counts.get("error", 0)
        said = ", ".join(f"{n} {st}" for st, n in sorted(self.counts.items()))
        message = (f"{total} more cases past the {CASES_MAX} a record keeps one by one: {said}"
                   + (f"; the first failed: {', '.join(self.failed)}" if self.failed else ""))
        return CaseResult(classname=classname, name=f"(cases past {CASES_MAX})", status="failed" if bad else "passed",
                          message=message[:4000])


class _Case:
    def __init__(self, attrs: dict[str, str]) -> None:
        self.attrs = attrs
        self.verdicts: dict[str, tuple[str, str]] = {}  # failure/error/skipped -> (message, text)
        self.output = {"system-out": "", "system-err": ""}  # each a tail of its elements' texts


class _Reader:
    """expat's handlers for a JUnit file read as it streams: one case held at a time, and of it
    only what a record keeps, so the worker's memory does not grow with the file (ElementTree
    held the whole tree: a 400 MiB file took the worker from 86 MB to 1.34 GB). Entity
    declarations are refused (defusedxml's rule: no billion laughs, no external entities)."""

    def __init__(self, on_case: Callable[[_Case], None]) -> None:
        self.on_case = on_case
        self.depth = 0
        self.case: _Case | None = None
        self.case_depth = 0
        self.child = ""  # the tag of the case's child being read (its direct children only)
        self.text: list[str] = []
        self.size = 0
        self.grandchild = False  # text after a child's first element is not its .text

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self.depth += 1
        if self.case is None:
            if tag == "testcase":
                self.case, self.case_depth = _Case(attrs), self.depth
            return
        if self.depth == self.case_depth + 1:
            self.child, self.text, self.size, self.grandchild = tag, [], 0, False
            if tag in ("failure", "error", "skipped") and tag not in self.case.verdicts:
                self.case.verdicts[tag] = (attrs.get("message") or "", "")
        elif self.depth > self.case_depth + 1:
            self.grandchild = True

    def data(self, text: str) -> None:
        if self.case is None or self.depth != self.case_depth + 1 or self.grandchild:
            return
        self.text.append(text)
        self.size += len(text)
        if self.size > 2 * MESSAGE_KEEP:  # a verdict keeps the head, an output the tail
            joined = "".join(self.text)
            joined = joined[:MESSAGE_KEEP] if self.child in self.case.verdicts else joined[-MESSAGE_KEEP:]
            self.text, self.size = [joined], len(joined)

    def end(self, tag: str) -> None:
        case = self.case
        if case is not None and self.depth == self.case_depth + 1:
            text = "".join(self.text)
            if self.child in case.verdicts and not case.verdicts[self.child][1]:
                case.verdicts[self.child] = (case.verdicts[self.child][0], text[:MESSAGE_KEEP])
            elif self.child in case.output:
                piece = text.strip()
                seen = case.output[self.child]
                case.output[self.child] = (f"{seen}\n{piece}" if seen else piece)[-MESSAGE_KEEP:]
            self.text, self.size = [], 0
        elif case is not None and self.depth == self.case_depth:
            self.case = None
            self.on_case(case)
        self.depth -= 1

    @staticmethod
    def refuse(*_: object) -> None:
        raise JUnitError("it declares an XML entity, which a JUnit file has no use for; the farm does not expand "
                         "entities (a few lines of them can expand to gigabytes)")


def parse(path: Path, *, limit: int | None = None, statuses: list[str] | None = None,
          truncated: bool = False) -> list[CaseResult]:
    """The cases of a JUnit file, read a chunk at a time (at most ``limit`` bytes of it). ctest's
    own verdict of each case (its ``status`` attribute) is appended to ``statuses`` when given.
    ``truncated``: the file is the head of a longer one (capped), so an end mid-element is
    expected: the cases complete before it are returned."""
    cases: list[CaseResult] = []
    overflow = Overflow()

    def on_case(c: _Case) -> None:
        if len(cases) >= CASES_MAX:  # counted only: a CaseResult costs ~1 KB and 15 us
            overflow.add(c.attrs.get("name", "?"), _status(c))
            return
        cases.append(_case(c))
        if statuses is not None:
            statuses.append(c.attrs.get("status", ""))

    reader = _Reader(on_case)
    parser = expat.ParserCreate()
    parser.buffer_text = True
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.data
    parser.EntityDeclHandler = reader.refuse
    parser.UnparsedEntityDeclHandler = reader.refuse
    parser.ExternalEntityRefHandler = reader.refuse  # type: ignore[assignment]
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    left = limit
    try:
        with open(path, "rb") as fh:
            while left is None or left > 0:
                chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    break
                left = None if left is None else left - len(chunk)
                parser.Parse(chunk, False)
            if not truncated and not (left is not None and left <= 0):
                parser.Parse(b"", True)
    except expat.ExpatError as e:
        if truncated:
            return _with(cases, overflow, statuses)
        raise JUnitError(f"cannot read JUnit XML {path.name}: {expat.ErrorString(e.code)}: line {e.lineno}, "
                         f"column {e.offset}") from e
    except OSError as e:
        raise JUnitError(f"cannot read JUnit XML {path.name}: {e}") from e
    except RecursionError as e:  # not expected of expat; a file must never crash the worker
        raise JUnitError(f"cannot read JUnit XML {path.name}: nested too deep") from e
    return _with(cases, overflow, statuses)


def _with(cases: list[CaseResult], overflow: Overflow, statuses: list[str] | None) -> list[CaseResult]:
    more = overflow.case("")
    if more is not None:
        cases.append(more)
        if statuses is not None:
            statuses.append("")
    return cases


def _status(c: _Case) -> str:
    return next((st for tag, st in _VERDICTS if tag in c.verdicts), "passed")


def _case(c: _Case) -> CaseResult:
    status, message = "passed", ""
    for tag, st in _VERDICTS:
        if tag in c.verdicts:
            first, text = c.verdicts[tag]
            status, message = st, first + ("\n" + text if text else "")
            break
    if status in ("failed", "error") and not message.strip():
        message = _output(c)
    try:
        t = float(c.attrs.get("time") or 0)
    except ValueError:
        t = 0.0
    if not math.isfinite(t):  # "nan", "inf": no time a record keeps (gearfarm.formats.result)
        t = 0.0
    return CaseResult(classname=c.attrs.get("classname", ""), name=c.attrs.get("name", "?"), status=status,
                      time=t, message=message.strip()[:4000])


def _output(c: _Case) -> str:
    """A failed case's own output, when its <failure> says nothing: ctest writes
    <failure message=""/> and puts what the test printed (its assertion, usually last) in
    <system-out>; other runners use <system-err>. The end is kept: that is where it failed."""
    text = "\n".join(c.output[tag] for tag in ("system-out", "system-err") if c.output[tag]).strip()
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
