"""Capability probing: which targets can this host serve? Decided by trying, not by
configuration: the target's tools exist, a small program compiles with its C compiler (when it
names one), and the runner executes it.

Trying costs seconds (wine starts a Windows environment, ~5 s), and every worker process and
every embedded farm start asks again, so probes run in parallel and a success is remembered per
machine, keyed by the target's definition and the toolchain's identity (each tool's path, size
and mtime, and the package database's mtime: an upgrade or a new package asks again). A failure
is never remembered: the next start tries again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gearfarm.formats.catalog import Catalog, Target

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


# Changes whenever Debian packages are installed, removed or upgraded.
PACKAGE_DB = Path("/var/lib/dpkg/status")
_CACHE_LOCK = threading.Lock()


def cache_path() -> Path:
    """Per machine, like the wine prefixes: every state directory's workers share it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gearfarm" / "probes.json"


def probe(target: Target, role: str) -> str | None:
    """None when this host can serve ``role`` for ``target``; otherwise what is missing."""
    return _probe(target.model_dump_json(), role)


def _toolchain(target: Target, role: str) -> list[object]:
    """What the probe's answer depends on besides the target's definition."""
    names = list(target.tools) + ([target.cc] if target.cc else []) + target.runner[:1]
    out: list[object] = [role]
    for name in names:
        path = shutil.which(name)
        st = os.stat(path) if path else None
        out.append([name, path, st and st.st_size, st and st.st_mtime_ns])
    db = PACKAGE_DB.stat().st_mtime_ns if PACKAGE_DB.exists() else None
    return out + [db, HELLO]


def _load_cache() -> dict[str, float]:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no cache yet, or a torn one: probe again, nothing else depends on it


def _remember(key: str) -> None:
    """Merge one success into the cache file, atomically (other workers write it too)."""
    path = cache_path()
    with _CACHE_LOCK:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = _load_cache()
            data[key] = time.time()  # when it was probed: for whoever reads the file
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probes-")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs the next start its probes


@cache
def _probe(target_json: str, role: str) -> str | None:
    target = Target.model_validate_json(target_json)
    key = hashlib.sha256(json.dumps([target_json, _toolchain(target, role)]).encode()).hexdigest()
    if key in _load_cache():
        return None
    why = _try(target, role)
    if why is None:
        _remember(key)
    return why


def _try(target: Target, role: str) -> str | None:
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
    defs = {name: [c.targets[name] for c in cats if name in c.targets] for name in names}
    # In parallel: the probes wait on compilers and emulators, not on this process.
    flat = [t for ts in defs.values() for t in ts]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(flat)))) as pool:
        answers = dict(zip(map(id, flat), pool.map(lambda t: probe(t, role), flat), strict=True))
    for name in names:
        if not defs[name]:
            missing[name] = f"no project's catalog defines target {name!r}"
            continue
        reasons = [r for r in (answers[id(t)] for t in defs[name]) if r is not None]
        if len(reasons) < len(defs[name]):
            ok.append(name)
        else:
            missing[name] = reasons[0]
    return ok, missing


class AssignmentError(ValueError):
    """The worker cannot serve what it was asked to: the message names the target and why."""


@dataclass
class Assignment:
    """What one worker slot serves: role -> targets, and (role, target) -> why not, for the
    targets a role does not serve."""

    served: dict[str, list[str]]
    unserved: dict[tuple[str, str], str]


def assign(cats: list[Catalog], roles: list[str], wanted: list[str] | None, label: str) -> Assignment:
    """The targets each of ``roles`` serves on this host: those ``wanted`` (every one a role
    can serve) or, with none named, every target of the catalogs it can serve. Without catalogs
    (no nightly has run yet) the named targets are served as asked. ``label`` names the slot in
    errors (its --role)."""
    served: dict[str, list[str]] = {}
    unserved: dict[tuple[str, str], str] = {}
    for r in roles:
        if not cats:
            served[r] = list(wanted or [])
            continue
        ok, why = servable(cats, r, wanted)
        if wanted:
            # A target no catalog defines yet may be a project's first: serve it as asked.
            unknown = [t for t, w in why.items() if w.startswith("no project's catalog")]
            ok += unknown
            why = {t: w for t, w in why.items() if t not in unknown}
        served[r] = ok
        unserved.update({(r, t): w for t, w in why.items()})
    if wanted:
        # A named target must be served; with several roles, by at least one of them (a host
        # may build for Windows without wine to test it).
        lost = [(r, t) for (r, t) in unserved if not any(t in served[o] for o in roles)]
        if lost:
            raise AssignmentError("; ".join(f"this host cannot serve {r} for {t}: {unserved[(r, t)]}"
                                            for r, t in lost))
    if not any(served.values()):
        raise AssignmentError(f"this host can serve no target for role {label}: "
                              + "; ".join(f"{t} ({r}): {w}" for (r, t), w in unserved.items()))
    return Assignment(served, unserved)
