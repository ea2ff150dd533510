"""Capability probing: which targets can this host serve? Decided by trying, not by
configuration: the toolchain exists, a small program compiles, and the runner executes it."""

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
    need_cc = role in ("build", "test", "perf")
    if need_cc and shutil.which(target.cc) is None:
        if role == "build":
            return _missing(target.cc)
        need_cc = False
    if role in ("test", "perf") and target.runner and shutil.which(target.runner[0]) is None:
        return _missing(target.runner[0])
    if not need_cc:
        return None
    with tempfile.TemporaryDirectory(prefix="gearfarm-probe-") as tmp:
        src = Path(tmp) / "hello.c"
        src.write_text(HELLO)
        exe = Path(tmp) / f"hello{target.exe}"
        argv = [target.cc, "-std=c11", "-o", str(exe), str(src), "-lz"] + (["-static"] if target.static else [])
        cc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if cc.returncode != 0:
            return f"{target.cc} cannot build a program with zlib: {cc.stderr.strip()[-300:]}"
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


def servable(cat: Catalog, role: str, wanted: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(targets this host serves for ``role``, {target: reason} for those it cannot)."""
    ok, missing = [], {}
    for name in wanted if wanted is not None else sorted(cat.targets):
        reason = probe(cat.target(name), role)
        if reason is None:
            ok.append(name)
        else:
            missing[name] = reason
    return ok, missing
