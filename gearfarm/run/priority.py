"""Which queued job a worker slot takes first: the one on the longest remaining path of the
nightly (critical-path list scheduling), so slow emulated suites and the builds they wait for
start before quick native ones instead of being left for last on a busy host.

gearmand orders jobs only within one function (priorities) and offers a worker the functions in
the order it registered them (gearfarm.gearman.Worker.register), so a slot registers its
functions in this order. Each host learns how long its jobs take: every finished job updates a
per-host file of durations in the state directory (per function and per job of it: a target's
model suite took ten times its unit suite), read at the next start; a build worker queues its
target's suites longest first, since gearmand hands out one function's jobs in the order they
came. That order is fixed at the slot's start, and every slot of the farm has the same one,
so the targets' queues would drain one after another and the last target's long suites start
at the end of the night (docs/speed.md, eighth round); so before each job a slot asks gearmand
how many jobs each of its functions has waiting and takes from the one whose next job is
longest (Preference). Until a function has been seen, an emulated target's suites count three times a native
one's (measured on the default nightly: the aarch64 suites under qemu and the Windows suites
under wine took 2.5-4 times the native ones)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from gearfarm.formats.catalog import Target
from gearfarm.formats.job import function_name, step_name

EMULATED = 3.0
# Weight of the newest duration in the running average: the engine and the host change.
RECENT = 0.5
# The journal's size past which it is folded into the durations file (about 2,000 jobs' lines).
JOURNAL_BYTES = 128 * 1024


class Durations:
    """Seconds per job of each function on one host (a running average), kept in a file.

    A job adds one line to a journal beside the file (``<host>.log``: key, seconds), and the
    journal is folded into the file when it passes JOURNAL_BYTES: a host that serves 100 targets
    knows 5,000 keys (every suite of every target), and rewriting them all after each job cost it
    more than the job's delivery (docs/speed.md). Appends share the lock, the fold takes it alone."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_suffix(".log")

    @classmethod
    def of_host(cls, state_dir: Path) -> Durations:
        return cls(state_dir / "durations" / f"{socket.gethostname()}.json")

    def load(self) -> dict[str, float]:
        try:
            with open(self.path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)  # not between a fold's two steps
                return self._read()
        except OSError:
            return self._read()

    def _read(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}  # never measured, or unreadable: the defaults order the slots
        got = {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and v >= 0} \
            if isinstance(data, dict) else {}
        try:
            lines = self.journal.read_text().splitlines()
        except (OSError, ValueError):
            lines = []
        for line in lines:
            key, _, value = line.rpartition("\t")
            try:
                seconds = float(value)
            except ValueError:
                continue  # a line torn by a crash mid-append
            if key and seconds >= 0:
                old = got.get(key)
                got[key] = seconds if old is None else RECENT * seconds + (1 - RECENT) * old
        return got

    def record(self, function: str, seconds: float, step: str | None = None) -> None:
        """Fold one job's duration into its function's and (given) its step's average: one
        append (several slot processes of the host record at once)."""
        keys = [function] + ([step_key(function, step)] if step else [])
        line = "".join(f"{k}\t{seconds!r}\n" for k in keys if "\n" not in k)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)
                # One write of O_APPEND: whole lines, never interleaved with a sibling's.
                fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                if size > JOURNAL_BYTES:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if self.journal.stat().st_size > JOURNAL_BYTES:  # else a sibling folded it meanwhile
                        self._fold()
        except OSError:
            pass  # only the next start's order depends on it

    def _fold(self) -> None:
        """The journal into the file, under the lock held alone."""
        data = self._read()
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".durations-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)
        os.truncate(self.journal, 0)


def step_key(function: str, step: str) -> str:
    """The key of one job of a function (``test:linux-x86_64/test-model``): a target's suites
    differ by ten times and more, so a function's average cannot say which of them goes first."""
    return f"{function}/{step}"


def estimate(durations: Mapping[str, float], targets: Mapping[str, Target], role: str, target: str,
             step: str | None = None) -> float:
    """Seconds one job is expected to take on this host: the step as measured, else its
    function's running average, else 1 (three for an emulated target's suites)."""
    function = function_name(role, target)  # type: ignore[arg-type]
    for key in ([step_key(function, step)] if step else []) + [function]:
        if key in durations:
            return durations[key]
    t = targets.get(target)
    return EMULATED if role == "test" and t is not None and t.runner else 1.0


def longest_first(steps: Iterable[str], function: str, durations: Mapping[str, float]) -> list[str]:
    """A build's test steps in the order to submit them: gearmand hands out one function's jobs
    first in, first out, so the suite measured longest must be queued first. A step never
    measured counts as its function's average (0 when that too is unknown); ties keep the
    catalog's order."""
    listed = list(steps)

    def key(i: int) -> tuple[float, int]:
        seen = durations.get(step_key(function, listed[i]))
        return (-(seen if seen is not None else durations.get(function, 0.0)), i)

    return [listed[i] for i in sorted(range(len(listed)), key=key)]


def suites(durations: Mapping[str, float], targets: Mapping[str, Target], target: str) -> list[float]:
    """Seconds each of a target's suites is expected to take on this host (one figure, its test
    function's, when the target lists none), shortest first."""
    t = targets.get(target)
    names = t.suites if t is not None and t.suites else [""]
    return sorted(estimate(durations, targets, "test", target, step_name("test", n) if n else None) for n in names)


def paths(functions: Iterable[tuple[str, str]], targets: Mapping[str, Target],
          durations: Mapping[str, float]) -> dict[tuple[str, str], tuple[float, list[float]]]:
    """Per (role, target): its longest remaining path, and for a test function its target's
    suites (``suites``). A build's path is its own duration and then its target's longest suite
    (they wait for it and run side by side); a test function's is its longest suite, which the
    build queued first (``longest_first``). Each target's suites are worked out once: a slot
    does this for every function it serves (two a target) whenever it re-reads its host's
    durations."""
    per_target: dict[str, list[float]] = {}
    got = {}
    for role, target in functions:
        if role in ("build", "test"):
            s = per_target.get(target)
            if s is None:
                s = per_target[target] = suites(durations, targets, target)
            own = estimate(durations, targets, "build", target) if role == "build" else 0.0
            got[role, target] = (own + s[-1], s if role == "test" else [])
        else:
            got[role, target] = (estimate(durations, targets, role, target), [])
    return got


def ranked(got: Mapping[tuple[str, str], tuple[float, list[float]]]) -> list[tuple[str, str]]:
    """The (role, target) pairs of ``paths``, longest path first (ties by name)."""
    return sorted(got, key=lambda rt: (-got[rt][0], rt))


def order(functions: Iterable[tuple[str, str]], targets: Mapping[str, Target],
          durations: Mapping[str, float]) -> list[tuple[str, str]]:
    """(role, target) pairs, longest remaining path first (``paths``)."""
    return ranked(paths(functions, targets, durations))


class Preference:
    """Which of a slot's functions to take a job from next: a build before the suites it holds
    up (its path, as in ``order``), otherwise the function whose next job is expected to take
    longest (longest processing time first, the list schedule that ends a night nearest its
    bound: bench/schedule.py). gearmand cannot say which job a queue holds next, but a
    function's queue is its target's suites longest first (``longest_first``), so with c of them
    waiting the next is the c-th shortest (the longest when more wait than the target has
    suites: several projects or re-runs). Called before every job, so the estimates are worked
    out ahead: at the start and, from the host's Durations, again every REFRESH seconds (a slot
    runs for weeks; the static order is its start's). Not more often: tonight's durations order
    tomorrow's night (a suite runs once a night), and working the estimates out is a few ms per
    hundred targets, in every slot of the lab."""

    REFRESH = 300.0

    def __init__(self, functions: Iterable[tuple[str, str]], targets: Mapping[str, Target],
                 durations: Durations | Mapping[str, float]) -> None:
        self.functions, self.targets, self.source = list(functions), targets, durations
        self.rank: dict[str, int] = {}
        self.paths: dict[str, float] = {}
        # Per test function: its suites' expected seconds, shortest first.
        self.suites: dict[str, list[float]] = {}
        self.loaded = 0.0
        self._estimate()

    def _estimate(self) -> None:
        durations = self.source.load() if isinstance(self.source, Durations) else self.source
        self.loaded = time.monotonic()
        got = paths(self.functions, self.targets, durations)
        self.rank = {function_name(role, target): i  # type: ignore[arg-type]
                     for i, (role, target) in enumerate(ranked(got))}
        for (role, target), (path, suites_of) in got.items():
            fn = function_name(role, target)  # type: ignore[arg-type]
            if role == "test":
                self.suites[fn] = suites_of
            else:
                self.paths[fn] = path

    def __call__(self, waiting: Mapping[str, int]) -> str | None:
        if isinstance(self.source, Durations) and time.monotonic() - self.loaded >= self.REFRESH:
            self._estimate()
        best: tuple[float, int] | None = None
        choice = None
        for fn, count in waiting.items():
            if count <= 0 or fn not in self.rank:
                continue
            suites = self.suites.get(fn)
            seconds = suites[min(count, len(suites)) - 1] if suites else self.paths[fn]
            key = (-seconds, self.rank[fn])
            if best is None or key < best:
                best, choice = key, fn
        return choice
