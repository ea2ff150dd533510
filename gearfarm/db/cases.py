"""A run's test cases as the report and the dashboard read them: counted per job and status,
the failing ones with their messages, and every one for the merged JUnit file. From the
database (``of_run``: the counting done in SQL, the records read without their cases) or from
records that carry their cases (``of_records``: the database down, a test's own records).

A 5,000-job night holds 200,000 cases; validating them into records took a second and a half,
classifying them one by one ten (docs/speed.md, "At scale"), and a report needs only the counts
and the few that fail: the rest is read once, as plain rows, for the JUnit file."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gearfarm.db.results import ResultsDB
from gearfarm.formats.result import CaseResult, ResultRecord

FAILING = ("failed", "error")


class CaseRow(Protocol):
    """A failing test case as the cases table holds it: CaseResult's fields, read as a row."""

    classname: str
    name: str
    status: str
    time: float
    message: str


Case = CaseResult | CaseRow
# What every() holds per job: (job id, classname, name, status, seconds, message) tuples, read
# by position (200,000 of them for a big night's JUnit file: a pydantic model of each, even
# unvalidated, cost 3 s; reading a row's fields by name 0.7 s).
CaseTuple = tuple[str, str, str, str, float, str]


@dataclass
class RunCases:
    """``counts``: job id -> {status: cases}; ``failing``: job id -> its failed and errored cases,
    in the order the job reported them. ``every()`` reads job id -> all its cases (once)."""

    counts: dict[str, dict[str, int]]
    failing: dict[str, list[Case]]
    _every: Callable[[], dict[str, list[CaseTuple]]] = field(repr=False)
    _all: dict[str, list[CaseTuple]] | None = field(default=None, repr=False)

    def every(self) -> dict[str, list[CaseTuple]]:
        if self._all is None:
            self._all = self._every()
        return self._all

    def failing_count(self, job_id: str) -> int:
        counts = self.counts.get(job_id, {})
        return sum(counts.get(s, 0) for s in FAILING)

    @classmethod
    def of_records(cls, records: Iterable[ResultRecord]) -> RunCases:
        records = list(records)
        counts: dict[str, dict[str, int]] = {}
        for r in records:
            for c in r.cases:
                per = counts.setdefault(r.job_id, {})
                per[c.status] = per.get(c.status, 0) + 1
        failing: dict[str, list[Case]] = {
            r.job_id: bad for r in records if (bad := [c for c in r.cases if c.status in FAILING])}
        return cls(counts, failing, lambda: {
            r.job_id: [(r.job_id, c.classname, c.name, c.status, c.time, c.message) for c in r.cases]
            for r in records})

    @classmethod
    def of_run(cls, db: ResultsDB, run_id: str) -> RunCases:
        def rows(failing: bool) -> dict[str, list[Any]]:
            out: dict[str, list[Any]] = {}
            for row in db.case_list(run_id, failing=failing):
                out.setdefault(row[0], []).append(row)
            return out

        return cls(db.case_counts(run_id), rows(True), lambda: rows(False))
