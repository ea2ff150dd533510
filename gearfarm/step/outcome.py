"""What a step's output says: the test cases of a suite run and the metrics of a benchmark run.

The catalog runs commands of any build system, so results arrive in several shapes: a JUnit XML
file (pytest, ctest --output-junit, most xUnit runners), TAP on stdout or in a file, nothing but
an exit status, a metrics JSON file or lines a benchmark prints. Every error names the file or
pattern, what is wrong and the fix, because the person reading it edits the catalog, not this code.
"""

from __future__ import annotations

import json
import math
import re
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tap.line import Result
from tap.parser import Parser

from gearfarm.formats.catalog import compile_pattern
from gearfarm.formats.result import CASES_MAX, CaseResult
from gearfarm.hosts import jobtree
from gearfarm.step import junit


class OutcomeError(ValueError):
    """A step's results are missing or unreadable, or its catalog entry cannot describe them."""


FORMATS = ("junit", "tap", "ctest", "exit-code")

DIAGNOSTICS_MAX = 2000
LOG_TAIL_LINES = 40
LOG_TAIL_MAX = 4000
# tap.py's own patterns are loose for a log that mixes TAP with compiler and test chatter:
# "^ok" accepts "okay" and "^1..N" accepts "10045 bytes". Lines must look like TAP first.
_TAP_RESULT = re.compile(r"^(?:not )?ok(?:\s|$)")
_TAP_PLAN = re.compile(r"^1\.\.\d+\s*(?:#|$)")
_YAML_START = re.compile(r"^(\s+)---\s*$")
# ctest reports a test it could not start as <skipped>, yet counts it as failed (exit status 8);
# only these messages are real skips (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION).
_CTEST_SKIP = re.compile(r"^SKIP_")


def cases(fmt: str, suite: str, *, rc: int, output: Path, results: Path | None,
          capped: bool = False) -> list[CaseResult]:
    """The test cases of one suite run, read as its catalog `format` says (see FORMATS).

    `output` is the step's captured stdout+stderr; `results` the file the suite writes, if any
    (the worker's capped copy of it: gearfarm.step.runner; ``capped``: the head of a longer file).
    A nonzero exit status is never lost: when no case explains it, a failed "<suite> (exit status)"
    case does (a crash after the last test, a sanitizer report, a coverage threshold).
    """
    if fmt == "exit-code":
        return [_exit_case(suite, suite, rc, output)]
    if fmt == "junit":
        found = _junit_cases(suite, rc, results, ctest=False, capped=capped)
    elif fmt == "ctest":
        found = _junit_cases(suite, rc, results, ctest=True, capped=capped)
    elif fmt == "tap":
        found = _tap_cases(suite, rc, output, results)
    else:
        raise OutcomeError(f"unknown result format {fmt!r} of suite {suite!r}: use one of {', '.join(FORMATS)}")
    if rc != 0 and not any(c.status in ("failed", "error") for c in found):
        found.append(_exit_case(suite, f"{suite} (exit status)", rc, output))
    return found


# -- exit status --------------------------------------------------------------------------------


def _exited(rc: int) -> str:
    if rc < 0:
        try:
            return f"exited {rc} (killed by {signal.Signals(-rc).name})"
        except ValueError:
            pass
    return f"exited {rc}"


def _log_tail(output: Path) -> str:
    try:
        with open(output, encoding="utf-8", errors="replace") as fh:
            tail = "".join(deque(fh, maxlen=LOG_TAIL_LINES))
    except OSError:
        return ""
    # The end of the log is where the failure is: cut from the front.
    return tail.rstrip()[-LOG_TAIL_MAX:]


def _exit_case(classname: str, name: str, rc: int, output: Path) -> CaseResult:
    if rc == 0:
        return CaseResult(classname=classname, name=name, status="passed")
    tail = _log_tail(output)
    message = _exited(rc) + (f"; last lines of the log:\n{tail}" if tail else "")
    return CaseResult(classname=classname, name=name, status="failed", message=message)


# -- JUnit and ctest ----------------------------------------------------------------------------


def _junit_cases(suite: str, rc: int, results: Path | None, *, ctest: bool, capped: bool) -> list[CaseResult]:
    if results is None:
        raise OutcomeError(f"suite {suite!r} has format {'ctest' if ctest else 'junit'} but no results file: "
                           f"set its `results` key in the catalog (default \"{{junit}}\")")
    if not results.is_file():
        if ctest:
            raise OutcomeError(f"ctest wrote no JUnit file at {results} for suite {suite!r} ({_exited(rc)}): "
                               f"writing JUnit needs ctest >= 3.21 and `--output-junit {{junit}}` in the suite's "
                               f"argv (the default argv has it)")
        raise OutcomeError(f"suite {suite!r} wrote no JUnit file at {results} ({_exited(rc)}): check the catalog's "
                           f"`results` key of the suite and that its argv writes the file there "
                           f"(e.g. pytest --junitxml={{junit}})")
    statuses: list[str] = []
    try:
        found = junit.parse(results, statuses=statuses, truncated=capped)
    except junit.JUnitError as e:
        raise OutcomeError(f"suite {suite!r}: {e}: the suite must write JUnit XML to its `results` file") from e
    if ctest:
        found = _ctest_verdicts(statuses, found)
        if not found:
            raise OutcomeError(f"ctest found no tests for suite {suite!r} ({results} has no test cases): is `cwd` "
                               f"of the suite the CMake build directory, and do the build outputs include its "
                               f"CTestTestfile.cmake files (e.g. \"build/**\")?")
    # ctest's classname repeats the test name, and some runners leave it empty: the suite is
    # what the report groups by.
    return [c if c.classname and not ctest else c.model_copy(update={"classname": suite}) for c in found]


def _ctest_verdicts(statuses: list[str], found: list[CaseResult]) -> list[CaseResult]:
    """ctest's own verdicts (each case's ``status`` attribute) where its JUnit says otherwise: a
    test it could not run (executable or required file missing) counts as failed, a DISABLED
    test has no <skipped> but did not run."""
    out = []
    for case, status in zip(found, statuses, strict=True):
        if status == "disabled":
            case = case.model_copy(update={"status": "skipped", "message": case.message or "disabled"})
        elif case.status == "skipped" and status == "notrun" and not _CTEST_SKIP.match(case.message):
            case = case.model_copy(update={"status": "error", "message": f"not run: {case.message}"})
        out.append(case)
    return out


# -- TAP ----------------------------------------------------------------------------------------


class _Test:
    def __init__(self, result: Result, number: int) -> None:
        self.result = result
        self.number = number
        self.diagnostics: list[str] = []


def _tap_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            yield line.rstrip()


def _tap_cases(suite: str, rc: int, output: Path, results: Path | None) -> list[CaseResult]:
    source = results if results is not None else output
    if not source.is_file():
        where = f"no TAP file at {source}: check the catalog's `results` key of the suite (\"stdout\" for its output)"
        if results is None:
            where = f"no output log at {source}"
        raise OutcomeError(f"suite {suite!r} printed no TAP ({where}) (format = \"tap\")")
    parser = Parser()
    tests: list[_Test] = []
    plans: list[int] = []
    skip_all = ""
    bail: str | None = None
    current: _Test | None = None  # the test that following diagnostics belong to
    yaml_indent: str | None = None
    just_tested = False
    overflow, ran = junit.Overflow(), 0
    for line in _tap_lines(source):
        if yaml_indent is not None:
            if line.strip() == "...":
                yaml_indent = None
                continue
            if line.startswith(yaml_indent) or not line.strip():
                assert current is not None
                current.diagnostics.append(line[len(yaml_indent):])
                continue
            yaml_indent = None
        if just_tested and current is not None and (m := _YAML_START.match(line)):
            yaml_indent = m.group(1)
            just_tested = False
            continue
        just_tested = False
        if not (_TAP_RESULT.match(line) or _TAP_PLAN.match(line) or line.startswith(("#", "Bail out!"))):
            continue  # not TAP: the program's other output
        parsed = parser.parse_line(line)
        if isinstance(parsed, Result):
            ran += 1
            if len(tests) >= CASES_MAX:  # counted, not kept: each kept case costs the worker ~1 KB
                over = _tap_case(suite, _Test(parsed, ran))
                overflow.add(parsed.description or f"test {ran}", over.status)
                current = None
                continue
            current = _Test(parsed, parsed.number if parsed.number is not None else len(tests) + 1)
            tests.append(current)
            just_tested = True
        elif parsed.category == "diagnostic":
            if current is not None:
                current.diagnostics.append(re.sub(r"^#\s?", "", line))
        elif parsed.category == "plan":
            plans.append(parsed.expected_tests)
            if parsed.expected_tests == 0:
                skip_all = (parsed.directive.reason or "").strip() if parsed.directive.skip else ""
            current = None  # summaries after a trailing plan ("# pass 4") belong to no test
        elif parsed.category == "bail":
            bail = parsed.reason.strip()
            break  # a producer that bailed out says nothing reliable after it
    if not plans and not tests and bail is None:
        raise OutcomeError(f"suite {suite!r} printed no TAP: no plan (1..N) and no 'ok'/'not ok' lines in {source} "
                           f"({_exited(rc)}) (format = \"tap\"): make the suite print TAP there, or pick the "
                           f"format that fits it ({', '.join(f for f in FORMATS if f != 'tap')})")
    found = _named([_tap_case(suite, t) for t in tests], tests)
    if (more := overflow.case(suite)) is not None:
        found.append(more)
    problems = []
    if bail is not None:
        problems.append(f"Bail out! {bail}".rstrip())
    expected = sum(plans)
    if plans and expected != ran:
        # Several plans: a driver ran several TAP programs into one log; their plans add up.
        plan = " + ".join(f"1..{n}" for n in plans)
        problems.append(f"plan {plan} but {ran} test{'' if ran == 1 else 's'} ran")
    if problems:
        message = problems[0] + (f" ({problems[1]})" if len(problems) > 1 else "")
        found.append(CaseResult(classname=suite, name=f"{suite} (plan)", status="error", message=message))
    elif plans and expected == 0:
        found.append(CaseResult(classname=suite, name=suite, status="skipped",
                                message=f"plan 1..0{': ' + skip_all if skip_all else ''}"))
    return found


def _tap_case(suite: str, t: _Test) -> CaseResult:
    r = t.result
    directive = r.directive
    reason = (directive.reason or "").strip()
    diagnostics = "\n".join(t.diagnostics).strip()[:DIAGNOSTICS_MAX]
    if directive.skip:
        status, message = "skipped", reason
    elif directive.todo:
        # TODO marks a known failure: not ok is expected, ok means it got fixed.
        status = "passed" if r.ok else "skipped"
        message = f"TODO {reason}".strip() if not r.ok else ""
    elif r.ok:
        status, message = "passed", ""
    else:
        status, message = "failed", diagnostics
    return CaseResult(classname=suite, name="", status=status, message=message)


def _named(found: list[CaseResult], tests: list[_Test]) -> list[CaseResult]:
    """Names from TAP descriptions, made unique: two cases of one name would merge in the
    history, so each such name gets its test number."""
    names = []
    for t in tests:
        desc = t.result.description
        if desc.startswith("- "):
            desc = desc[2:].strip()
        elif desc == "-":
            desc = ""
        names.append(desc or f"test {t.number}")
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    names = [f"{n} (#{t.number})" if counts[n] > 1 else n for n, t in zip(names, tests, strict=True)]
    seen: set[str] = set()
    out = []
    for case, name in zip(found, names, strict=True):
        unique, k = name, 2
        while unique in seen:  # test numbers repeat when several TAP streams share one log
            unique, k = f"{name} [{k}]", k + 1
        seen.add(unique)
        out.append(case.model_copy(update={"name": unique}))
    return out


# -- benchmark metrics --------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A finite float, or None: JSON true is not 1, and NaN/inf are not figures worth a trend."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


# A metrics file holds a few named numbers: more than this is not one (and JSON's objects cost
# the worker many times their bytes).
METRICS_MAX = 1024 * 1024


def metrics_from_file(path: Path, declared: Iterable[str]) -> dict[str, float]:
    """The declared metrics from a benchmark's JSON file: {"name": number, ...}, at top level or
    under "metrics"."""
    wanted = list(dict.fromkeys(declared))
    shape = '{"metrics": {"<name>": <number>, ...}} or {"<name>": <number>, ...}'
    try:
        data, dropped = jobtree.read_capped(path, METRICS_MAX)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise OutcomeError(f"the benchmark wrote no metrics file {path}: check the catalog's `metrics_file` "
                           f"and that the benchmark's argv writes it there") from None
    except jobtree.NotAFile as e:
        raise OutcomeError(f"the metrics file {e.strerror}: write the metrics to a file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OutcomeError(f"cannot read the metrics file {path}: {e}") from e
    if dropped:
        raise OutcomeError(f"the metrics file {path} is {len(data) + dropped} bytes, more than the "
                           f"{METRICS_MAX >> 10} KiB a file of named numbers needs: it was not read; write only "
                           f"{shape}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise OutcomeError(f"the metrics file {path} is not valid JSON ({e}): the benchmark must write {shape}") from e
    if not isinstance(data, dict):
        raise OutcomeError(f"the metrics file {path} holds a JSON {type(data).__name__}, not an object: "
                           f"the benchmark must write {shape}")
    nested = data.get("metrics")
    nested = nested if isinstance(nested, dict) else {}
    out: dict[str, float] = {}
    missing, bad = [], []
    for name in wanted:
        where = nested if name in nested else data
        if name not in where:
            missing.append(name)
        elif (value := _number(where[name])) is None:
            bad.append(f"{name} = {json.dumps(where[name])[:60]}")
        else:
            out[name] = value
    if missing:
        raise OutcomeError(f"the metrics file {path} has no metric {', '.join(map(repr, missing))}"
                           f" (it has: {', '.join(sorted({*nested, *data} - {'metrics'})) or 'nothing'}): make "
                           f"the benchmark write it as {shape}, or remove it from the benchmark's `metrics`")
    if bad:
        raise OutcomeError(f"the metrics file {path} has metrics that are not finite numbers: {'; '.join(bad)}: "
                           f"write each as a JSON number (not a string)")
    return out


def metrics_from_pattern(text: str, pattern: str, declared: Iterable[str]) -> dict[str, float]:
    """The declared metrics in a benchmark's output, by the catalog's `metrics_pattern`. The last
    match of a metric wins: progress lines come before the summary."""
    wanted = list(dict.fromkeys(declared))
    try:
        rx = compile_pattern(pattern)
    except re.error as e:
        raise OutcomeError(f"metrics_pattern {pattern!r} does not compile: {e}") from e
    last: dict[str, str] = {}
    pairs = "metric" in rx.groupindex and "value" in rx.groupindex
    for m in rx.finditer(text):
        if pairs:
            name, value = m.group("metric"), m.group("value")
            if name is not None and value is not None and name.strip() in wanted:
                last[name.strip()] = value
        else:
            for name, value in m.groupdict().items():
                if value is not None and name in wanted:
                    last[name] = value
    missing = [n for n in wanted if n not in last]
    if missing:
        raise OutcomeError(f"metric {', '.join(map(repr, missing))} never matched metrics_pattern {pattern!r} in "
                           f"the benchmark's output: fix the pattern, or make the benchmark print the metric")
    out: dict[str, float] = {}
    bad = []
    for name in wanted:
        try:
            value = float(last[name].strip())
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            bad.append(f"{name} = {last[name][:60]!r}")
        else:
            out[name] = value
    if bad:
        raise OutcomeError(f"metrics_pattern {pattern!r} captured values that are not numbers: {'; '.join(bad)}: "
                           f"make the value's group capture only the number, e.g. ([0-9.]+)")
    return out
