"""The scripted wall-clock scenario of issue #12, repeated: does the farm flag a 5 % slower
insert path on the first night it is built, at its revision, with no alarm on a quiet night?

One embedded farm (gearmand, MinIO, build and perf workers, SQLite) and one engine repository
(tests/scenario.py). Each repetition: QUIET nightlies whose commits change the binary but not
its speed, the slow commit, AFTER quiet nightlies, the revert. Every night runs iiBench's
wall-clock insert rate as A/B pairs against the last good build, alone on the host. Prints
each night's paired estimate with its interval, the host's quietness and the alarms, then the
tally. Needs a quiet machine: anything else running moves wall-clock figures.

Run: .venv/bin/python bench/perf_scenario.py [--repetitions 10] [--quiet 4] [--after 1]
     [--pairs 30] [--precision 0.0075]
     [--most-pairs 400] [--rows 20000] [--slowdown 0.05]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.scenario import MOST_PAIRS, PAIRS, PRECISION, ROWS, SLOWDOWN, Scenario, describe  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repetitions", type=int, default=10)
    ap.add_argument("--quiet", type=int, default=4, help="quiet nights before the slow commit")
    ap.add_argument("--after", type=int, default=1, help="quiet nights after it, before the revert")
    ap.add_argument("--pairs", type=int, default=PAIRS, help="pairs every night runs at least")
    ap.add_argument("--precision", type=float, default=PRECISION,
                    help="then more pairs until the estimate's standard error is this small")
    ap.add_argument("--most-pairs", type=int, default=MOST_PAIRS)
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--slowdown", type=float, default=SLOWDOWN,
                    help="the share of its own time the slow commit adds to the insert loop")
    args = ap.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gearfarm-scenario-") as tmp:
        sc = Scenario(Path(tmp), pairs=args.pairs, rows=args.rows, fraction=args.slowdown,
                      precision=args.precision, most_pairs=args.most_pairs)
        sc.start()
        try:
            results = []
            for r in range(1, args.repetitions + 1):
                res = sc.repetition(args.quiet, args.after)
                results.append(res)
                print(f"\nrepetition {r}: slowdown {'FLAGGED on its first night' if res['flagged'] else 'MISSED'}, "
                      f"{len(res['false_alarms'])} false alarm(s)")
                for n in res["nights"]:
                    print("  " + describe(n))
                sys.stdout.flush()
        finally:
            sc.stop()
    flagged = sum(r["flagged"] for r in results)
    clean = sum(not r["false_alarms"] for r in results)
    both = sum(r["flagged"] and not r["false_alarms"] for r in results)
    quiet_nights = sum(n.kind == "quiet" for r in results for n in r["nights"])
    slow = [r["slow"].figure["change"] for r in results if r["slow"].figure and r["slow"].figure.get("pairs")]
    print(f"\n{args.repetitions} repetitions ({args.quiet} quiet nights, slow commit, {args.after} quiet, revert; "
          f"{args.pairs}-{args.most_pairs} pairs of {args.rows} rows to a {args.precision:.2%} standard error) "
          f"in {time.time() - started:.0f} s")
    print(f"slowdown flagged on its first night at its revision: {flagged}/{args.repetitions}")
    print(f"repetitions with no alarm on any of their quiet nights: {clean}/{args.repetitions} "
          f"({quiet_nights} quiet nights in all)")
    print(f"both: {both}/{args.repetitions}")
    if slow:
        print("paired estimate on the slow nights: " + ", ".join(f"{c * 100:+.2f} %" for c in slow))
    return 0 if both >= 9 * args.repetitions // 10 else 1


if __name__ == "__main__":
    sys.exit(main())
