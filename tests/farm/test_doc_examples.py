"""docs/projects.md's `./configure && make` example, built for real: its configure script,
Makefile and catalog are read from the page, the C sources are the test's, and
`gearfarm project check` builds it and runs `make check` on both of its targets as a worker
would (sandboxed, from a snapshot, through a real artifact)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.farmkit import GIT, commit, gearfarm
from tests.subprojects import doc_block

T_KV = r"""#include <stdio.h>
#include "kv.h"
static int n;
static void check(int ok, const char *what) { printf("%sok %d - %s\n", ok ? "" : "not ", ++n, what); }
int main(void) {
    printf("1..3\n");
    check(kv_put(1, 10) == 0, "put");
    check(kv_get(1) == 10, "get");
    printf("ok %d - delete # SKIP not written yet\n", ++n);
    return 0;
}
"""


def kvconf(dest: Path) -> Path:
    files = {
        "configure": doc_block("# kvconf/configure"),
        "Makefile": doc_block("# kvconf/Makefile"),
        "jobs/catalog.toml": doc_block("# kvconf/jobs/catalog.toml"),
        "kv.h": "int kv_put(int k, int v);\nint kv_get(int k);\n",
        "kv.c": '#include "kv.h"\nstatic int keys[16], vals[16], used;\n'
                "int kv_put(int k, int v) { if (used == 16) return -1; keys[used] = k; vals[used++] = v; return 0; }\n"
                "int kv_get(int k) { for (int i = 0; i < used; i++) if (keys[i] == k) return vals[i]; return -1; }\n",
        "t_kv.c": T_KV,
    }
    for name, text in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    (dest / "configure").chmod(0o755)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    commit(dest, "import")
    return dest


@pytest.mark.parametrize("target", ["linux-x86_64", "linux-i686"])
def test_the_configure_make_example_builds_and_passes_make_check(tmp_path: Path, target: str) -> None:
    repo = kvconf(tmp_path / "kvconf")
    p = gearfarm("project", "check", "--repo", str(repo), "--target", target, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "build passed; artifact would hold 4 files" in out, out
    assert "suite check (tap): passed, 3 test cases 2 passed, 1 skipped" in out, out
