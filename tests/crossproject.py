"""Two small CMake projects as teams write them, for the tests of CTest on every target and of
tests that must run against the library just built:

- `crossring`: a shared ring-buffer library and four tests, one registered in each of CMake's
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

CROSS_TARGETS = ("linux-x86_64", "linux-aarch64", "windows-x86_64")
# The case each test's command form gives, and the status it must have on every target.
CROSS_CASES = {"by_name": "passed", "by_path": "passed", "old_form": "passed", "fails": "failed"}
ASSERTION = "assertion failed: ring_pop(&r) == 3 (got 2)"

_BUILD_SH = """#!/bin/sh
# Configure and build out of tree; cross settings come from the farm's target variables.
set -e
set -- -S . -B build -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Release
[ -n "$SYSTEM" ] && set -- "$@" -DCMAKE_SYSTEM_NAME="$SYSTEM" -DCMAKE_SYSTEM_PROCESSOR="$PROCESSOR" \\
    -DCMAKE_CROSSCOMPILING_EMULATOR="$EMULATOR"
cmake "$@" >/dev/null
cmake --build build -j 2
"""

_CROSS_CATALOG = """schema = 2

[build]
argv = ["sh", "ci/build.sh"]
env = { CC = "{cc}", SYSTEM = "{system}", PROCESSOR = "{processor}", EMULATOR = "{emulator}" }
outputs = ["build"]
timeout = 300

[suites.ctest]
description = "the ring buffer's CTest tests"
format = "ctest"
cwd = "build"
timeout = 300

[targets.linux-x86_64]
tools = ["gcc", "cmake"]
vars = { cc = "gcc", system = "", processor = "", emulator = "" }
suites = ["ctest"]

[targets.linux-aarch64]
tools = ["aarch64-linux-gnu-gcc", "cmake"]
runner = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
suites = ["ctest"]

[targets.linux-aarch64.vars]
cc = "aarch64-linux-gnu-gcc"
system = "Linux"
processor = "aarch64"
emulator = "qemu-aarch64;-L;/usr/aarch64-linux-gnu"

[targets.windows-x86_64]
tools = ["x86_64-w64-mingw32-gcc", "cmake"]
vars = { cc = "x86_64-w64-mingw32-gcc", system = "Windows", processor = "x86_64", emulator = "wine" }
runner = ["wine"]
runner_env = { WINEDEBUG = "-all" }
suites = ["ctest"]
"""

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
    tests = {"t_name": "by_name", "t_path": "by_path", "t_old": "old_form"}
    files = {
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.16)\nproject(crossring C)\nenable_testing()\n"
                          "add_library(ring SHARED ring.c)\n"
                          + "".join(f"add_executable({t} tests/ring_test.c)\ntarget_link_libraries({t} ring)\n"
                                    f'target_compile_definitions({t} PRIVATE TEST="{t}")\n' for t in tests)
                          + "add_executable(t_fail tests/fail.c)\ntarget_link_libraries(t_fail ring)\n"
                          "add_test(NAME by_name COMMAND t_name)\n"
                          'add_test(NAME by_path COMMAND "./t_path")\n'
                          "add_test(old_form t_old)\n"
                          "add_test(NAME fails COMMAND t_fail)\n",
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
