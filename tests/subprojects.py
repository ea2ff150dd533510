"""docs/projects.md's "project with submodules", built for real: three git repositories side by
side as on a team's server (bare, under ``<base>/git/``), calc whose submodule picotest has its
own submodule tinyfmt, each pinned by a gitlink. The .gitmodules files, calc's Makefile, its
catalog and its [[projects]] entry are read from the documentation, so the example the docs
show is the one the tests build."""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.farmkit import GIT, ROOT

DOC = ROOT / "docs" / "projects.md"
TARGETS = ("linux-x86_64", "linux-i686")
CASES = ["add", "mul"]


def doc_block(first_line: str) -> str:
    """The fenced block of docs/projects.md whose first line starts with ``first_line``."""
    for body in re.findall(r"^```[a-z]*\n(.*?)^```$", DOC.read_text(), re.S | re.M):
        if body.partition("\n")[0].startswith(first_line):
            return body
    raise AssertionError(f"docs/projects.md has no block starting {first_line!r}")


def doc_project() -> dict[str, str]:
    """The example's [[projects]] entry, as the docs write it."""
    return tomllib.loads(doc_block("# /etc/gearfarm/farm.toml, calc's entry"))["projects"][0]


TINYFMT = {
    "fmt.h": "#include <stddef.h>\nsize_t fmt_uint(char *buf, unsigned v);\n",
    "fmt.c": '#include "fmt.h"\nsize_t fmt_uint(char *buf, unsigned v) {\n'
    "    char tmp[16]; size_t n = 0, i = 0;\n"
    "    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);\n"
    "    while (n) buf[i++] = tmp[--n];\n    buf[i] = '\\0';\n    return i;\n}\n",
}
PICOTEST = {
    "picotest.h": "void pt_check(int ok, const char *what);\nint pt_done(void);\n",
    "picotest.c": '#include <stdio.h>\n#include "picotest.h"\n#include "fmt/fmt.h"\n'
    "static unsigned run, failed;\n"
    "void pt_check(int ok, const char *what) {\n    char n[16];\n    fmt_uint(n, ++run);\n"
    '    printf("%sok %s - %s\\n", ok ? "" : "not ", n, what);\n    failed += !ok;\n}\n'
    'int pt_done(void) {\n    char n[16];\n    fmt_uint(n, run);\n    printf("1..%s\\n", n);\n'
    "    return failed != 0;\n}\n",
}
CALC = {
    "calc.h": "int calc_add(int, int);\nint calc_mul(int, int);\n",
    "calc.c": '#include "calc.h"\nint calc_add(int a, int b) { return a + b; }\n'
    "int calc_mul(int a, int b) { return a * b; }\n",
    "tests/t_calc.c": '#include "../calc.h"\n#include "picotest.h"\nint main(void) {\n'
    '    pt_check(calc_add(2, 3) == 5, "add");\n    pt_check(calc_mul(4, 5) == 20, "mul");\n'
    "    return pt_done();\n}\n",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class Calc:
    base: Path

    def work(self, name: str) -> Path:
        return self.base / "work" / name

    def bare(self, name: str) -> Path:
        return self.base / "git" / f"{name}.git"

    @property
    def url(self) -> str:
        return f"file://{self.bare('calc')}"

    def commit(
        self,
        name: str,
        message: str,
        files: dict[str, str] | None = None,
        links: dict[str, str] | None = None,
        push: bool = True,
    ) -> str:
        """Write ``files`` and gitlinks ``links`` (path -> commit) into repository ``name``,
        commit, and push to its bare repository unless ``push`` is false."""
        work = self.work(name)
        if not work.exists():
            work.mkdir(parents=True)
            git(work, "init", "-q", "-b", "main")
            self.bare(name).parent.mkdir(parents=True, exist_ok=True)
            git(self.base, "init", "-q", "--bare", "-b", "main", str(self.bare(name)))
        for rel, text in (files or {}).items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        if files:  # by name: `add -A` would drop the gitlinks, which have no directory here
            git(work, "add", "--", *files)
        for path, sha in (links or {}).items():  # a gitlink, as `git submodule add` records it
            git(work, "update-index", "--add", "--cacheinfo", f"160000,{sha},{path}")
        git(work, "commit", "-q", "--allow-empty", "-m", message)
        if push:
            git(work, "push", "-q", str(self.bare(name)), "main")
        return git(work, "rev-parse", "HEAD")


def calc(base: Path) -> Calc:
    """The docs' example: tinyfmt, picotest (tinyfmt at fmt/), calc (picotest at picotest/)."""
    c = Calc(base)
    fmt = c.commit("tinyfmt", "tinyfmt", TINYFMT)
    pico = c.commit(
        "picotest", "picotest", {**PICOTEST, ".gitmodules": doc_block("# picotest/.gitmodules")}, {"fmt": fmt}
    )
    c.commit(
        "calc",
        "calc",
        {
            **CALC,
            ".gitmodules": doc_block("# calc/.gitmodules"),
            "Makefile": doc_block("# calc/Makefile"),
            "jobs/catalog.toml": doc_block("# calc/jobs/catalog.toml"),
        },
        {"picotest": pico},
    )
    return c
