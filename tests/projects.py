"""Three small projects, each a real git repository built by a different build system, for the
farm's tests of "any team's project": a Make project whose tests print TAP, a CMake project
tested through CTest, and a C library (Makefile in a subdirectory) whose tests are plain
programs judged by their exit status, its catalog kept beside the farm config."""

from __future__ import annotations

from pathlib import Path

from tests.farmkit import GIT, commit

TARGETS = ("linux-x86_64", "linux-i686")
# Both targets' programs run on this host: i686 ones are linked statically.
_TARGETS_TOML = """
[targets.linux-x86_64]
tools = ["gcc", "make"{extra}]
vars = {{ cc = "gcc", ldflags = "" }}
suites = [{suites}]

[targets.linux-i686]
tools = ["i686-linux-gnu-gcc", "make"{extra}]
vars = {{ cc = "i686-linux-gnu-gcc", ldflags = "-static" }}
suites = [{suites}]
"""


# The smallest project a farm test runs: a build of one file and one TAP case on linux-x86_64
# (an innocent project beside a hostile one, or a farm's start/stop cycles).
CATALOG_TINY = """schema = 2

[build]
argv = ["sh", "-c", "echo built > out.txt"]
outputs = ["out.txt"]
timeout = 60

[suites.quick]
argv = ["sh", "-c", "echo 1..1; echo ok 1 - quick"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["sh"]
suites = ["quick"]
"""


def _init(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    import subprocess

    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=repo, check=True)
    return commit(repo, "import")


# --------------------------------------------------------------------------- make + TAP

TAPKV_TEST = r"""#include <stdio.h>
#include <string.h>
#include "kv.h"
static int n;
static void check(int ok, const char *what) { printf("%sok %d - %s\n", ok ? "" : "not ", ++n, what); }
int main(void) {
    kv *t = kv_new();
    printf("1..%d\n", TESTS);
    check(kv_put(t, "a", 1) == 0, "put a");
    check(kv_get(t, "a") == 1, "get a");
    check(kv_put(t, "b", 2) == 0 && kv_get(t, "b") == 2, "put and get b");
    check(kv_del(t, "a") == 0 && kv_get(t, "a") == -1, "delete a");
    printf("ok %d - compaction # SKIP not implemented\n", ++n);
    EXTRA
    kv_free(t);
    return 0;
}
"""


def tapkv(dest: Path) -> Path:
    """Make project: `make` builds libkv.a and t_kv, which prints TAP on stdout."""
    _init(dest, {
        "Makefile": "CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n"
                    "all: libkv.a t_kv\n"
                    "libkv.a: kv.o\n\tar rcs $@ $^\n"
                    "t_kv: tests/t_kv.c libkv.a\n\t$(CC) $(CFLAGS) -I. $(LDFLAGS) -o $@ tests/t_kv.c libkv.a\n"
                    "kv.o: kv.c kv.h\n\t$(CC) $(CFLAGS) -c kv.c\n",
        "kv.h": "typedef struct kv kv;\nkv *kv_new(void);\nvoid kv_free(kv *);\n"
                "int kv_put(kv *, const char *, int);\nint kv_get(kv *, const char *);\n"
                "int kv_del(kv *, const char *);\n",
        "kv.c": '#include <stdlib.h>\n#include <string.h>\n#include "kv.h"\n'
                "struct kv { char k[16][8]; int v[16]; int n; };\n"
                "kv *kv_new(void) { return calloc(1, sizeof(kv)); }\nvoid kv_free(kv *t) { free(t); }\n"
                "static int find(kv *t, const char *k) { for (int i = 0; i < t->n; i++) "
                "if (!strcmp(t->k[i], k)) return i; return -1; }\n"
                "int kv_put(kv *t, const char *k, int v) { int i = find(t, k); if (i < 0) { if (t->n == 16) "
                "return -1; i = t->n++; strncpy(t->k[i], k, 7); } t->v[i] = v; return 0; }\n"
                "int kv_get(kv *t, const char *k) { int i = find(t, k); return i < 0 ? -1 : t->v[i]; }\n"
                "int kv_del(kv *t, const char *k) { int i = find(t, k); if (i < 0) return -1; t->n--; "
                "memmove(t->k[i], t->k[i + 1], (size_t)(t->n - i) * 8); "
                "memmove(&t->v[i], &t->v[i + 1], (size_t)(t->n - i) * sizeof(int)); return 0; }\n",
        "tests/t_kv.c": TAPKV_TEST.replace("TESTS", "5").replace("EXTRA", ""),
        ".gearfarm/catalog.toml": """schema = 2

[build]
argv = ["make", "CC={cc}", "LDFLAGS={ldflags}"]
outputs = ["libkv.a", "t_kv"]
timeout = 120

[suites.tap]
description = "the key-value API, as TAP"
argv = ["{root}/t_kv"]
format = "tap"
timeout = 60
""" + _TARGETS_TOML.format(extra="", suites='"tap"'),
    })
    return dest


def tapkv_add_case(repo: Path) -> str:
    """A new TAP test (a commit made after the workers started, in the tests)."""
    test = repo / "tests" / "t_kv.c"
    test.write_text(TAPKV_TEST.replace("TESTS", "6").replace(
        "EXTRA", 'check(kv_put(t, "c", 3) == 0 && kv_get(t, "c") == 3, "put and get c");'))
    return commit(repo, "t_kv: test c")


def tapkv_break_delete(repo: Path) -> str:
    """A planted bug: delete forgets the key's value slot, so "delete a" fails."""
    kv = repo / "kv.c"
    text = kv.read_text()
    assert "t->n--;" in text
    kv.write_text(text.replace("t->n--;", "return 0; t->n--;"))
    return commit(repo, "kv: faster delete")


# --------------------------------------------------------------------------- CMake + CTest

def cmring(dest: Path) -> Path:
    """CMake project: a ring buffer library and three test programs registered with add_test."""
    tests = {"push_pop": "ring_push(&r, 1); ring_push(&r, 2); return ring_pop(&r) == 1 && ring_pop(&r) == 2 ? 0 : 1;",
             "wrap": "for (int i = 0; i < 20; i++) ring_push(&r, i); return ring_pop(&r) == 12 ? 0 : 1;",
             "empty": "return ring_pop(&r) == -1 ? 0 : 1;"}
    files = {
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.16)\nproject(cmring C)\nenable_testing()\n"
                          "add_library(ring STATIC ring.c)\n"
                          + "".join(f"add_executable(test_{n} tests/test_{n}.c)\n"
                                    f"target_link_libraries(test_{n} ring)\n"
                                    f"add_test(NAME {n} COMMAND test_{n})\n" for n in tests),
        "ring.h": "typedef struct { int v[8]; unsigned head, tail; } ring;\nvoid ring_push(ring *, int);\n"
                  "int ring_pop(ring *);\n",
        "ring.c": '#include "ring.h"\nvoid ring_push(ring *r, int x) { r->v[r->head++ % 8] = x; '
                  "if (r->head - r->tail > 8) r->tail = r->head - 8; }\n"
                  "int ring_pop(ring *r) { return r->tail == r->head ? -1 : r->v[r->tail++ % 8]; }\n",
        "ci/build.sh": "#!/bin/sh\n# Configure and build out of tree (what the farm runs).\nset -e\n"
                       'cmake -S . -B build -DCMAKE_C_COMPILER="$CC" -DCMAKE_EXE_LINKER_FLAGS="$LDFLAGS" '
                       "-DCMAKE_BUILD_TYPE=Release >/dev/null\ncmake --build build -j 2\n",
        "jobs/catalog.toml": """schema = 2

[build]
argv = ["sh", "ci/build.sh"]
env = { CC = "{cc}", LDFLAGS = "{ldflags}" }
outputs = ["build"]
timeout = 300

[suites.ctest]
description = "the ring buffer's CTest tests"
format = "ctest"
cwd = "build"
timeout = 120
""" + _TARGETS_TOML.format(extra=', "cmake"', suites='"ctest"'),
    }
    files.update({f"tests/test_{n}.c": f'#include "../ring.h"\nint main(void) {{ ring r = {{0}}; {body} }}\n'
                  for n, body in tests.items()})
    _init(dest, files)
    return dest


# --------------------------------------------------------------------------- plain programs

CATALOG_PLAINC = """schema = 2

# Kept beside the farm config: the library's repository carries no catalog.
[build]
argv = ["make", "-C", "lib", "CC={cc}", "LDFLAGS={ldflags}", "all", "tests"]
outputs = ["lib/libcrc.a", "lib/test_crc", "lib/test_vectors"]
timeout = 120

[suites.crc]
argv = ["{root}/lib/test_crc"]
format = "exit-code"

[suites.vectors]
argv = ["{root}/lib/test_vectors", "{root}/lib/vectors.txt"]
format = "exit-code"
source = true
""" + _TARGETS_TOML.format(extra="", suites='"crc", "vectors"')


def plainc(dest: Path) -> Path:
    """A C library laid out as such libraries often are: lib/Makefile, test programs that exit
    non-zero on failure, and test data in the source tree (read by the `vectors` suite)."""
    _init(dest, {
        "lib/Makefile": "CC ?= cc\nCFLAGS = -std=c11 -O2 -Wall -Wextra -Werror\n"
                        "all: libcrc.a\ntests: test_crc test_vectors\n"
                        "libcrc.a: crc.o\n\tar rcs $@ $^\n"
                        "test_%: test_%.c libcrc.a\n\t$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< libcrc.a\n",
        "lib/crc.h": "#include <stdint.h>\n#include <stddef.h>\nuint32_t crc32(const void *, size_t);\n",
        "lib/crc.c": '#include "crc.h"\nuint32_t crc32(const void *p, size_t n) { const unsigned char *b = p; '
                     "uint32_t c = 0xFFFFFFFFu; while (n--) { c ^= *b++; for (int k = 0; k < 8; k++) "
                     "c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1))); } return ~c; }\n",
        "lib/test_crc.c": '#include <stdio.h>\n#include "crc.h"\nint main(void) { uint32_t c = crc32("123456789", 9);'
                          ' printf("crc32 = %08x\\n", (unsigned)c); return c == 0xCBF43926u ? 0 : 1; }\n',
        "lib/test_vectors.c": '#include <stdio.h>\n#include <string.h>\n#include "crc.h"\n'
                              "int main(int argc, char **argv) { if (argc < 2) return 2; FILE *f = fopen(argv[1], "
                              '"r"); if (!f) { perror(argv[1]); return 2; } char s[64]; unsigned want; int n = 0; '
                              'while (fscanf(f, "%63s %x", s, &want) == 2) { n++; if (crc32(s, strlen(s)) != want) '
                              '{ printf("crc32(%s) wrong\\n", s); return 1; } } printf("%d vectors\\n", n); '
                              "return n ? 0 : 1; }\n",
        "lib/vectors.txt": "123456789 cbf43926\nabc 352441c2\n",
    })
    return dest


# --------------------------------------------------------------------------- a build per target

CATALOG_LIBFOO = """schema = 2

# What both targets' builds share: the Makefile, and flags every build must get (foo.c refuses
# to compile without them, so a target whose env replaced this one's would fail).
[build]
argv = ["make", "CC={cc}"]
env = { CFLAGS = "-O2 -Wall -Werror -DFOO_SHARED_FLAGS" }
outputs = ["libfoo.so", "test_foo"]
timeout = 120

[targets.linux-x86_64]
tools = ["gcc", "make"]
vars = { cc = "gcc" }
suites = ["foo"]

[targets.windows-x86_64]
exe = ".exe"
tools = ["x86_64-w64-mingw32-gcc", "make"]
vars = { cc = "x86_64-w64-mingw32-gcc" }
runner = ["wine"]
runner_env = { WINEDEBUG = "-all" }
suites = ["foo"]

# Windows builds a DLL and an .exe: its own make goal and outputs, and one more flag.
[targets.windows-x86_64.build]
argv = ["make", "CC={cc}", "windows"]
env = { LDFLAGS = "-static-libgcc" }
outputs = ["foo.dll", "test_foo{exe}"]

[suites.foo]
argv = ["{root}/test_foo{exe}"]
format = "exit-code"
timeout = 120
"""
LIBFOO_TARGETS = ("linux-x86_64", "windows-x86_64")


def libfoo(dest: Path) -> Path:
    """A shared library whose files differ by target, as zlib's do: libfoo.so and test_foo on
    Linux, foo.dll and test_foo.exe (cross-built with mingw, run under wine) on Windows."""
    _init(dest, {
        "Makefile": "CC ?= cc\n"
                    "all: libfoo.so test_foo\n"
                    "libfoo.so: foo.c foo.h\n\t$(CC) $(CFLAGS) -shared -fPIC -o $@ foo.c\n"
                    "test_foo: test_foo.c libfoo.so\n\t$(CC) $(CFLAGS) -o $@ test_foo.c -L. -lfoo "
                    "-Wl,-rpath,'$$ORIGIN'\n"
                    "# Windows finds the DLL beside the program.\n"
                    "windows: foo.dll test_foo.exe\n"
                    "foo.dll: foo.c foo.h\n\t$(CC) $(CFLAGS) $(LDFLAGS) -shared -o $@ foo.c\n"
                    "test_foo.exe: test_foo.c foo.dll\n\t$(CC) $(CFLAGS) $(LDFLAGS) -o $@ test_foo.c foo.dll\n",
        "foo.h": "int foo_add(int, int);\n",
        "foo.c": '#include "foo.h"\n#ifndef FOO_SHARED_FLAGS\n#error "built without [build] env CFLAGS"\n#endif\n'
                 "int foo_add(int a, int b) { return a + b; }\n",
        "test_foo.c": '#include <stdio.h>\n#include "foo.h"\nint main(void) { int r = foo_add(2, 3); '
                      'printf("foo_add(2, 3) = %d\\n", r); return r == 5 ? 0 : 1; }\n',
        "jobs/catalog.toml": CATALOG_LIBFOO,
    })
    return dest
