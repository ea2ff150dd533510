"""Counts as a person reads them (gearfarm/formats/words.py): "1 night", never "1 nights", in
the commands' output, the reports and the dashboard alike; and no count in gearfarm's code or
templates is written with a fixed plural any more."""

from __future__ import annotations

import re
from pathlib import Path

from jinja2 import Environment

from gearfarm.formats.words import counted, plural

ROOT = Path(__file__).resolve().parents[2]


def test_counted_says_one_thing_and_many_things() -> None:
    assert counted(1, "night") == "1 night" and counted(2, "night") == "2 nights"
    assert counted(0, "run") == "0 runs" and counted(1, "run") == "1 run"
    assert counted(1, "entry") == "1 entry" and counted(3, "entry") == "3 entries"
    assert counted(2, "day") == "2 days"  # a vowel before the y keeps it
    assert counted(2, "process") == "2 processes" and counted(2, "match") == "2 matches"
    assert counted(1, "test case") == "1 test case" and counted(5, "test case") == "5 test cases"
    assert counted(1, "run folder") == "1 run folder" and counted(0, "run folder") == "0 run folders"
    assert counted(2, "series") == "2 series"
    assert counted(1.0, "day") == "1 day" and counted(1.5, "day") == "1.5 days" and counted(30.0, "day") == "30 days"
    assert counted(2, "datum", "data") == "2 data" and counted(1, "datum", "data") == "1 datum"
    assert plural("new failure") == "new failures" and plural("build") == "builds"


def test_templates_count_with_the_filter() -> None:
    env = Environment()
    env.filters["counted"] = counted
    page = env.from_string('last {{ n|counted("night") }}; {{ runs|counted("run") }}')
    assert page.render(n=1, runs=1) == "last 1 night; 1 run"
    assert page.render(n=14, runs=0) == "last 14 nights; 0 runs"


# A number put before a fixed plural: an f-string's {count} or a template's {{ count }}; not a
# verb ("{target} runs no benchmarks") nor a list of names ("{', '.join(ROLES)} jobs").
NOUNS = ("nights|runs|jobs|builds|targets|suites|benchmarks|failures|entries|objects|commits|files|pairs|"
         "cases|hosts|workers|bisections|times|days|revisions|regressions|results")
FIXED_PLURAL = re.compile(r"(\{(?!\{)[^{}]+\}|\{\{[^{}]+\}\}) (" + NOUNS + r")\b(?! no\b| none\b)")
NOT_A_COUNT = ("join(", "case_summary(")


def fixed_plurals(line: str) -> list[str]:
    return [m.group(0) for m in FIXED_PLURAL.finditer(line) if not any(x in m.group(1) for x in NOT_A_COUNT)]


def test_no_count_in_the_code_or_the_templates_has_a_fixed_plural() -> None:
    found = []
    for path in sorted([*ROOT.glob("gearfarm/**/*.py"), *ROOT.glob("gearfarm/templates/**/*.j2"),
                        *ROOT.glob("workers/*.py"), *ROOT.glob("s3/*.py")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if fixed_plurals(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "count these with gearfarm.formats.words.counted:\n" + "\n".join(found)


def test_the_check_finds_a_fixed_plural_and_only_that() -> None:
    assert fixed_plurals('click.echo(f"{len(series)} nights")') == ["{len(series)} nights"]
    assert fixed_plurals("<p>{{ d.nights|length }} nights</p>") == ["{{ d.nights|length }} nights"]
    assert fixed_plurals('f"({sum(1 for r in builds)} of {len(builds)} builds reused)"') == ["{len(builds)} builds"]
    assert not fixed_plurals('click.echo(f"{counted(len(series), \'night\')}")')
    assert not fixed_plurals('f"target {self.target} runs no benchmarks"')
    assert not fixed_plurals("f\"{', '.join(ROLES)} jobs; name at least one\"")
