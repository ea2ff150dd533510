"""Are the nightly's wall-clock figures the binary's own? (issue #12)

Runs the default nightly (every target, suite and benchmark of jobs/catalog.toml, embedded
farm) three times at one revision, then runs the very binary those nightlies measured (the
linux-x86_64 artifact, from the farm's S3) alone on the host as many times as the nightlies ran
it in all. Prints iiBench's insert rate per nightly (the median of its runs), the spread between
the three, each against the alone figure, and how quiet the host was while each perf job
measured. Goal: within 3 % of each other and within 10 % of the binary alone.

Run: .venv/bin/python bench/perf_alone.py [--nightlies 3] [--benchmark iibench-betree]
     [--metric insert_rate] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gearfarm import config as config_mod  # noqa: E402
from gearfarm.formats import catalog as catalog_mod  # noqa: E402
from gearfarm.hosts.hostlock import HostLock  # noqa: E402
from gearfarm.s3 import artifact  # noqa: E402
from gearfarm.s3.store import ArtifactStore  # noqa: E402

TARGET = "linux-x86_64"


def nightly(state: Path, rev: str, run_id: str, keep: bool) -> dict:  # type: ignore[type-arg]
    """One whole default nightly; ``keep`` leaves the farm up (its S3 holds the artifact)."""
    p = subprocess.run([str(ROOT / ".venv/bin/gearfarm"), "nightly", "--state-dir", str(state),
                        *(["--keep"] if keep else []), "--rev", rev, "--run-id", run_id],
                       cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if p.returncode not in (0, 1):
        sys.exit(f"nightly {run_id} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads((state / "runs" / run_id / "report.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nightlies", type=int, default=3)
    ap.add_argument("--benchmark", default="iibench-betree")
    ap.add_argument("--metric", default="insert_rate")
    ap.add_argument("--rev", default="HEAD")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", args.rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    cat = catalog_mod.load_file(ROOT / "jobs" / "catalog.toml")
    bench = cat.benchmark(args.benchmark)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gearfarm-alone-") as tmp:
        state = Path(tmp) / "state"
        try:
            reports = [nightly(state, rev, f"same{i + 1}", i + 1 == args.nightlies) for i in range(args.nightlies)]
            figures, quiet, runs = [], [], 0
            for rep in reports:
                job = next(j for j in rep["jobs"] if j["target"] == TARGET and j["step"] == f"perf-{args.benchmark}")
                values = [s["value"] for s in job["samples"] if s["metric"] == args.metric and s["variant"] == "new"]
                figures.append(statistics.median(values))
                quiet.append(job.get("quietness", {}))
                runs += len(values)
                art = (job["artifact_key"], job["artifact_sha256"])
            # The very artifact the nightlies measured, from the farm's own S3, run alone.
            cfg = config_mod.load(state / "farm.toml")
            tree = Path(tmp) / "alone"
            archive = Path(tmp) / f"a{artifact.ARCHIVE_SUFFIX}"
            ArtifactStore(cfg.s3).get_file(art[0], archive)
            artifact.unpack(archive, tree, art[1])
        finally:
            subprocess.run([str(ROOT / ".venv/bin/gearfarm"), "farm", "stop", "--state-dir", str(state)],
                           cwd=ROOT, capture_output=True)
        vals = catalog_mod.values(cat, cat.target(TARGET), {"root": str(tree), "target": TARGET, "exe": "",
                                                            "scratch": str(Path(tmp) / "scratch"), "seed": "1",
                                                            "jobs": "1", "junit": "", "runner": ""})
        argv = catalog_mod.expand(bench.argv, vals, [])
        pattern = re.compile(bench.metrics_pattern or "")
        alone = []
        # Alone as a perf job is alone: under the host lock, so nothing of any farm runs beside it.
        with HostLock().exclusive("bench/perf_alone.py: the binary alone"):
            for _ in range(max(runs, 5)):
                shutil.rmtree(Path(tmp) / "scratch", ignore_errors=True)
                (Path(tmp) / "scratch").mkdir()
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                found = {m.group("metric"): float(m.group("value")) for m in pattern.finditer(out)}
                alone.append(found[args.metric])
    base = statistics.median(alone)
    print(f"{args.benchmark} {args.metric} of {TARGET} at {rev[:12]}: {args.nightlies} default nightlies "
          f"(every target, suite and benchmark), then the same binary alone; {time.time() - started:.0f} s\n")
    print("| nightly | figure (median of its runs) | vs alone | host load (max) | other farm jobs (max) "
          "| other processes' CPU (cores) | waited for the host (s) |")
    print("|---|---|---|---|---|---|---|")
    for i, (f, q) in enumerate(zip(figures, quiet, strict=True)):
        print(f"| same{i + 1} | {f:,.0f} | {f / base - 1:+.1%} | {q.get('load_max', float('nan')):.2f} "
              f"| {q.get('other_jobs_max', float('nan')):.0f} | {q.get('other_cpu_cores', float('nan')):.2f} "
              f"| {q.get('lock_wait', float('nan')):.1f} |")
    print(f"| alone ({len(alone)} runs) | {base:,.0f} | | | | | |")
    spread = max(figures) / min(figures) - 1
    worst = max(abs(f / base - 1) for f in figures)
    print(f"\nspread between the nightlies: {spread:.1%} (goal <= 3 %); "
          f"worst against alone: {worst:.1%} (goal <= 10 %)")
    print("command: " + " ".join(shlex.quote(a) for a in argv))
    return 0 if spread <= 0.03 and worst <= 0.10 else 1


if __name__ == "__main__":
    os.environ.setdefault("CI", "true")
    sys.exit(main())
