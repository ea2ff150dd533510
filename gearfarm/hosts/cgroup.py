"""Each job command's cgroup: its processes, memory (and swap) and CPU weight bounded by the
host's kernel, the command and every descendant in it from their first instruction (the
command's supervisor, gearfarm/step/reaper.c, writes the child into the group's cgroup.procs
before it stages or execs anything), emptied and removed when the command ends, and what the
kernel counted (a limit reached, the peaks) read before.

Both layouts a worker host has: cgroup v1, each controller its own hierarchy (these machines:
/sys/fs/cgroup/pids, /memory, /cpu), and the v2 unified hierarchy (a plain Debian 12 host under
systemd). Groups are made under this process's own cgroup in each hierarchy, which is what
systemd's delegation (the worker unit's Delegate=) hands a worker, and what a container gives:

    <own>/gearfarm/<owner>/<n>          v1, in each of the pids, memory and cpu hierarchies
    <own>/gearfarm/<owner>/<n>          v2, with the worker itself moved to
    <own>/gearfarm-workers/<owner>      (v2 keeps processes out of inner groups)

<owner> is the worker's pid, start time and boot (gearfarm.hosts.process.owner_name): a worker
that starts empties and removes what a dead one left (sweep). Where this process cannot write
its cgroups (not root, no delegation) detect() says why and the worker runs jobs without these
limits, or refuses to start when [farm] job_limits = "required" (docs/security.md).
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from gearfarm.formats.words import size_text
from gearfarm.hosts import process

# The v1 hierarchies bounded; in v2, the same controllers of the unified hierarchy.
CONTROLLERS = ("pids", "memory", "cpu")
TOP = "gearfarm"
WORKERS = "gearfarm-workers"
# How long emptying a group keeps killing what is in it before giving up (a process in
# uninterruptible sleep on a dead NFS server): as the reaper's KILL_PATIENCE.
PATIENCE = 10.0
# cpu.weight's default and cpu.shares' (v1): a weight is turned into shares at this ratio.
WEIGHT_DEFAULT, SHARES_DEFAULT = 100, 1024


class CgroupError(RuntimeError):
    """The host's cgroups cannot bound this worker's jobs: what is wrong and the fix."""


class Limits(NamedTuple):
    """What one job command may use; None: unbounded."""

    processes: int | None = None
    memory: int | None = None  # bytes, swap included
    cpu_weight: int | None = None  # 1..10000, 100 the default share (cgroup v2's cpu.weight)

    def within(self, other: Limits) -> Limits:
        """Each of these, lowered to ``other``'s where that is lower."""
        def low(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else min(a, b)
        return Limits(*(low(a, b) for a, b in zip(self, other, strict=True)))


class Usage(NamedTuple):
    """What the kernel counted of a group: the limit it reached ("" for none) and the peaks."""

    reached: str
    processes_peak: int | None
    memory_peak: int | None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _keyed(text: str) -> dict[str, int]:
    """A "key value" per line file (memory.events, pids.events, memory.oom_control)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with suppress(ValueError):
            out[key] = int(value)
    return out


def _number(path: Path) -> int | None:
    text = _read(path).strip()
    return int(text) if text.isdigit() else None


@dataclass
class Group:
    """One command's cgroup: a directory per hierarchy (v1) or one (v2)."""

    version: int
    dirs: dict[str, Path]  # controller (v1) or "" (v2) -> the group's directory
    limits: Limits

    def procs(self) -> list[str]:
        """The files the command's supervisor writes the command into, before it runs."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def _dir(self, controller: str) -> Path | None:
        return self.dirs.get("" if self.version == 2 else controller)

    def usage(self) -> Usage:
        """The limit the group reached, if one did, and its peaks."""
        reached = []
        mem, pids = self._dir("memory"), self._dir("pids")
        if mem is not None and self.limits.memory is not None:
            events = _keyed(_read(mem / ("memory.events" if self.version == 2 else "memory.oom_control")))
            if events.get("oom_kill", 0) or events.get("oom_group_kill", 0):
                reached.append(f"memory limit {size_text(self.limits.memory)} reached")
        if pids is not None and self.limits.processes is not None:
            if _keyed(_read(pids / "pids.events")).get("max", 0):
                reached.append(f"process limit {self.limits.processes} reached")
        return Usage("; ".join(reached), _number(pids / "pids.peak") if pids is not None else None,
                     None if mem is None else _number(mem / ("memory.peak" if self.version == 2
                                                              else "memory.max_usage_in_bytes")))

    def members(self) -> list[int]:
        pids: set[int] = set()
        for d in self.dirs.values():
            pids.update(int(p) for p in _read(d / "cgroup.procs").split())
        return sorted(pids)

    def close(self) -> None:
        """Kill whatever is left in the group and remove it (CgroupError if it cannot be), and
        its worker's directory and (v1) the top when nothing else is in them: a process that
        never releases its tree (a test's) leaves nothing between its commands."""
        empty(list(self.dirs.values()))
        for d in self.dirs.values():
            for up in (d.parent, d.parent.parent) if self.version == 1 else (d.parent,):
                with suppress(OSError):
                    up.rmdir()


def empty(dirs: list[Path]) -> None:
    """Kill every process in the groups ``dirs`` (and their children) until none is left, then
    remove them, deepest first; CgroupError naming what is left after PATIENCE."""
    deadline = time.monotonic() + PATIENCE
    for top in dirs:
        if not top.is_dir():
            continue
        inner = sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True)
        for d in inner:
            if (d / "cgroup.kill").exists():
                with suppress(OSError):
                    _write(d / "cgroup.kill", "1")
            while True:
                left = [int(p) for p in _read(d / "cgroup.procs").split()]
                for pid in left:
                    with suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(f"cannot remove the job's cgroup {d} ({e.strerror}); "
                                          f"{len(left)} processes left in it: {left[:10]}") from None
                time.sleep(0.01)


def _mounts() -> tuple[dict[str, tuple[Path, str]], tuple[Path, str] | None]:
    """The cgroup v1 hierarchies by controller and the cgroup2 mount: (mount point, root)."""
    v1: dict[str, tuple[Path, str]] = {}
    v2 = None
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if rest[0] == "cgroup2" and v2 is None:
            v2 = (point, fields[3])
        elif rest[0] == "cgroup":
            for opt in rest[2].split(","):
                if opt in CONTROLLERS and opt not in v1:
                    v1[opt] = (point, fields[3])
    return v1, v2


def _own() -> dict[str, str]:
    """This process's cgroup path in each hierarchy: controller (v1) or "" (v2) -> path."""
    out = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


def _place(mount: tuple[Path, str], path: str) -> Path:
    point, root = mount
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return point / ("" if rel == "." else rel)


@dataclass
class Tree:
    """Where this worker makes its jobs' groups: ``roots`` are its <own>/gearfarm directories
    (by controller for v1; "" for v2)."""

    version: int
    roots: dict[str, Path]
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def _mine(self) -> dict[str, Path]:
        return {k: root / process.owner_name() for k, root in self.roots.items()}

    def group(self, limits: Limits) -> Group:
        """A new group of this worker's with ``limits`` set; CgroupError if it cannot be made."""
        name = f"{next(self._seq)}"
        dirs: dict[str, Path] = {}
        try:
            for key, owner in self._mine().items():
                dirs[key] = _make(owner / name, self.version)
            g = Group(self.version, dirs, limits)
            self._limit(g)
        except OSError as e:
            empty(list(dirs.values()))
            raise CgroupError(f"cannot make a job's cgroup: {e}") from e
        return g

    def _limit(self, g: Group) -> None:
        lim = g.limits
        if self.version == 1:
            if lim.processes is not None and "pids" in g.dirs:
                _write(g.dirs["pids"] / "pids.max", str(lim.processes))
            if lim.memory is not None and "memory" in g.dirs:
                _write(g.dirs["memory"] / "memory.limit_in_bytes", str(lim.memory))
                if (g.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                    _write(g.dirs["memory"] / "memory.memsw.limit_in_bytes", str(lim.memory))
            if lim.cpu_weight is not None and "cpu" in g.dirs:
                _write(g.dirs["cpu"] / "cpu.shares", str(max(2, lim.cpu_weight * SHARES_DEFAULT // WEIGHT_DEFAULT)))
            return
        d = g.dirs[""]
        if lim.processes is not None and (d / "pids.max").exists():
            _write(d / "pids.max", str(lim.processes))
        if lim.memory is not None and (d / "memory.max").exists():
            _write(d / "memory.max", str(lim.memory))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        if lim.cpu_weight is not None and (d / "cpu.weight").exists():
            _write(d / "cpu.weight", str(lim.cpu_weight))

    def controllers(self) -> list[str]:
        """The controllers that bound this tree's groups."""
        if self.version == 1:
            return sorted(self.roots)
        return sorted(set(_read(self.roots[""] / "cgroup.subtree_control").split()) & set(CONTROLLERS))

    def sweep(self) -> list[Path]:
        """Empty and remove the groups of workers that are gone; what was removed."""
        removed = []
        for root in self.roots.values():
            for d in sorted(root.iterdir()) if root.is_dir() else []:
                if d.is_dir() and process.owner_gone(d.name):
                    with suppress(CgroupError):
                        empty([d])
                        removed.append(d)
        if self.version == 2:
            workers = self.roots[""].parent / WORKERS
            for d in sorted(workers.iterdir()) if workers.is_dir() else []:
                if d.is_dir() and process.owner_gone(d.name):
                    with suppress(OSError):
                        d.rmdir()
        return removed

    def release(self) -> None:
        """A stopping worker's own groups go (each command's went when it ended), and the tops
        when no other worker has groups there."""
        with suppress(CgroupError):
            empty(list(self._mine().values()))
        for root in self.roots.values():
            with suppress(OSError):
                root.rmdir()


def _make(d: Path, version: int) -> Path:
    """Make group ``d`` (<top>/<owner>/<n>) with what is missing above it; again if another
    worker's close removed an empty parent meanwhile (Group.close)."""
    owner, top = d.parent, d.parent.parent
    for attempt in range(10):
        try:
            if version == 1:
                top.mkdir(exist_ok=True)
            try:
                owner.mkdir()
                if version == 2:
                    _enable(owner)
            except FileExistsError:
                pass
            d.mkdir()
            return d
        except FileNotFoundError:
            if attempt == 9:
                raise
    return d


def _enable(d: Path) -> None:
    """v2: let ``d``'s children have the controllers ``d`` has (of CONTROLLERS)."""
    have = set(_read(d / "cgroup.controllers").split()) & set(CONTROLLERS)
    if have:
        _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(have)))


def detect(version: int | None = None) -> Tree:
    """This worker's tree of job groups, made (its top directories) and checked writable;
    CgroupError saying why there is none. ``version`` forces a layout (tests)."""
    v1, v2 = _mounts()
    own = _own()
    if version != 2 and any(c in v1 and c in own for c in CONTROLLERS) and version in (None, 1):
        roots = {c: _place(v1[c], own[c]) / TOP for c in CONTROLLERS if c in v1 and c in own}
        try:
            # Made when the first group is (Tree.group), gone with the last worker (release).
            for root in roots.values():
                probe = root.parent / f".gearfarm-probe-{os.getpid()}"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
        except OSError as e:
            raise CgroupError(f"cannot make job cgroups under {root.parent} ({e.strerror}): run the worker as root, "
                              "or in a cgroup delegated to it") from None
        return Tree(1, roots)
    if v2 is None or "" not in own:
        raise CgroupError("this host has neither the pids, memory and cpu cgroup v1 hierarchies nor the unified "
                          "cgroup v2 one mounted")
    here = _place(v2, own[""])
    base = here.parent.parent if here.parent.name == WORKERS else here
    root = base / TOP
    try:
        root.mkdir(exist_ok=True)
        if here == base:
            # v2 keeps processes out of a group whose children have controllers: this worker
            # moves to a leaf of its own first (other processes of its group block it, said below).
            leaf = base / WORKERS / process.owner_name()
            leaf.mkdir(parents=True, exist_ok=True)
            _write(leaf / "cgroup.procs", "0")
        _enable(base)
        _enable(root)
    except OSError as e:
        others = _read(base / "cgroup.procs").split()
        why = f"; processes {', '.join(others[:5])} are in it: give the worker a cgroup of its own" if others else ""
        raise CgroupError(f"cannot make job cgroups under {base} ({e.strerror}){why}: run the worker as root in a "
                          "unit with Delegate=yes (docker/systemd/gearfarm-worker@.service)") from None
    return Tree(2, {"": root})
