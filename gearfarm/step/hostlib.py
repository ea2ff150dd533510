"""Catching a test that ran against the host's copy of a library the build made.

When a test program cannot find the library its build made (a RUNPATH to a vanished directory,
a library the loader looks up by name only), glibc's loader takes the host's library of the
same name if there is one, and the test passes or fails for the wrong library. The loader says
what it loaded when asked: with LD_DEBUG=libs and LD_DEBUG_OUTPUT=<file>, every process writes
<file>.<pid> with each library it looked for and the file it took, then the program it runs.
Under qemu-user both the emulator's loader (the host's libraries of qemu itself) and the
target's loader write to that file, each block ending with "transferring control: <program>":
only blocks whose program is in the job's tree count.

This is the loader's own account, read after the run: nothing is injected into the test.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gearfarm.hosts import jobtree

_LINE = re.compile(r"^\s*\d+:\s?(.*)$")
# Enough for a test suite's processes; past these the rest is not read (and a note says so).
MAX_FILES = 5000
MAX_BYTES = 4 * 1024 * 1024
_LIBRARY = re.compile(r"\.so(\.[0-9.]+)?$")


def environment(out_dir: Path) -> dict[str, str]:
    """The variables that make each process of the suite write its loader's account in ``out_dir``."""
    out_dir.mkdir(exist_ok=True)
    return {"LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(out_dir / "ld")}


@dataclass(frozen=True)
class HostCopy:
    program: str  # as the process was started
    loaded: str  # the host's library it mapped
    built: str  # the build's library of the same name, in the tree

    def message(self) -> str:
        return (f"{self.program} loaded {self.loaded}, the host's copy, in place of the build's {self.built}: "
                f"the test did not test what was built. Link the tests with a RUNPATH relative to $ORIGIN (CMake: "
                f"CMAKE_BUILD_RPATH_USE_ORIGIN=ON), or keep the library where the program's RUNPATH says")


def built_libraries(tree: Path) -> dict[str, str]:
    """Shared libraries the build left in the tree, by file name (libz.so.1 -> its path)."""
    out: dict[str, str] = {}
    for top, _, files in jobtree.walk(tree):
        for name in files:
            if _LIBRARY.search(name) and name not in out:
                out[name] = os.path.join(top, name)
    return out


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(program, libraries it loaded) per loader that wrote to one file."""
    out: list[tuple[str, list[str]]] = []
    loaded: list[str] = []
    tried = ""
    for raw in text.splitlines():
        m = _LINE.match(raw)
        line = m.group(1).strip() if m else ""
        if line.startswith("trying file="):
            tried = line[len("trying file="):]
        elif not line or line.startswith("find library="):
            if tried:  # the last file tried for a library is the one the loader took
                loaded.append(tried)
            tried = ""
        elif line.startswith("calling init:"):
            loaded.append(line[len("calling init:"):].strip())
        elif line.startswith("transferring control:"):
            out.append((line[len("transferring control:"):].strip(), loaded))
            loaded = []
    if tried:
        loaded.append(tried)
    if loaded and out:  # dlopen()ed after start: the last program's
        out[-1][1].extend(loaded)
    return out


def _in_tree(program: str, tree: Path, seen: dict[str, bool], paths: list[str]) -> bool:
    """Whether ``program`` is one of the tree's, whose entries (relative) are ``paths``."""
    if program not in seen:
        if os.path.isabs(program):
            seen[program] = Path(os.path.abspath(program)).is_relative_to(tree)
        else:
            # Started by a relative path from a directory we do not know: a file of the tree ending so.
            tail = os.path.normpath(program)
            seen[program] = not tail.startswith("..") and any(p == tail or p.endswith("/" + tail) for p in paths)
    return seen[program]


def _entries(tree: Path) -> list[str]:
    """Every entry of the tree, relative to it (walked without recursion: a suite may leave a
    tree thousands of directories deep)."""
    out = []
    for top, dirs, files in jobtree.walk(tree):
        rel = os.path.relpath(top, tree)
        out += [name if rel == "." else f"{rel}/{name}" for name in dirs + files]
    return out


def findings(out_dir: Path, tree: Path) -> tuple[list[HostCopy], list[str]]:
    """Each program of ``tree`` that mapped a library from outside it whose name is one the
    build made, from the loader's files in ``out_dir``; and notes (files not read)."""
    tree = Path(os.path.abspath(tree))
    built = built_libraries(tree)
    found: dict[tuple[str, str], HostCopy] = {}
    notes: list[str] = []
    if out_dir.is_symlink():
        # The suite replaced its loader directory by a link: nothing is read through it.
        return [], [f"the loader's account directory {out_dir} was replaced by a link; it was not read"]
    files = sorted(out_dir.glob("ld.*")) if out_dir.is_dir() else []
    seen: dict[str, bool] = {}
    paths: list[str] | None = None
    if len(files) > MAX_FILES:
        notes.append(f"{len(files)} processes wrote loader accounts; the first {MAX_FILES} were read")
    for path in files[:MAX_FILES]:
        try:
            data, _ = jobtree.read_capped(path, MAX_BYTES)
        except jobtree.NotAFile as e:
            # A FIFO's open would wait for a writer for good: refused, never opened for reading.
            notes.append(f"the loader's account {e.strerror}; it was not read")
            continue
        except OSError:
            continue
        for program, loaded in _blocks(data.decode("utf-8", "replace")):
            if not built:
                continue
            if paths is None and not os.path.isabs(program):
                paths = _entries(tree)
            if not _in_tree(program, tree, seen, paths or []):
                continue
            for lib in loaded:
                name = os.path.basename(lib)
                if name in built and not Path(os.path.abspath(lib)).is_relative_to(tree):
                    found.setdefault((program, name), HostCopy(program, lib, built[name]))
    return list(found.values()), notes
