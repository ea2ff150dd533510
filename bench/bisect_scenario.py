"""Issue #16's wall-clock bisection, repeated: is a 5 % slowdown planted at commit 6 of 16 named
at commit 6, and does a range with no change (commits 1..5) give no culprit, on this machine?

One embedded farm (gearmand, MinIO, build, test and perf workers, SQLite). Each repetition makes
a fresh copy of the spin project (tests/bisect_projects.py; new commits, so nothing is reused
from an earlier repetition) and runs `gearfarm bisect` twice: over c01..c16, then over c01..c05.
Prints each bisection's verdict, the revisions judged with their pairs and estimates, builds
made, jobs and seconds, then the tally. `--load N` keeps N cores busy meanwhile (a noisier host).

Run: .venv/bin/python bench/bisect_scenario.py [--repetitions 10] [--load 0]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig  # noqa: E402
from gearfarm.db.results import ResultsDB  # noqa: E402
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm  # noqa: E402
from tests.bisect_projects import SPIN_CATALOG, spin_repo  # noqa: E402
from tests.farmkit import gearfarm  # noqa: E402

TARGET = "linux-x86_64"


def _spin() -> None:
    while True:
        pass


def bisect(farm: EmbeddedFarm, project: str, good: str, bad: str) -> tuple[int, float]:
    t0 = time.monotonic()
    p = gearfarm("bisect", f"{good}..{bad}", "--benchmark", "spin", "--metric", "ops_per_sec", "--project", project,
                 "--target", TARGET, "--config", str(farm.config_path), timeout=1800)
    return p.returncode, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repetitions", type=int, default=10)
    ap.add_argument("--load", type=int, default=0, help="cores kept busy by other processes meanwhile")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gearfarm-bisect-bench-"))
    repos = {f"spin{i}": spin_repo(base / f"spin{i}", label=f"{i} {time.time()}") for i in range(args.repetitions)}
    farm = EmbeddedFarm(base / "state", base / "spin0",
                        projects=[ProjectConfig(name=n, repo=str(base / n), catalog=".gearfarm/catalog.toml")
                                  for n in repos])
    farm.start([catalog_mod.parse(SPIN_CATALOG, "spin")], [TARGET], perf=True)
    burners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    right = {"found": 0, "none": 0}
    try:
        db = ResultsDB(config_mod.load(farm.config_path).database.url)
        for name, revs in repos.items():
            for kind, bad, want in (("found", revs[-1], revs[5]), ("none", revs[4], None)):
                code, seconds = bisect(farm, name, revs[0], bad)
                b = db.bisections(project=name)[0]
                ok = b.culprit_rev == want and (code == 0) == (want is not None)
                right[kind] += ok
                d = b.detail
                print(f"{name} c01..c{revs.index(bad) + 1:02d}: {b.state:<10} culprit "
                      f"{f'c{revs.index(b.culprit_rev) + 1:02d}' if b.culprit_rev else '-':<4} "
                      f"{'right' if ok else 'WRONG'}  {d.get('builds', 0)} builds, {d.get('jobs', 0)} jobs, "
                      f"{seconds:.1f}s")
                for e in sorted(d.get("probes", []), key=lambda e: revs.index(e["rev"])):
                    if "change" in e:
                        print(f"    c{revs.index(e['rev']) + 1:02d} {e['verdict']:<5} {e['change']:+.2%} over "
                              f"{e['pairs']} pairs, p={e['p']:.3g} ({e['result']})")
    finally:
        for b in burners:
            b.terminate()
        farm.stop()
    n = args.repetitions
    print(f"\nslowdown at c06 named c06: {right['found']}/{n}; no change in c01..c05 gave no culprit: "
          f"{right['none']}/{n} (load: {args.load} busy cores)")
    return 0 if right["found"] == right["none"] == n else 1


if __name__ == "__main__":
    sys.exit(main())
