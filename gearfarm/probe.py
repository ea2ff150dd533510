"""Capability probing: which targets can this host serve? Decided by trying, not by
configuration: the target's tools exist, a small program compiles with its C compiler (when it
names one), and the runner executes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from gearfarm.catalog import Catalog, Target

HELLO = '#include <stdio.h>\nint main(void) { printf("gearfarm-probe-ok\\n"); return 0; }\n'
HINTS = {
    "gcc": "apt-get install build-essential",
    "i686-linux-gnu-gcc": "apt-get install gcc-i686-linux-gnu",
    "aarch64-linux-gnu-gcc": "apt-get install gcc-aarch64-linux-gnu",
    "x86_64-w64-mingw32-gcc": "apt-get install mingw-w64",
    "qemu-aarch64": "apt-get install qemu-user",
    "wine": "apt-get install wine wine64",
}


def _missing(tool: str) -> str:
    return f"{tool} not found ({HINTS.get(tool, 'install it')}, or run 'make setup')"


def probe(target: Target, role: str) -> str | None:
    """None when this host can serve ``role`` for ``target``; otherwise what is missing."""
    return _probe(target.model_dump_json(), role)


@cache
def _probe(target_json: str, role: str) -> str | None:
    target = Target.model_validate_json(target_json)
    if role == "build":
        for tool in target.tools:
            if shutil.which(tool) is None:
                return _missing(tool)
    if role in ("test", "perf") and target.runner and shutil.which(target.runner[0]) is None:
        return _missing(target.runner[0])
    cc = target.cc
    # Without a C compiler named by the target (a test host need not have one), the tools and
    # the runner being there is what can be known.
    if cc is None or shutil.which(cc) is None:
        return _missing(cc) if role == "build" and cc is not None else None
    static = target.vars.get("static") in ("1", "yes", "true")
    with tempfile.TemporaryDirectory(prefix="gearfarm-probe-") as tmp:
        src = Path(tmp) / "hello.c"
        src.write_text(HELLO)
        exe = Path(tmp) / f"hello{target.exe}"
        argv = [cc, "-std=c11", "-o", str(exe), str(src)] + (["-static"] if static else [])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return f"{cc} cannot build a program: {proc.stderr.strip()[-300:]}"
        if role == "build":
            return None
        try:
            run = subprocess.run(target.runner + [str(exe)], capture_output=True, text=True, timeout=180,
                                 env={**os.environ, **target.runner_env})
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"cannot run {target.name} programs here: {e}"
        if "gearfarm-probe-ok" not in run.stdout:
            return f"cannot run {target.name} programs here (runner {target.runner or 'native'}): " \
                   f"{(run.stderr or run.stdout).strip()[-300:]}"
    return None


def servable(cats: Catalog | list[Catalog], role: str, wanted: list[str] | None = None
             ) -> tuple[list[str], dict[str, str]]:
    """(targets this host serves for ``role``, {target: reason} for those it cannot). With
    several projects' catalogs a target is served when any project's definition of it can be:
    the worker checks each job's own project before running it."""
    cats = cats if isinstance(cats, list) else [cats]
    names = wanted if wanted is not None else sorted({t for c in cats for t in c.targets})
    ok, missing = [], {}
    for name in names:
        defs = [c.targets[name] for c in cats if name in c.targets]
        if not defs:
            missing[name] = f"no project's catalog defines target {name!r}"
            continue
        reasons = [r for r in (probe(t, role) for t in defs) if r is not None]
        if len(reasons) < len(defs):
            ok.append(name)
        else:
            missing[name] = reasons[0]
    return ok, missing
