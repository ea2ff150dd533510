"""What a bisection looks for and how sure its answer is: the subjects (a failing test, a
benchmark's metric), the settings (budget, repetitions, A/B pairs), the confidence of a
culprit, and the error that stops a bisection. Shared by the group of failing tests
(gearfarm.bisection.failures), the benchmark's search (gearfarm.bisection.benchmark) and the
nightly's driver (gearfarm.bisection.driver)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gearfarm.bisection import search as bisect
from gearfarm.perf import compare


class BisectionError(RuntimeError):
    """The bisection cannot start or go on (bad range, unknown test, the farm away): the
    message says what to fix."""


@dataclass(frozen=True)
class TestSubject:
    suite: str
    case: str
    kind = "test"

    def __str__(self) -> str:
        return f"{self.suite}/{self.case}"


@dataclass(frozen=True)
class PerfSubject:
    benchmark: str
    metric: str
    kind = "perf"

    def __str__(self) -> str:
        return f"{self.benchmark}/{self.metric}"


Subject = TestSubject | PerfSubject


@dataclass(frozen=True)
class Settings:
    # Per group of failures bisected together (one search), or per benchmark.
    budget: bisect.Budget = field(default_factory=bisect.Budget)
    # Tests: runs of each end before the search (a flaky test is caught here) and of each middle.
    confirm: int = 4
    repeat: int = 2
    seed: int = 1
    # Benchmarks: the relative change sought at the first bad end (its size; either direction),
    # and the most A/B pairs measured at one revision.
    change: float = 0.05
    max_pairs: int = 40

    def as_dict(self) -> dict[str, object]:
        return {"confirm": self.confirm, "repeat": self.repeat, "seed": self.seed, "change": self.change,
                "max_pairs": self.max_pairs, "budget": vars(self.budget)}


def test_confidence(good_passes: int, bad_failures: int) -> float:
    """How sure the culprit is not chance: 1 minus the largest probability, over every failure
    rate f, that a test failing at random with rate f both before and after the culprit would
    have failed all ``bad_failures`` runs at the culprit and passed all ``good_passes`` runs at
    its parent (f^m (1-f)^n, largest at f = m / (m + n))."""
    m, n = bad_failures, good_passes
    if m == 0 or n == 0:
        return 0.0
    f = m / (m + n)
    return 1.0 - f ** m * (1.0 - f) ** n


def perf_confidence(culprit_p: float, parent_compared: bool) -> float:
    """1 minus the chance the culprit's difference is noise (its comparison's p-value), times
    1 minus the chance its parent's "same" was wrong (compare.MISS) when the parent was measured
    (the good end is the known-good build itself)."""
    return (1.0 - culprit_p) * ((1.0 - compare.MISS) if parent_compared else 1.0)
