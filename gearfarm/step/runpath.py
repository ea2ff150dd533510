"""Making a moved build tree's programs load the tree's own shared libraries.

A build links its tests with a RUNPATH (or the older RPATH) naming where its libraries were
built, an absolute path on the build host (CMake does so unless told CMAKE_BUILD_RPATH_USE_ORIGIN).
Unpacked under another root on a test host, that directory is gone, and the dynamic loader falls
back to the host's libraries: a test of the zlib just built quietly runs against the host's
libz.so.1 and passes. `relink` points each such entry at the directory of the tree it named,
as `$ORIGIN/<relative path>`, which stays right wherever the tree is.

Written here rather than by calling patchelf: the farm needs only one edit (a shorter string
in place; an $ORIGIN path is short next to a job directory's absolute path), on ELF files of any
target architecture, and nothing more installed on the test hosts for it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gearfarm.hosts import jobtree

# Larger files are not read whole into the worker's memory to look for a RUNPATH (a debug
# build's program is tens of MB; a data file the build left can be anything).
MAX_SIZE = 512 * 1024 * 1024
_DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_RPATH, _DT_RUNPATH = 1, 5, 10, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


@dataclass
class _Elf:
    data: bytearray
    strtab: int  # file offset of the dynamic string table
    strsz: int
    needed: list[str]
    paths: list[tuple[int, int]]  # (tag, offset in strtab) of each RPATH/RUNPATH

    def string(self, offset: int) -> str:
        start = self.strtab + offset
        end = self.data.index(b"\0", start, self.strtab + self.strsz)
        return self.data[start:end].decode("utf-8", "surrogateescape")


def _parse(data: bytearray) -> _Elf | None:
    """The dynamic section's strings of an ELF file, or None (not ELF, static, or damaged)."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            phoff, = struct.unpack_from(end + "Q", data, 32)
            phentsize, phnum = struct.unpack_from(end + "HH", data, 54)
        else:
            phoff, = struct.unpack_from(end + "I", data, 28)
            phentsize, phnum = struct.unpack_from(end + "HH", data, 42)
        loads, dynamic = [], None
        for i in range(phnum):
            at = phoff + i * phentsize
            if wide:
                ptype, _, offset, vaddr, _, filesz = struct.unpack_from(end + "IIQQQQ", data, at)
            else:
                ptype, offset, vaddr, _, filesz = struct.unpack_from(end + "IIIII", data, at)
            if ptype == _PT_LOAD:
                loads.append((vaddr, offset, filesz))
            elif ptype == _PT_DYNAMIC:
                dynamic = (offset, filesz)
        if dynamic is None:
            return None
        fmt = end + ("qQ" if wide else "iI")
        entries = []
        for at in range(dynamic[0], dynamic[0] + dynamic[1], struct.calcsize(fmt)):
            tag, val = struct.unpack_from(fmt, data, at)
            if tag == 0:
                break
            entries.append((tag, val))
        tags = dict(entries)
        strtab = next(off + tags[_DT_STRTAB] - va for va, off, size in loads if va <= tags[_DT_STRTAB] < va + size)
        elf = _Elf(data, strtab, tags[_DT_STRSZ], [], [(t, v) for t, v in entries if t in (_DT_RPATH, _DT_RUNPATH)])
        elf.needed = [elf.string(v) for t, v in entries if t == _DT_NEEDED]
        return elf
    except (struct.error, KeyError, StopIteration, ValueError):
        return None


def _target(entry: str, tree: Path, needed: list[str], others: Path | None) -> Path | None:
    """The tree's directory a dangling absolute entry meant: the one with the longest tail of
    its path that holds a library the program needs. An entry in ``others`` (where this host's
    other jobs have their dirs) dangles even while it is there: the job's sandbox does not show
    it, and it goes when its job ends (the build's own dir may be, for a moment after its record:
    workers.base), so a test that loaded from it would run against the host's library or race
    its removal."""
    if not entry.startswith("/") or _within(entry, tree):
        return None
    if os.path.isdir(entry) and not (others is not None and _within(entry, others)):
        return None
    parts = [p for p in entry.split("/") if p]
    for k in range(len(parts), 0, -1):
        here = tree.joinpath(*parts[-k:])
        if here.is_dir() and any((here / name).exists() for name in needed):
            return here
    return None


@dataclass(frozen=True)
class Relinked:
    path: str  # the program or library, relative to the tree
    before: str
    after: str


def relink(tree: Path, others: Path | None = None) -> tuple[list[Relinked], list[str]]:
    """Rewrite, in every ELF file of ``tree``, the RUNPATH/RPATH entries that name a vanished
    directory (or one in ``others``: _target) whose place in the tree holds the libraries the
    file needs. Returns what was rewritten, and a note for each file whose new value would not
    fit in place."""
    tree = Path(os.path.abspath(tree))
    others = Path(os.path.abspath(others)) if others is not None else None
    done: list[Relinked] = []
    notes: list[str] = []
    for top, _, files in jobtree.walk(tree):
        for name in files:
            path = Path(top) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                if jobtree.read_capped(path, 4)[0] != b"\x7fELF":
                    continue
            except OSError:
                continue
            if path.stat().st_size > MAX_SIZE:
                notes.append(f"{path.relative_to(tree)}: larger than {MAX_SIZE >> 20} MiB, its RUNPATH was not read")
                continue
            try:
                changed = _relink_file(path, tree, done, notes, others)
            except (ValueError, IndexError, struct.error):
                # The build's files are the project's: a damaged ELF is its business, not a crash.
                notes.append(f"{path.relative_to(tree)}: its dynamic section cannot be read; left as it is")
                continue
            if changed is not None:
                mode = path.stat().st_mode
                os.chmod(path, mode | 0o200)
                path.write_bytes(changed)
                os.chmod(path, mode)
    return done, notes


def _within(entry: str, top: Path) -> bool:
    return os.path.commonpath([os.path.abspath(entry), str(top)]) == str(top)


def _relink_file(path: Path, tree: Path, done: list[Relinked], notes: list[str],
                 others: Path | None) -> bytearray | None:
    elf = _parse(bytearray(path.read_bytes()))
    if elf is None or not elf.paths:
        return None
    changed = False
    for _, offset in elf.paths:
        before = elf.string(offset)
        entries = before.split(":")
        for i, entry in enumerate(entries):
            where = _target(entry, tree, elf.needed, others)
            if where is not None:
                rel = os.path.relpath(where, path.parent)
                entries[i] = "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"
        after = ":".join(entries)
        if after == before:
            continue
        if len(after.encode()) > len(before.encode()):
            notes.append(f"{path.relative_to(tree)}: its RUNPATH {before} names the build host's directories; "
                         f"{after} does not fit in its place, so it was left as it is")
            continue
        start = elf.strtab + offset
        raw = after.encode("utf-8", "surrogateescape")
        elf.data[start:start + len(before.encode("utf-8", "surrogateescape"))] = raw.ljust(
            len(before.encode("utf-8", "surrogateescape")), b"\0")
        done.append(Relinked(str(path.relative_to(tree)), before, after))
        changed = True
    return elf.data if changed else None
