"""What a step's output says: TAP, exit status, JUnit and ctest suites give the cases a user sees
in the report, and benchmark output gives the metrics; a moved CMake build tree still runs its
tests under ctest after relocate."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gearfarm.formats.catalog import check_pattern
from gearfarm.formats.result import CaseResult
from gearfarm.step.ctestfile import relocate
from gearfarm.step.outcome import (
    FORMATS,
    OutcomeError,
    cases,
    metrics_from_file,
    metrics_from_pattern,
)


def log(tmp_path: Path, text: str, name: str = "step.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def by_name(found: list[CaseResult]) -> dict[str, CaseResult]:
    names = [c.name for c in found]
    assert len(names) == len(set(names)), names
    return {c.name: c for c in found}


# -- TAP ----------------------------------------------------------------------------------------

TAP = """\
make[1]: Entering directory '/src'
okay, compiled 10045 bytes
TAP version 13
1..7
ok 1 - parses empty input
not ok 2 - adds two numbers
# expected: 4
# got: 5
ok 3 - network # SKIP no network on this host
not ok 4 - unicode names # TODO not implemented yet
ok 5 - old bug # TODO was flaky
not ok 6 - reads config
  ---
  message: file not found
  path: /etc/app.conf
  ...
ok 7
make[1]: Leaving directory '/src'
"""


def test_tap_maps_results_and_keeps_diagnostics_of_failures(tmp_path: Path) -> None:
    found = cases("tap", "unit", rc=1, output=log(tmp_path, TAP), results=None)
    got = by_name(found)
    assert {n: c.status for n, c in got.items()} == {
        "parses empty input": "passed",
        "adds two numbers": "failed",
        "network": "skipped",
        "unicode names": "skipped",  # expected failure
        "old bug": "passed",  # a TODO that passes
        "reads config": "failed",
        "test 7": "passed",
    }
    assert all(c.classname == "unit" for c in found)
    assert got["adds two numbers"].message == "expected: 4\ngot: 5"
    assert "message: file not found" in got["reads config"].message
    assert "path: /etc/app.conf" in got["reads config"].message
    assert got["network"].message == "no network on this host"
    # Non-TAP lines of the log ("okay, ...", "10045") are neither tests nor plans; the failures
    # explain rc=1, so no extra exit-status case.
    assert len(found) == 7


def test_tap_diagnostics_are_truncated(tmp_path: Path) -> None:
    text = "1..1\nnot ok 1 - noisy\n" + "".join(f"# line {i} {'x' * 50}\n" for i in range(200))
    (case,) = cases("tap", "unit", rc=1, output=log(tmp_path, text), results=None)
    assert case.status == "failed" and len(case.message) == 2000 and case.message.startswith("line 0 ")


def test_tap_same_description_gets_test_numbers(tmp_path: Path) -> None:
    text = "1..3\nok 1 - round trip\nnot ok 2 - round trip\nok 3 - other\n"
    got = by_name(cases("tap", "unit", rc=1, output=log(tmp_path, text), results=None))
    assert got["round trip (#1)"].status == "passed"
    assert got["round trip (#2)"].status == "failed"
    assert "other" in got


def test_tap_fewer_tests_than_plan_is_an_error_case(tmp_path: Path) -> None:
    text = "1..5\nok 1 - a\nok 2 - b\nok 3 - c\n"  # crashed after test 3
    got = by_name(cases("tap", "unit", rc=0, output=log(tmp_path, text), results=None))
    assert got["unit (plan)"].status == "error"
    assert got["unit (plan)"].message == "plan 1..5 but 3 tests ran"
    assert [got[n].status for n in "abc"] == ["passed"] * 3


def test_tap_bail_out_is_an_error_case(tmp_path: Path) -> None:
    text = "1..4\nok 1 - a\nBail out! database unreachable\nok 2 - after the bail is ignored\n"
    got = by_name(cases("tap", "unit", rc=0, output=log(tmp_path, text), results=None))
    assert set(got) == {"a", "unit (plan)"}
    assert got["unit (plan)"].status == "error"
    assert got["unit (plan)"].message.startswith("Bail out! database unreachable")


def test_tap_nothing_printed_is_an_outcome_error(tmp_path: Path) -> None:
    output = log(tmp_path, "Segmentation fault (core dumped)\nokay then\n")
    with pytest.raises(OutcomeError) as e:
        cases("tap", "unit", rc=139, output=output, results=None)
    assert "printed no TAP" in str(e.value) and 'format = "tap"' in str(e.value)
    assert "unit" in str(e.value)


def test_tap_nonzero_exit_with_all_passing_adds_a_failed_case(tmp_path: Path) -> None:
    text = "1..2\nok 1 - a\nok 2 - b\n==123==ERROR: LeakSanitizer: detected memory leaks\n"
    got = by_name(cases("tap", "unit", rc=23, output=log(tmp_path, text), results=None))
    assert got["unit (exit status)"].status == "failed"
    assert got["unit (exit status)"].message.startswith("exited 23")
    assert "LeakSanitizer" in got["unit (exit status)"].message
    assert got["a"].status == got["b"].status == "passed"
    # Exit 0: nothing extra.
    assert set(by_name(cases("tap", "unit", rc=0, output=log(tmp_path, text), results=None))) == {"a", "b"}


def test_tap_read_from_results_file_not_the_log(tmp_path: Path) -> None:
    output = log(tmp_path, "ok 1 - this is the log, not the results\n")
    results = log(tmp_path, "1..2\nok 1 - from file\nnot ok 2 - also from file\n", "results.tap")
    got = by_name(cases("tap", "unit", rc=1, output=output, results=results))
    assert {n: c.status for n, c in got.items()} == {"from file": "passed", "also from file": "failed"}
    with pytest.raises(OutcomeError, match="no TAP file at .*missing.tap"):
        cases("tap", "unit", rc=0, output=output, results=tmp_path / "missing.tap")


def test_tap_skip_all_plan(tmp_path: Path) -> None:
    (case,) = cases("tap", "gpu", rc=0, output=log(tmp_path, "1..0 # SKIP no GPU\n"), results=None)
    assert (case.name, case.status, case.message) == ("gpu", "skipped", "plan 1..0: no GPU")


# -- exit status --------------------------------------------------------------------------------


def test_exit_code_pass_and_fail_with_log_tail(tmp_path: Path) -> None:
    output = log(tmp_path, "".join(f"line {i}\n" for i in range(100)) + "assertion failed: x == 3\n")
    (ok,) = cases("exit-code", "smoke", rc=0, output=output, results=None)
    assert (ok.name, ok.classname, ok.status, ok.time, ok.message) == ("smoke", "smoke", "passed", 0, "")
    (bad,) = cases("exit-code", "smoke", rc=2, output=output, results=None)
    assert bad.status == "failed" and bad.message.startswith("exited 2")
    assert bad.message.rstrip().endswith("assertion failed: x == 3")
    assert "line 61" in bad.message and "line 60\n" not in bad.message  # exactly the last 40 lines
    (killed,) = cases("exit-code", "smoke", rc=-11, output=output, results=None)
    assert "SIGSEGV" in killed.message


def test_unknown_format_lists_the_formats(tmp_path: Path) -> None:
    with pytest.raises(OutcomeError) as e:
        cases("xunit", "unit", rc=0, output=log(tmp_path, ""), results=None)
    assert all(f in str(e.value) for f in FORMATS)


# -- JUnit --------------------------------------------------------------------------------------


def test_junit_missing_file_says_what_to_check(tmp_path: Path) -> None:
    missing = tmp_path / "junit.xml"
    with pytest.raises(OutcomeError) as e:
        cases("junit", "unit", rc=0, output=log(tmp_path, ""), results=missing)
    msg = str(e.value)
    assert "wrote no JUnit file" in msg and str(missing) in msg and "`results`" in msg and "argv" in msg
    with pytest.raises(OutcomeError) as e:
        cases("ctest", "unit", rc=0, output=log(tmp_path, ""), results=missing)
    assert "3.21" in str(e.value) and "--output-junit" in str(e.value)


def test_junit_cases_and_unexplained_exit_status(tmp_path: Path) -> None:
    xml = log(tmp_path, '<testsuite><testcase classname="" name="t1" time="0.5"/>'
                        '<testcase classname="mod" name="t2"><skipped/></testcase></testsuite>', "j.xml")
    found = cases("junit", "unit", rc=0, output=log(tmp_path, ""), results=xml)
    assert [(c.classname, c.name, c.status) for c in found] == [("unit", "t1", "passed"), ("mod", "t2", "skipped")]
    # A nonzero exit that no case explains (e.g. a coverage threshold) is not lost.
    found = cases("junit", "unit", rc=2, output=log(tmp_path, "FAIL Required test coverage of 90% not reached\n"),
                  results=xml)
    assert found[-1].name == "unit (exit status)" and found[-1].status == "failed"
    assert "coverage" in found[-1].message


# -- ctest on a real CMake project moved to another root ----------------------------------------

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.13)
project(moved C)
enable_testing()
add_executable(t_ok ok.c)
add_executable(t_bad bad.c)
add_test(NAME ok COMMAND t_ok)
add_test(NAME bad COMMAND t_bad)
add_subdirectory(sub)
"""


def build_cmake_project(root1: Path) -> None:
    """A CMake project configured and built in root1/build (a subdirectory has its own tests)."""
    (root1 / "sub").mkdir(parents=True)
    (root1 / "CMakeLists.txt").write_text(CMAKELISTS)
    (root1 / "ok.c").write_text("int main(void) { return 0; }\n")
    (root1 / "bad.c").write_text('#include <stdio.h>\nint main(void) { puts("checking 1 + 1");\n'
                                 '  fprintf(stderr, "bad.c:2: assertion 1 + 1 == 3 failed\\n"); return 1; }\n')
    (root1 / "sub" / "CMakeLists.txt").write_text(
        "add_executable(t_sub sub.c)\nadd_test(NAME sub_ok COMMAND t_sub)\n"
        "set_tests_properties(sub_ok PROPERTIES WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})\n")
    (root1 / "sub" / "sub.c").write_text("int main(void) { return 0; }\n")
    for argv in (["cmake", "-S", str(root1), "-B", str(root1 / "build")], ["cmake", "--build", str(root1 / "build")]):
        subprocess.run(argv, check=True, capture_output=True, timeout=120)


def run_ctest(build: Path, junit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctest", "--output-junit", str(junit)], cwd=build, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="needs cmake and ctest")
def test_ctest_runs_a_relocated_build_tree(tmp_path: Path) -> None:
    root1, root2 = tmp_path / "root1", tmp_path / "root2"
    build_cmake_project(root1)
    # The worker's view: the built tree unpacked under another root, the build host's path gone.
    shutil.copytree(root1, root2, symlinks=True)
    shutil.rmtree(root1)

    # Without relocation ctest cannot find the executables: the suite is broken, not skipped.
    junit = tmp_path / "before.xml"
    proc = run_ctest(root2 / "build", junit)
    assert proc.returncode != 0 and "Could not find executable" in proc.stdout + proc.stderr
    log_path = log(tmp_path, proc.stdout + proc.stderr)
    before = by_name(cases("ctest", "cmake", rc=proc.returncode, output=log_path, results=junit))
    assert {c.status for c in before.values()} == {"error"}
    assert "Unable to find executable" in before["ok"].message

    assert relocate(root2 / "build", root2) == 2  # the top file and sub/'s
    assert "root1" not in (root2 / "build" / "CTestTestfile.cmake").read_text()
    assert relocate(root2 / "build", root2) == 0  # already points at root2

    junit = tmp_path / "after.xml"
    proc = run_ctest(root2 / "build", junit)
    after = by_name(cases("ctest", "cmake", rc=proc.returncode, output=log_path, results=junit))
    assert {n: c.status for n, c in after.items()} == {"ok": "passed", "bad": "failed", "sub_ok": "passed"}
    # ctest's JUnit has <failure message=""/> and the test's output in <system-out>: the case's
    # message is what the test said, its assertion last.
    assert "assertion 1 + 1 == 3 failed" in after["bad"].message and after["ok"].message == ""
    assert all(c.classname == "cmake" for c in after.values())


def test_ctest_keeps_its_own_verdicts(tmp_path: Path) -> None:
    # What ctest 3.25 writes for SKIP_RETURN_CODE, DISABLED and REQUIRED_FILES tests (it exits 8
    # for the last: a test it could not run counts as failed, though JUnit calls it skipped).
    xml = log(tmp_path, """<testsuite name="(empty)" tests="3">
<testcase name="sk" classname="sk" time="0.002" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/></testcase>
<testcase name="dis" classname="dis" time="0" status="disabled"><system-out>Disabled</system-out></testcase>
<testcase name="req" classname="req" time="0" status="notrun"><skipped message="Required Files Missing"/></testcase>
</testsuite>""", "ctest.xml")
    got = by_name(cases("ctest", "cmake", rc=8, output=log(tmp_path, ""), results=xml))
    assert {n: c.status for n, c in got.items()} == {"sk": "skipped", "dis": "skipped", "req": "error"}
    empty = log(tmp_path, '<testsuite name="(empty)" tests="0"/>', "empty.xml")
    with pytest.raises(OutcomeError, match="ctest found no tests.*`cwd`"):
        cases("ctest", "cmake", rc=0, output=log(tmp_path, "No tests were found!!!\n"), results=empty)


def test_relocate_without_ctest_files_explains(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    with pytest.raises(OutcomeError) as e:
        relocate(tmp_path / "build", tmp_path)
    assert "no CTestTestfile.cmake in" in str(e.value) and "build/**" in str(e.value)


def test_relocate_refuses_a_build_dir_at_another_place(tmp_path: Path) -> None:
    build = tmp_path / "out" / "cmake"
    build.mkdir(parents=True)
    (build / "CTestTestfile.cmake").write_text(
        "# Source directory: /ws/proj\n# Build directory: /ws/proj/build\nadd_test(a \"/ws/proj/build/a\")\n")
    with pytest.raises(OutcomeError, match="does not end with out/cmake"):
        relocate(build, tmp_path)


def test_relocate_rewrites_only_whole_path_prefixes(tmp_path: Path) -> None:
    build = tmp_path / "build"
    build.mkdir()
    (build / "CTestTestfile.cmake").write_text(
        "# Source directory: /ws/proj\n# Build directory: /ws/proj/build\n"
        'add_test(a "/ws/proj/build/a" "--data=/ws/proj" "/ws/project/x" "/other/ws/proj/y")\n'
        'set_tests_properties(a PROPERTIES WORKING_DIRECTORY "/ws/proj" ENVIRONMENT "P=/ws/proj/lib;Q=1")\n')
    assert relocate(build, tmp_path) == 1
    new = tmp_path.as_posix()
    assert (build / "CTestTestfile.cmake").read_text() == (
        f"# Source directory: {new}\n# Build directory: {new}/build\n"
        f'add_test(a "{new}/build/a" "--data={new}" "/ws/project/x" "/other/ws/proj/y")\n'
        f'set_tests_properties(a PROPERTIES WORKING_DIRECTORY "{new}" ENVIRONMENT "P={new}/lib;Q=1")\n')


# -- benchmark metrics --------------------------------------------------------------------------


def test_metrics_from_file_top_level_or_nested(tmp_path: Path) -> None:
    top = log(tmp_path, '{"ops_per_s": 1200.5, "p99_ms": 3, "note": "x"}', "top.json")
    assert metrics_from_file(top, ["ops_per_s", "p99_ms"]) == {"ops_per_s": 1200.5, "p99_ms": 3.0}
    nested = log(tmp_path, '{"bench": "insert", "metrics": {"ops_per_s": 900, "extra": 1}}', "nested.json")
    assert metrics_from_file(nested, ["ops_per_s"]) == {"ops_per_s": 900.0}  # undeclared not returned


def test_metrics_from_file_errors_name_file_and_metric(tmp_path: Path) -> None:
    with pytest.raises(OutcomeError, match=r"no metrics file .*absent\.json.*metrics_file"):
        metrics_from_file(tmp_path / "absent.json", ["ops"])
    bad_json = log(tmp_path, "{ops: 1", "bad.json")
    with pytest.raises(OutcomeError, match=r"bad\.json is not valid JSON"):
        metrics_from_file(bad_json, ["ops"])
    path = log(tmp_path, '{"metrics": {"ops": 5}}', "m.json")
    with pytest.raises(OutcomeError) as e:
        metrics_from_file(path, ["ops", "latency"])
    assert "m.json" in str(e.value) and "'latency'" in str(e.value) and "`metrics`" in str(e.value)
    for value in ('"12.5"', "true", "null"):
        with pytest.raises(OutcomeError, match="ops = "):
            metrics_from_file(log(tmp_path, f'{{"ops": {value}}}', "v.json"), ["ops"])


@pytest.mark.timeout(60)
def test_a_metrics_file_that_is_a_fifo_or_too_large_is_refused_naming_it(tmp_path: Path) -> None:
    """A benchmark's FIFO as its metrics file hung the worker's read_text for good."""
    os.mkfifo(tmp_path / "m.json")
    with pytest.raises(OutcomeError, match=r"the metrics file \S+/m\.json is a FIFO, not a regular file"):
        metrics_from_file(tmp_path / "m.json", ["ops"])
    big = log(tmp_path, '{"ops": 1, "pad": "' + "x" * (2 << 20) + '"}', "big.json")
    with pytest.raises(OutcomeError, match=r"big\.json is 2097\d+ bytes, more than the 1024 KiB"):
        metrics_from_file(big, ["ops"])


BENCH_OUTPUT = """\
warming up
progress: ops_per_s=100.0 p99_ms=9.5
progress: ops_per_s=150.0 p99_ms=8.0
summary: ops_per_s=1234.5 p99_ms=2.25
"""


def test_metrics_from_pattern_named_groups_last_match_wins() -> None:
    pattern = r"ops_per_s=(?P<ops_per_s>[0-9.]+) p99_ms=(?P<p99_ms>[0-9.]+)"
    assert metrics_from_pattern(BENCH_OUTPUT, pattern, ["ops_per_s", "p99_ms"]) == {"ops_per_s": 1234.5,
                                                                                    "p99_ms": 2.25}


def test_metrics_from_pattern_metric_value_pairs() -> None:
    text = "ops/s: 10\nlatency: 7 ms\nops/s: 20\nignored: 3\n"
    pattern = r"^(?P<metric>[\w/]+): (?P<value>[0-9.]+)"
    assert metrics_from_pattern(text, pattern, ["ops/s", "latency"]) == {"ops/s": 20.0, "latency": 7.0}


def test_metrics_from_pattern_errors() -> None:
    pattern = r"ops_per_s=(?P<ops_per_s>[0-9.]+)"
    with pytest.raises(OutcomeError) as e:
        metrics_from_pattern("nothing useful\n", pattern, ["ops_per_s"])
    assert "'ops_per_s' never matched" in str(e.value) and pattern in str(e.value)
    with pytest.raises(OutcomeError, match="not numbers"):
        metrics_from_pattern("ops=fast\n", r"ops=(?P<ops>\S+)", ["ops"])


def test_check_pattern() -> None:
    declared = ["ops_per_s", "p99_ms"]
    assert check_pattern(r"ops=(?P<ops_per_s>\d+)", declared) is None
    assert check_pattern(r"(?P<metric>\w+)=(?P<value>\d+)", declared) is None
    assert "does not compile" in (check_pattern(r"ops=(?P<ops_per_s>\d+", declared) or "")
    assert "no named group" in (check_pattern(r"ops=(\d+)", declared) or "")
    problem = check_pattern(r"ops=(?P<ops_per_s>\d+) mem=(?P<rss_mb>\d+)", declared) or ""
    assert "'rss_mb'" in problem and "not a declared metric" in problem
    assert "none named 'value'" in (check_pattern(r"(?P<metric>\w+)=\d+", declared) or "")


def test_a_failure_that_says_nothing_takes_the_cases_own_output(tmp_path: Path) -> None:
    xml = log(tmp_path, """<testsuite name="s" tests="3">
<testcase name="quiet" classname="c"><failure message=""/><system-out>setup done
t.c:9: expected 3, got 2</system-out></testcase>
<testcase name="err" classname="c"><error/><system-err>segfault in parse()</system-err></testcase>
<testcase name="said" classname="c"><failure message="x != y">trace</failure><system-out>noise</system-out></testcase>
</testsuite>""", "j.xml")
    got = by_name(cases("junit", "s", rc=1, output=log(tmp_path, ""), results=xml))
    assert got["quiet"].message == "setup done\nt.c:9: expected 3, got 2"
    assert got["err"].message == "segfault in parse()"
    assert got["said"].message == "x != y\ntrace"  # its own message stays; the output is not mixed in
