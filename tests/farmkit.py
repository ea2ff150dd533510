"""Test helpers for whole-farm tests: a temporary git repository of the engine and catalog,
and running the real `gearfarm` command against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=gearfarm-test", "-c", "user.email=test@gearfarm.local"]


def make_repo(dest: Path) -> Path:
    """A git repository holding this checkout's engine/ and jobs/ (working tree, not HEAD, so
    the tests test the code as it is)."""
    dest.mkdir(parents=True)
    for part in ("engine", "jobs"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("build", "*.o"))
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    commit(dest, "engine import")
    return dest


def commit(repo: Path, message: str) -> str:
    subprocess.run(GIT + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(GIT + ["commit", "-q", "--allow-empty", "-m", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def gearfarm(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gearfarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def edit_catalog(repo: Path, old: str, new: str, message: str) -> str:
    """Change the repository's job catalog (``old`` must be in it, so a catalog that moved on
    fails loudly instead of testing nothing) and commit; returns the new revision."""
    cat = repo / "jobs" / "catalog.toml"
    text = cat.read_text()
    assert old in text, f"{old!r} is not in {cat}"
    cat.write_text(text.replace(old, new))
    return commit(repo, message)


def counted_iibench(rows: int, repetitions: int) -> str:
    """A catalog entry for iiBench measured in instructions (callgrind): the same count on any
    host, so a change of the code is certain to show and nothing else can."""
    return f"""
[benchmarks.iibench-quick]
argv = ["{{root}}/engine/build/{{target}}/gfe-bench{{exe}}", "iibench", "--rows", "{rows}", "--cache-mb", "64",
        "--index", "betree", "--seed", "{{seed}}", "--dir", "{{scratch}}"]
timeout = 300
repetitions = {repetitions}
counter = "instructions"
metrics = {{ instructions = "lower" }}
curves = [{{ title = "insert rate by rows inserted", x = "rows", y = "interval_rate" }}]
"""


# Extra hashing over every row: about a fifth more work per insert (iiBench costs ~13,000
# instructions a row here), so the insert path gets ~20 % slower on any host.
SLOW_ANCHOR = "            gfe_batch_clear(b);\n        }"
SLOWDOWN = """            gfe_batch_clear(b);
        }
        {
            volatile uint64_t h = 0;
            for (int z = 0; z < 160; z++) h = h * 31u + row[z % (int)sizeof row];
        }"""


def slow_down_inserts(repo: Path) -> None:
    """Make iiBench's insert path ~20 % slower in the repository's engine (not committed)."""
    bench = repo / "engine" / "tools" / "bench.c"
    head, sep, body = bench.read_text().partition("static int iibench(")
    assert sep and SLOW_ANCHOR in body, "engine/tools/bench.c changed: update tests/farmkit.py's SLOW_ANCHOR"
    bench.write_text(head + sep + body.replace(SLOW_ANCHOR, SLOWDOWN, 1))
