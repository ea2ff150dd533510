"""Which order of a night's jobs brings its wall nearest its bound: a model, not a measurement
(issue #38). At 64 hosts × 5,000 jobs (bench/scale.py, time scale 5) the slots spent about
80 s of the night beyond its bound, and half of it idle at the end while a few slots still ran
the night's last suites: long suites started last. This replays such a night in a discrete-
event model (no farm runs) under several ways of choosing each slot's next job, and prints
each one's wall ÷ bound, so the choice of a scheduler is made on figures, not taste.

How the farm chooses today: gearmand hands a worker the first job of the first function, in
the order the worker registered its functions (gearfarm.run.priority.order: longest path
first), and one function's jobs first in, first out. A target's suites are queued longest
first when the nightly has their last durations (gearfarm.run.nightly.Watchdog.release),
in the catalog's order on a first night. Every slot registers the same order, so the targets
are drained one after another: the last target's long suites start at the end of the night.

The policies:

* ``static``: today's, with the last night's durations (``--first-night``: without).
* ``ideal``: every free slot takes the longest job queued anywhere (LPT list scheduling):
  what no static function order can give, the best any order can.
* ``window``: the nightly holds the released suites and keeps only a few of the longest in
  gearmand (``k`` × the jobs started per poll in the last second, at least ``min``), topped up
  every poll (0.2 s): whichever a slot takes is among the longest. Kept small on purpose: a
  window that never empties starves the functions a slot reaches last.
* ``per-function window``: as ``window``, with a window per function.
* ``rotated per slot``: each slot's own static order, its test functions starting from a place
  of its own, so the targets drain side by side.
* ``status before each job``: a slot asks gearmand how many jobs each function has waiting and
  takes from the one whose next suite is guessed longest (a function's queue is its target's
  suites longest first, so with c waiting the next is the c-th shortest):
  gearfarm.run.priority.Preference, as the ninth round of docs/speed.md did it.
* ``status at the job's start, read at its end``: the same choice on the counts asked when the
  slot's previous job began (what the farm does since the tenth round: the answer is there when
  the job ends, and the grab goes out with the result); a queue emptied meanwhile passes the
  grab to the next function of the slot's own order.

The durations are bench/scale.py's (REAL_SECONDS, ±20 %, × --time-scale); each job also
costs the farm ``--overhead`` seconds of a slot (64 × 5,000 at time scale 5 measured about
0.5 s: dispatch and the in-job part, docs/speed.md). ``--noise`` blurs the durations the
policies order by (last night's are not tonight's).

    .venv/bin/python bench/schedule.py                       # 64 hosts × 2 slots, 5,000 jobs, scale 5
    .venv/bin/python bench/schedule.py --slots 16 --targets 20 --time-scale 0.5
"""

from __future__ import annotations

import argparse
import collections
import heapq
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import REAL_SECONDS  # noqa: E402  (the same spread as the measured nights)

POLL = 0.2  # the nightly's poll (gearfarm.run.nightly.wait)
Key = tuple[str, int]  # a function: ("b" build | "t" test, target)


class Night:
    """One drawn night: each target's build and suites (seconds), and what the policies think
    they take (the durations blurred by ``noise``)."""

    def __init__(self, targets: int, suites: int, scale: float, seed: int, noise: float) -> None:
        rng = random.Random(seed)
        self.builds = [rng.choice(REAL_SECONDS["build"]) * rng.uniform(0.8, 1.2) * scale for _ in range(targets)]
        self.suites = [[rng.choice(REAL_SECONDS["test"]) * rng.uniform(0.8, 1.2) * scale for _ in range(suites)]
                       for _ in range(targets)]
        self.guess = [[d * rng.uniform(1 - noise, 1 + noise) for d in s] for s in self.suites]

    def bound(self, slots: int) -> float:
        work = sum(self.builds) + sum(map(sum, self.suites))
        return max(work / slots, max(b + max(s) for b, s in zip(self.builds, self.suites, strict=True)))


class Farm:
    """Slots, gearmand's per-function FIFO queues and the static function order; a policy
    decides when which released suite is queued (``feed``) and which queue a slot takes from
    (``take``)."""

    def __init__(self, night: Night, slots: int, overhead: float) -> None:
        self.night, self.slots, self.overhead = night, slots, overhead
        n = len(night.builds)
        self.order: list[Key] = [("b", t) for t in range(n)] + [("t", t) for t in range(n)]
        self.queues: dict[Key, list[float]] = {k: [] for k in self.order}
        for t, b in enumerate(night.builds):
            self.queues["b", t].append(b)
        self.held: list[tuple[float, float, int]] = []  # released, not queued: (-guess, seconds, target)
        self.starts: dict[int, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.now = 0.0
        self.guesses = [sorted(g) for g in night.guess]
        # Per slot, for ``status at the job's start``: the counts it asked for when its last job
        # began, and its own order of functions in gearmand (each choice moved to the front).
        self.seen: dict[int, dict[Key, int]] = {}
        self.mine: dict[int, list[Key]] = {}

    def first_queue(self, slot: int) -> Key | None:
        return next((k for k in self.order if self.queues[k]), None)

    def rotated(self, slot: int) -> Key | None:
        """The slot's own order: builds first, then the test functions from the slot's own
        place on (slot × targets ÷ slots), so every target's suites are drained side by side."""
        n = len(self.night.builds)
        start = slot * n // self.slots
        keys = [("b", t) for t in range(n)] + [("t", (start + i) % n) for i in range(n)]
        return next((k for k in keys if self.queues[k]), None)

    def recent(self, target: int | None = None) -> int:
        """Suites started in the last second (of one target, or all)."""
        qs = [self.starts[target]] if target is not None else list(self.starts.values())
        for q in qs:
            while q and q[0] < self.now - 1.0:
                q.popleft()
        return sum(len(q) for q in qs)

    def run(self, release: Callable[[Farm, int], None], feed: Callable[[Farm], None] | None,
            take: Callable[[Farm, int], Key | None]) -> float:
        """The night's wall (seconds from the first build's start to the last job's end)."""
        events: list[tuple[float, int, str, int]] = []
        free, last, next_poll = list(range(self.slots)), 0.0, POLL

        def dispatch() -> None:
            nonlocal free
            idle = []
            for slot in free:
                key = take(self, slot)
                if key is None:
                    idle.append(slot)
                    continue
                seconds = self.queues[key].pop(0)
                if key[0] == "t":
                    self.starts[key[1]].append(self.now)
                heapq.heappush(events, (self.now + seconds + self.overhead, slot, *key))
            free = idle

        dispatch()
        while events:
            if feed is not None and next_poll < events[0][0]:
                self.now, next_poll = next_poll, next_poll + POLL
                feed(self)
                dispatch()
                continue
            self.now, slot, kind, target = heapq.heappop(events)
            if kind == "b":
                release(self, target)
            free.append(slot)
            last = self.now
            dispatch()
        return last


def queue_in_order(longest_first: bool) -> Callable[[Farm, int], None]:
    """Today's release: a target's suites into its function's queue at once."""
    def release(farm: Farm, t: int) -> None:
        pairs = list(zip(farm.night.guess[t], farm.night.suites[t], strict=True))
        if longest_first:
            pairs.sort(key=lambda p: -p[0])
        farm.queues["t", t].extend(s for _, s in pairs)
    return release


def hold(farm: Farm, t: int) -> None:
    for g, s in zip(farm.night.guess[t], farm.night.suites[t], strict=True):
        heapq.heappush(farm.held, (-g, s, t))


def window(k: float, least: int) -> Callable[[Farm], None]:
    def feed(farm: Farm) -> None:
        size = max(least, int(k * farm.recent() * POLL + 0.999))
        waiting = sum(len(farm.queues["t", t]) for t in range(len(farm.night.builds)))
        while farm.held and waiting < size:
            _, s, t = heapq.heappop(farm.held)
            farm.queues["t", t].append(s)
            waiting += 1
    return feed


def function_window(k: float, least: int) -> Callable[[Farm], None]:
    def feed(farm: Farm) -> None:
        kept = []
        while farm.held:
            item = heapq.heappop(farm.held)
            t = item[2]
            if len(farm.queues["t", t]) < max(least, int(k * farm.recent(t) * POLL + 0.999)):
                farm.queues["t", t].append(item[1])
            else:
                kept.append(item)
        for item in kept:
            heapq.heappush(farm.held, item)
    return feed


def longest_anywhere(farm: Farm, slot: int) -> Key | None:
    """The ideal: a build if any is queued, else the longest suite queued in any function."""
    builds = [k for k in farm.order if k[0] == "b" and farm.queues[k]]
    if builds:
        return builds[0]
    tests = [k for k in farm.order if k[0] == "t" and farm.queues[k]]
    return max(tests, key=lambda k: farm.queues[k][0], default=None)


def head_from_count(farm: Farm, slot: int) -> Key | None:
    """A slot that asks gearmand's ``status`` before each job: builds first, then the function
    whose next suite is guessed longest. A function's queue is its target's suites longest
    first, so with c of them queued the next is the c-th shortest of the target's guesses."""
    builds = [k for k in farm.order if k[0] == "b" and farm.queues[k]]
    if builds:
        return builds[0]
    tests = [k for k in farm.order if k[0] == "t" and farm.queues[k]]
    guesses = farm.guesses

    def head(k: Key) -> float:
        g = guesses[k[1]]
        return g[min(len(farm.queues[k]), len(g)) - 1]

    return max(tests, key=head, default=None)


def head_from_start_count(farm: Farm, slot: int) -> Key | None:
    """As ``head_from_count``, with the counts the slot asked for when its previous job began
    (the answer read at the job's end, so the grab rides with the result): a choice on counts a
    job old. What it chose goes to the front of the slot's own order in gearmand, which hands
    out the first function of that order with a job queued, so a queue emptied meanwhile costs
    nothing but the choice."""
    seen = farm.seen.get(slot)
    order = farm.mine.setdefault(slot, list(farm.order))
    if seen is not None:
        builds = [k for k in farm.order if k[0] == "b" and seen.get(k)]
        tests = [k for k in farm.order if k[0] == "t" and seen.get(k)]
        guesses = farm.guesses

        def head(k: Key) -> float:
            g = guesses[k[1]]
            return g[min(seen[k], len(g)) - 1]

        pick = builds[0] if builds else max(tests, key=head, default=None)
        if pick is not None:
            order.remove(pick)
            order.insert(0, pick)
    key = next((k for k in order if farm.queues[k]), None)
    if key is not None:
        farm.seen[slot] = {k: len(q) - (k == key) for k, q in farm.queues.items() if len(q) - (k == key)}
    return key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--targets", type=int, default=100)
    ap.add_argument("--suites", type=int, default=49, help="suites a target")
    ap.add_argument("--time-scale", type=float, default=5.0)
    ap.add_argument("--overhead", type=float, default=0.5, help="the farm's seconds of a slot per job")
    ap.add_argument("--noise", type=float, default=0.2, help="how far last night's durations are from tonight's")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-night", action="store_true", help="no durations on record: today's order is the catalog's")
    a = ap.parse_args()

    def ideal_release(farm: Farm, t: int) -> None:
        farm.queues["t", t].extend(sorted(farm.night.suites[t], reverse=True))

    policies: dict[str, tuple[Callable[[Farm, int], None], Callable[[Farm], None] | None,
                              Callable[[Farm, int], Key | None]]] = {
        "static (today)": (queue_in_order(not a.first_night), None, Farm.first_queue),
        "ideal (longest queued anywhere)": (ideal_release, None, longest_anywhere),
        "rotated per slot": (queue_in_order(not a.first_night), None, Farm.rotated),
        "status before each job (next suite guessed from the count)": (queue_in_order(not a.first_night), None,
                                                                       head_from_count),
        "status at the job's start, read at its end": (queue_in_order(not a.first_night), None,
                                                        head_from_start_count),
        "window k=2, min 4": (hold, window(2, 4), Farm.first_queue),
        "window k=3, min 4": (hold, window(3, 4), Farm.first_queue),
        "window of 256": (hold, window(0, 256), Farm.first_queue),
        "per-function window k=2, min 1": (hold, function_window(2, 1), Farm.first_queue),
    }
    print(f"{a.slots} slots, {a.targets} targets × (build + {a.suites} suites), time scale {a.time_scale}, "
          f"{a.overhead} s a job, durations known within ±{a.noise:.0%}{', first night' if a.first_night else ''}\n")
    print("| policy | wall ÷ bound, mean (min-max over seeds) | wall - bound s |\n|---|---|---|")
    for name, (release, feed, take) in policies.items():
        ratios, excess = [], []
        for seed in range(a.seeds):
            night = Night(a.targets, a.suites, a.time_scale, seed, a.noise)
            wall = Farm(night, a.slots, a.overhead).run(release, feed, take)
            ratios.append(wall / night.bound(a.slots))
            excess.append(wall - night.bound(a.slots))
        print(f"| {name} | {statistics.fmean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
              f"{statistics.fmean(excess):.1f} |")


if __name__ == "__main__":
    main()
