"""The small C projects of 16 commits the bisection tests (tests/bisection/test_bisection.py,
test_grouped.py) and bench/bisect_scenario.py bisect: calc, whose unit cases break at commits 5
(mul) and 11 (add), with a case that fails at random on 30 % of runs in a suite of its own;
grid, where one commit (9) breaks seven of its eight cases at once; and spin, whose operations
do 5 % more work from commit 6, timed by the wall clock."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.farmkit import GIT, commit, gearfarm

# A TAP test program: DECLARATIONS (of the code under test) and CHECKS (its cases) filled in.
TAP_PROGRAM = r"""#include <stdio.h>
#include <string.h>
DECLARATIONS
static int n, argc_;
static char **argv_;
/* With arguments, only the cases they name run (the catalog's `only`). */
static int wanted(const char *what) {
    if (argc_ < 2) return 1;
    for (int i = 1; i < argc_; i++) if (!strcmp(argv_[i], what)) return 1;
    return 0;
}
static void check(int ok, const char *what) {
    if (wanted(what)) printf("%sok %d - %s\n", ok ? "" : "not ", ++n, what);
}
int main(int argc, char **argv) {
    argc_ = argc, argv_ = argv;
CHECKS
    printf("1..%d\n", n);
    return 0;
}
"""


def tap_program(declarations: str, checks: str) -> str:
    return TAP_PROGRAM.replace("DECLARATIONS", declarations).replace("CHECKS", checks)


TEST = tap_program('#include "calc.h"',
                   '    check(calc_add(2, 3) == 5, "add");\n    check(calc_mul(2, 3) == 6, "mul");')
COIN = r"""#define _DEFAULT_SOURCE
#include <stdio.h>
#include <sys/random.h>
int main(void) {
    unsigned r = 0;
    /* getrandom, not time or pid: repetitions start within a second, in fresh pid namespaces. */
    if (getrandom(&r, sizeof r, 0) != (long)sizeof r) return 2;
    printf("1..1\n%sok 1 - coin\n", r % 100 >= 30 ? "" : "not "); /* fails on 30 % of runs */
    return 0;
}
"""
CATALOG = """schema = 2

[build]
argv = ["make", "CC={cc}"]
outputs = ["t_calc", "t_coin"]
timeout = 120

[suites.tap]
argv = ["{root}/t_calc"]
format = "tap"
timeout = 60
only = ["{case}"]

[suites.chance]
argv = ["{root}/t_coin"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
suites = ["tap", "chance"]
"""
GOOD_ADD = "int calc_add(int a, int b) { return a + b; }"
BAD_ADD = "int calc_add(int a, int b) { return a + b + (a > 1); }"
GOOD_MUL = "int calc_mul(int a, int b) { return a * b; }"
BAD_MUL = "int calc_mul(int a, int b) { return a * b + (b > 2); }"


SPIN_CATALOG = """schema = 2

[build]
argv = ["make", "CC={cc}"]
outputs = ["spin"]
timeout = 120

[benchmarks.spin]
argv = ["{root}/spin"]
timeout = 60
metrics = { ops_per_sec = "higher" }
metrics_pattern = '"(?P<metric>[a-z_]+)":(?P<value>[0-9.]+)'

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
perf = true
suites = []
"""
SPIN = r"""#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <time.h>
uint64_t work(uint64_t x);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(void) {
    volatile uint64_t sink = 0;
    const long ops = 200000;
    double t0 = now();
    for (long i = 0; i < ops; i++) sink += work((uint64_t)i);
    printf("{\"ops_per_sec\":%.1f}\n", (double)ops / (now() - t0));
    return 0;
}
"""


def spin_repo(dest: Path, label: str = "") -> list[str]:
    """16 commits; the 6th makes each operation do 5 % more work (420 rounds instead of 400).
    ``label`` makes the commits a history of their own (copies made within a second are
    otherwise the same commits, and share their builds)."""
    dest.mkdir(parents=True)
    (dest / ".gearfarm").mkdir()
    (dest / ".gearfarm" / "catalog.toml").write_text(SPIN_CATALOG)
    (dest / "Makefile").write_text("CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n"
                                   "spin: spin.c work.c\n\t$(CC) $(CFLAGS) -o $@ spin.c work.c\n")
    (dest / "spin.c").write_text(SPIN)
    (dest / "README").write_text(f"spin {label}\n")
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = []
    for i in range(1, 17):
        rounds = 420 if i >= 6 else 400
        (dest / "work.c").write_text(f"#include <stdint.h>\n/* revision {i} */\nuint64_t work(uint64_t x) {{\n"
                                     f"    for (int k = 0; k < {rounds}; k++) x = x * 6364136223846793005u + "
                                     "1442695040888963407u;\n    return x;\n}\n")
        revs.append(commit(dest, "work: one more mixing step per round (safer)" if i == 6 else f"commit {i}: tidy"))
    return revs


def calc_repo(dest: Path) -> list[str]:
    """16 commits; the 5th breaks calc_mul and the 11th calc_add. Every commit changes the code
    (each is its own build)."""
    dest.mkdir(parents=True)
    (dest / ".gearfarm").mkdir()
    (dest / ".gearfarm" / "catalog.toml").write_text(CATALOG)
    (dest / "Makefile").write_text("CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\nall: t_calc t_coin\n"
                                   "t_calc: t_calc.c calc.c calc.h\n\t$(CC) $(CFLAGS) -o $@ t_calc.c calc.c\n"
                                   "t_coin: t_coin.c\n\t$(CC) $(CFLAGS) -o $@ t_coin.c\n")
    (dest / "calc.h").write_text("int calc_add(int a, int b);\nint calc_mul(int a, int b);\n")
    (dest / "t_calc.c").write_text(TEST)
    (dest / "t_coin.c").write_text(COIN)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = []
    subjects = {5: "calc: mul rounds (faster)", 11: "calc: add rounds up past one (faster)"}
    for i in range(1, 17):
        (dest / "calc.c").write_text(f'#include "calc.h"\nconst char calc_revision[] = "{i}";\n'
                                     f"{BAD_ADD if i >= 11 else GOOD_ADD}\n{BAD_MUL if i >= 5 else GOOD_MUL}\n")
        revs.append(commit(dest, subjects.get(i, f"commit {i}: tidy")))
    return revs


# grid: seven cases read one shared helper, so one commit that changes it breaks all seven
# (issue #35: one culprit, seven failures, one bisection); "sum" does not read it.
GRID_CASES = ("one", "two", "three", "four", "five", "six", "seven")
GRID_TEST = tap_program(
    "int grid_step(void);",
    '    static const char *names[] = {"one", "two", "three", "four", "five", "six", "seven"};\n'
    "    for (int k = 1; k <= 7; k++) check(grid_step() * k == 2 * k, names[k - 1]);\n"
    '    check(1 + 1 == 2, "sum");')
GRID_CATALOG = """schema = 2

[build]
argv = ["make", "CC={cc}"]
outputs = ["t_grid"]
timeout = 120

[suites.tap]
argv = ["{root}/t_grid"]
format = "tap"
timeout = 60
only = ["{case}"]

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
suites = ["tap"]
"""
GRID_CULPRIT = 9


def grid_repo(dest: Path) -> list[str]:
    """16 commits; the 9th makes grid_step 3 instead of 2, which breaks the seven cases of
    GRID_CASES. Every commit changes the code (each is its own build)."""
    dest.mkdir(parents=True)
    (dest / ".gearfarm").mkdir()
    (dest / ".gearfarm" / "catalog.toml").write_text(GRID_CATALOG)
    (dest / "Makefile").write_text("CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n"
                                   "t_grid: t_grid.c grid.c\n\t$(CC) $(CFLAGS) -o $@ t_grid.c grid.c\n")
    (dest / "t_grid.c").write_text(GRID_TEST)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = []
    for i in range(1, 17):
        (dest / "grid.c").write_text(f'const char grid_revision[] = "{i}";\n'
                                     f"int grid_step(void) {{ return {3 if i >= GRID_CULPRIT else 2}; }}\n")
        revs.append(commit(dest, "grid: a coarser step (faster)" if i == GRID_CULPRIT else f"commit {i}: tidy"))
    return revs


def nightly(config: Path, project: str, rev: str, run_id: str) -> subprocess.CompletedProcess[str]:
    """A nightly of ``project``'s unit suite at ``rev`` (no benchmarks): new failures it finds
    are bisected after its mail ([bisect] auto)."""
    return gearfarm("nightly", "--config", str(config), "--project", project, "--rev", rev, "--suites", "tap",
                    "--benchmarks", "none", "--run-id", run_id, timeout=1800)
