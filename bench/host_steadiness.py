"""Can this host hold a wall-clock benchmark's figure steady from one nightly to the next? (issue #12)

A nightly's figure for a benchmark is the median of a handful of runs made within seconds of
each other; identical nightlies are minutes apart. This probe builds the engine's native target
with the catalog's build command, then, with the host to itself (the farm's host lock,
exclusive: no build or test of any farm runs meanwhile), makes a burst of `--runs` runs of the
catalog's benchmark command back to back every `--gap` seconds, like perf jobs of nightlies
minutes apart. It prints each burst's median with the spread inside it, the CPU time the runs
used per second of wall clock (1.0: CPU-bound, so disk and I/O waits are not the cause), the
host's steal time and how much CPU the rest of the host used, and at the end the spread of the
burst medians over every three consecutive bursts (three identical nightlies) against the
3 % goal of issue #12. A host whose bursts agree inside but not with each other changes speed
by itself over minutes: no quiet phase on the host can make its absolute figures repeat, and
only measurements side by side with another build (the farm's A/B pairs, the reference build)
compare builds on it.

Run: .venv/bin/python bench/host_steadiness.py [--benchmark iibench-betree] [--metric insert_rate]
     [--bursts 8] [--runs 5] [--gap 60]
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gearfarm.formats import catalog as catalog_mod  # noqa: E402
from gearfarm.hosts import host  # noqa: E402
from gearfarm.hosts.hostlock import HostLock  # noqa: E402

TARGET = "linux-x86_64"
GOAL = 0.03


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmark", default="iibench-betree")
    ap.add_argument("--metric", default="insert_rate")
    ap.add_argument("--bursts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="runs per burst (a nightly's pairs: 5)")
    ap.add_argument("--gap", type=float, default=60.0, help="seconds from one burst's start to the next")
    args = ap.parse_args()
    if args.bursts < 3 or args.runs < 1 or args.gap < 0:
        ap.error("need --bursts >= 3 (three nightlies), --runs >= 1 and --gap >= 0")
    cat = catalog_mod.load_file(ROOT / "jobs" / "catalog.toml")
    bench = cat.benchmark(args.benchmark)
    if not bench.metrics_pattern or args.metric not in bench.metrics:
        sys.exit(f"{args.benchmark} has no wall-clock metric {args.metric!r} in jobs/catalog.toml; "
                 f"pick one of: {', '.join(bench.metrics)}")
    target = cat.target(TARGET)
    with tempfile.TemporaryDirectory(prefix="gearfarm-steadiness-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "engine", src / "engine", ignore=shutil.ignore_patterns("build"))
        scratch = Path(tmp) / "scratch"
        vals = catalog_mod.values(cat, target, {"root": str(src), "scratch": str(scratch), "seed": "1",
                                                "junit": ""})
        subprocess.run(catalog_mod.expand(cat.build_for(target).argv, vals, []), cwd=src, check=True)
        argv = catalog_mod.expand(bench.argv, vals, [])
        pattern = re.compile(bench.metrics_pattern)
        print(f"{args.benchmark} {args.metric}, {args.bursts} bursts of {args.runs} runs every {args.gap:g} s, "
              f"the host to itself; command: {' '.join(argv)}\n")
        print("| burst | at (s) | median | min-max in the burst | CPU s per wall s | steal (s) "
              "| rest of the host (cores) | load |")
        print("|---|---|---|---|---|---|---|---|")
        medians: list[float] = []
        t0 = time.monotonic()
        for b in range(args.bursts):
            time.sleep(max(0.0, t0 + b * args.gap - time.monotonic()))
            rates: list[float] = []
            with HostLock().exclusive("bench/host_steadiness.py"), host.Activity(lambda: []) as act:
                steal0, cpu0, wall0 = host.steal_seconds() or 0.0, children_cpu(), time.monotonic()
                for _ in range(args.runs):
                    shutil.rmtree(scratch, ignore_errors=True)
                    scratch.mkdir()
                    p = subprocess.run(argv, capture_output=True, text=True)
                    found = {m.group("metric"): float(m.group("value")) for m in pattern.finditer(p.stdout)}
                    if p.returncode != 0 or args.metric not in found:
                        sys.exit(f"{args.benchmark} exited {p.returncode} without printing {args.metric}; "
                                 f"the probe needs a benchmark that runs here:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
                    rates.append(found[args.metric])
                wall = time.monotonic() - wall0
                cpu, steal = children_cpu() - cpu0, (host.steal_seconds() or 0.0) - steal0
            med = statistics.median(rates)
            medians.append(med)
            q = act.summary
            print(f"| {b + 1} | {wall0 - t0:.0f} | {med:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
                  f"({max(rates) / min(rates) - 1:.1%}) | {cpu / wall:.2f} | {steal:.2f} "
                  f"| {q.get('other_cpu_cores', float('nan')):.2f} | {q['load_max']:.2f} |", flush=True)
    threes = [max(medians[i:i + 3]) / min(medians[i:i + 3]) - 1 for i in range(len(medians) - 2)]
    held = sum(s <= GOAL for s in threes)
    print(f"\nburst medians {min(medians):,.0f} to {max(medians):,.0f} ({max(medians) / min(medians) - 1:.1%}); "
          f"three consecutive bursts within {GOAL:.0%} of each other: {held} of {len(threes)} "
          f"(spreads {', '.join(f'{s:.1%}' for s in threes)})")
    return 0 if held == len(threes) else 1


if __name__ == "__main__":
    sys.exit(main())
