"""A run's job states as the nightly's wait loop sees them at each 0.2 s poll: what every job's
state is, what changed since the last poll, and which jobs have not ended.

Each poll's work must grow with what changed, not with the night: a poll that read, copied or
walked every job's state cost a 5,000-job night's nightly 35 ms a poll when it read them whole,
and 7 ms a poll at 2,500 pending when it walked the pending jobs (docs/speed.md). A whole read
every FULL_READ_SECONDS is the net under the changes: a change the reads between missed (a
transaction that committed late) is seen by the next one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator

from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import JobId
from gearfarm.formats.result import TERMINAL

# The poll reads its run's job states whole every FULL_READ_SECONDS, and between only the jobs
# the ledger applied a record to since the last read, less CHANGE_MARGIN (of the ledger's
# clock: a transaction that committed late, a collector whose clock is behind).
FULL_READ_SECONDS = 15.0
CHANGE_MARGIN = 10.0


class RunStates:
    """A run's job states: read whole, a 5,000-job run's states took 35 ms a poll on a busy
    machine, most of a 64-host night's nightly CPU (docs/speed.md); between whole reads, only
    what changed."""

    def __init__(self, db: ResultsDB, run_id: str) -> None:
        self.db, self.run_id = db, run_id
        self.states: dict[str, str] = {}
        # What the last read changed ({job id: state}); after a whole read, None: anything may have.
        self.changed: dict[str, str] | None = None
        self.whole_at = -FULL_READ_SECONDS  # time.monotonic() of the last whole read
        self.mark = 0.0  # the latest change read, on the ledger's clock
        self.whole_reads = 0

    def read(self) -> dict[str, str]:
        """Every job's state, the reader's to look at and not to change (a copy a poll was
        5,000 jobs' worth of work five times a second)."""
        if time.monotonic() - self.whole_at >= FULL_READ_SECONDS:
            _, latest = self.db.job_states_since(self.run_id, self.mark)  # first: a change between is read again
            self.states = self.db.job_states(self.run_id)
            self.changed = None
            self.whole_at, self.whole_reads = time.monotonic(), self.whole_reads + 1
        else:
            got, latest = self.db.job_states_since(self.run_id, self.mark - CHANGE_MARGIN)
            self.changed = {k: v for k, v in got.items() if self.states.get(k) != v}
            self.states.update(self.changed)
        self.mark = max(self.mark, latest or 0.0)
        return self.states


class Pending:
    """The plan's jobs that have not ended, kept from each read's changes, and how many of them
    each Gearman function has (the no-worker rule looks at functions, not at jobs)."""

    def __init__(self, expected: Iterable[JobId]) -> None:
        self.order = {j: i for i, j in enumerate(expected)}
        self.ids = {str(j): j for j in self.order}
        self.function = {j: j.function for j in self.order}
        # One job of each function: a function's jobs are one target's of one kind.
        self.sample = {fn: j for j, fn in reversed(self.function.items())}
        self.jobs: set[JobId] = set()
        self.functions: Counter[str] = Counter()

    def update(self, states: dict[str, str], changed: dict[str, str] | None) -> None:
        """After a read: ``changed`` as RunStates says it (None: every job looked at again)."""
        if changed is None:
            self.jobs = {j for k, j in self.ids.items() if states.get(k) not in TERMINAL}
            self.functions = Counter(self.function[j] for j in self.jobs)
            return
        for k, state in changed.items():
            jid = self.ids.get(k)
            if jid is None:
                continue
            if state in TERMINAL and jid in self.jobs:
                self.jobs.discard(jid)
                self.functions[self.function[jid]] -= 1
            elif state not in TERMINAL and jid not in self.jobs:
                self.jobs.add(jid)
                self.functions[self.function[jid]] += 1

    def of(self, function: str) -> list[JobId]:
        """The pending jobs of one function, in the plan's order."""
        return self.ordered(j for j in self.jobs if self.function[j] == function)

    def ordered(self, jobs: Iterable[JobId]) -> list[JobId]:
        return sorted(jobs, key=self.order.__getitem__)

    def __contains__(self, jid: object) -> bool:
        return jid in self.jobs

    def __iter__(self) -> Iterator[JobId]:
        return iter(self.ordered(self.jobs))

    def __len__(self) -> int:
        return len(self.jobs)
