"""Two small CMake projects as teams write them, for the tests of CTest on every target and of
tests that must run against the library just built:

- `crossring` (the worked example of docs/projects.md, read from the page): a shared ring-buffer
  library and four tests, one registered in each of CMake's
  `add_test` forms (a target name, a path, the old two-argument form) and one that fails with an
  assertion message, cross-built for linux-aarch64 (run by qemu) and windows-x86_64 (wine) with
  CMAKE_CROSSCOMPILING_EMULATOR set as a team would set it;
- `fakez`: a shared library named like zlib (libz.so.1, whose zlibVersion() says it is the one
  built), whose test asserts from inside that it runs against that library and not the host's
  zlib; linked as CMake links by default (RUNPATH = the absolute build directory).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.projects import _init
from tests.subprojects import doc_block

CROSS_TARGETS = ("linux-x86_64", "linux-aarch64", "windows-x86_64")
# The case each test's command form gives, and the status it must have on every target.
CROSS_CASES = {"by_name": "passed", "by_path": "passed", "old_form": "passed", "fails": "failed"}
ASSERTION = "assertion failed: ring_pop(&r) == 3 (got 2)"

# The example of docs/projects.md, read from the page: what the docs show is what is tested.
_BUILD_SH = doc_block("# crossring/ci/build.sh")

_CROSS_CATALOG = doc_block("# crossring/jobs/catalog.toml")

_RING_TEST = """#include <stdio.h>
#include "../ring.h"
int main(void) {
    ring r = {0};
    ring_push(&r, 1);
    ring_push(&r, 2);
    int a = ring_pop(&r), b = ring_pop(&r);
    printf("%s: popped %d %d\\n", TEST, a, b);
    return a == 1 && b == 2 ? 0 : 1;
}
"""


def crossring(dest: Path) -> Path:
    files = {
        "CMakeLists.txt": doc_block("# crossring/CMakeLists.txt"),
        "ring.h": "typedef struct { int v[8]; unsigned head, tail; } ring;\n"
                  "void ring_push(ring *, int);\nint ring_pop(ring *);\n",
        "ring.c": '#include "ring.h"\nvoid ring_push(ring *r, int x) { r->v[r->head++ % 8] = x; }\n'
                  "int ring_pop(ring *r) { return r->tail == r->head ? -1 : r->v[r->tail++ % 8]; }\n",
        "tests/ring_test.c": _RING_TEST,
        "tests/fail.c": '#include <stdio.h>\n#include "../ring.h"\nint main(void) { ring r = {0}; ring_push(&r, 2);\n'
                        f'  int got = ring_pop(&r); if (got != 3) {{ printf("{ASSERTION.replace("2)", "%d)")}\\n", '
                        "got); return 1; } return 0; }\n",
        "ci/build.sh": _BUILD_SH,
        "jobs/catalog.toml": _CROSS_CATALOG,
    }
    _init(dest, files)
    return dest


# --------------------------------------------------------------------------- a library named like the host's

BUILT_VERSION = "9.9.9-built"
_FAKEZ_CATALOG = """schema = 2

[build]
argv = ["sh", "ci/build.sh"]
env = { CC = "gcc" }
outputs = ["build"]
timeout = 300

[suites.ctest]
format = "ctest"
cwd = "build"

[targets.linux-x86_64]
tools = ["gcc", "cmake"]
suites = ["ctest"]
"""


def fakez(dest: Path) -> Path:
    """libz.so.1 of our own, and a test that fails unless the loader gave it that library."""
    _init(dest, {
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.16)\nproject(fakez C)\nenable_testing()\n"
                          "add_library(z SHARED z.c)\nset_target_properties(z PROPERTIES SOVERSION 1)\n"
                          "add_executable(t_version t_version.c)\ntarget_link_libraries(t_version z)\n"
                          "add_test(NAME version COMMAND t_version)\n",
        "z.c": f'const char *zlibVersion(void) {{ return "{BUILT_VERSION}"; }}\n',
        "t_version.c": '#include <stdio.h>\n#include <string.h>\nconst char *zlibVersion(void);\n'
                       'int main(void) { const char *v = zlibVersion(); printf("zlibVersion() = %s\\n", v);\n'
                       f'  if (strcmp(v, "{BUILT_VERSION}") != 0) {{ printf("assertion failed: the library '
                       'tested is not the one built\\n"); return 1; } return 0; }\n',
        "ci/build.sh": _BUILD_SH,
        "jobs/catalog.toml": _FAKEZ_CATALOG,
    })
    return dest


def build_here(repo: Path, env: dict[str, str]) -> None:
    """Build a project as the farm's build step would, outside the farm (for step-level tests)."""
    subprocess.run(["sh", "ci/build.sh"], cwd=repo, env=env, check=True, capture_output=True, timeout=300)
