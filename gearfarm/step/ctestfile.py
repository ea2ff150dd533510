"""A CMake build tree's CTestTestfile.cmake files, made runnable where a test job unpacked them.

CMake writes absolute paths into them (the test executables, WORKING_DIRECTORY), so a tree
built under one root and unpacked under another makes ctest run nothing. And only one of the
three ways to register a test gets the cross-compiling emulator: `add_test(NAME x COMMAND tgt)`
with a target name. `add_test(NAME x COMMAND ./x)` (a path) and the old `add_test(x x)` are
written as given, so on a qemu or wine target the host runs a foreign binary ("Syntax error",
"Unable to find executable"). `prepare` fixes both in the files themselves: ctest stays the
driver, every test keeps its name, properties and arguments.

The files are CMake scripts, but ctest writes only a handful of commands into them (add_test,
set_tests_properties, subdirs), one per line, with arguments quoted as cmOutputConverter
escapes them: this reads just those, not the CMake language.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gearfarm.hosts import jobtree
from gearfarm.step.outcome import OutcomeError

TESTFILE = "CTestTestfile.cmake"
# One argument: a bracket argument, a quoted one, or an unquoted run.
_ARG = re.compile(r'\[(?P<eq>=*)\[(?P<bracket>.*?)\](?P=eq)\]|"(?P<quoted>(?:\\.|[^"\\])*)"|(?P<plain>[^\s()"]+)')
_CALL = re.compile(r"^(?P<cmd>add_test|set_tests_properties)\((?P<args>.*)\)\s*$")
# Executables start so: an ELF program (Linux targets) or a PE one (Windows targets).
_MAGIC = (b"\x7fELF", b"MZ")


@dataclass(frozen=True)
class _Arg:
    text: str  # the value
    start: int  # its span in the line, quotes included
    end: int


@dataclass
class Prepared:
    """What `prepare` did: files rewritten, and per test name how its command starts now."""

    rewritten: int = 0
    # Test name -> why the runner could not be put in front of its command (a script, a
    # program outside the tree, nothing found): said in the case's message if it fails.
    unwrapped: dict[str, str] = field(default_factory=dict)
    wrapped: list[str] = field(default_factory=list)
    # Test name -> the executable it runs (absolute), for tests whose program is in the tree.
    programs: dict[str, str] = field(default_factory=dict)


def _args(text: str) -> list[_Arg]:
    out = []
    for m in _ARG.finditer(text):
        if m.group("bracket") is not None:
            value = m.group("bracket")
        elif m.group("quoted") is not None:
            value = re.sub(r"\\(.)", lambda e: {"n": "\n", "t": "\t", "r": "\r"}.get(e.group(1), e.group(1)),
                           m.group("quoted"))
        else:
            value = m.group("plain")
        out.append(_Arg(value, m.start(), m.end()))
    return out


def quote(value: str) -> str:
    """An argument as CMake writes it in a CTestTestfile: quoted, with \\ " $ escaped."""
    return '"' + re.sub(r'([\\"$])', r"\\\1", value).replace("\n", "\\n") + '"'


def prepare(build_dir: Path, root: Path, runner: list[str]) -> Prepared:
    """Relocate the tree (see `relocate`), then put ``runner`` (the target's, e.g. qemu-aarch64
    or wine; none when native) in front of every test command whose executable is a program of
    the tree, however the test was registered; and say which program each test runs."""
    done = Prepared(rewritten=relocate(build_dir, root))
    tree = Path(os.path.abspath(root))
    for path in _testfiles(Path(os.path.abspath(build_dir))):
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
            lines = fh.read().split("\n")
        workdirs = _working_directories(lines)
        changed = False
        for i, line in enumerate(lines):
            m = _CALL.match(line)
            if m is None or m.group("cmd") != "add_test":
                continue
            args = _args(m.group("args"))
            if len(args) < 2:
                continue
            name, command = args[0].text, args[1]
            if runner and Path(command.text).name == Path(runner[0]).name:
                # CMake put its emulator there (add_test(NAME x COMMAND target)): the program follows.
                if len(args) > 2 and Path(args[2].text).is_relative_to(tree):
                    done.programs[name] = args[2].text
                continue
            where = Path(workdirs.get(name, str(path.parent)))
            program, why = _program(command.text, where, tree, runner)
            if program is None:
                done.unwrapped[name] = why
                continue
            done.programs[name] = str(program)
            if not runner:
                continue
            base = m.start("args")
            lines[i] = (line[: base + command.start] + " ".join(quote(a) for a in [*runner, str(program)])
                        + line[base + command.end:])
            done.wrapped.append(name)
            changed = True
        if changed:
            with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as fh:
                fh.write("\n".join(lines))
            done.rewritten += 1
    return done


def _testfiles(build_dir: Path) -> list[Path]:
    """The tree's CTestTestfile.cmake files that are files: one that is a link (even inside the
    tree) is neither read nor written, so no rewrite lands anywhere but in a file of the tree."""
    return sorted(Path(top, TESTFILE) for top, _, names in jobtree.walk(build_dir)
                  if TESTFILE in names and Path(top, TESTFILE).is_file() and not Path(top, TESTFILE).is_symlink())


def _working_directories(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        m = _CALL.match(line)
        if m is None or m.group("cmd") != "set_tests_properties":
            continue
        args = [a.text for a in _args(m.group("args"))]
        if "PROPERTIES" not in args:
            continue
        k = args.index("PROPERTIES")
        props = dict(zip(args[k + 1::2], args[k + 2::2], strict=False))
        if "WORKING_DIRECTORY" in props:
            for name in args[:k]:
                out[name] = props["WORKING_DIRECTORY"]
    return out


def _program(command: str, where: Path, tree: Path, runner: list[str]) -> tuple[Path | None, str]:
    """The tree's program a test command names, as ctest would find it (relative to the test's
    working directory; a Windows program may be named without its .exe), or None and why not."""
    base = Path(command) if os.path.isabs(command) else where / command
    for candidate in (base, base.with_name(base.name + ".exe")):
        if not candidate.is_file():
            continue
        real = Path(os.path.realpath(candidate))
        if not real.is_relative_to(tree):
            return None, f"its command {command} is a program of the host ({real}), not of the build tree"
        try:
            head, _ = jobtree.read_capped(real, 4)
        except OSError as e:
            return None, f"its command {command} cannot be read ({e.strerror or e})"
        if not head.startswith(_MAGIC):
            return None, (f"its command {command} is not a program but a script ({head[:2]!r}...), so the farm "
                          f"cannot put the target's runner `{' '.join(runner)}` in front of it")
        return Path(os.path.abspath(candidate)), ""
    return None, (f"its command {command} is no file of the build tree (looked for {base}): ctest searches the "
                  f"host's PATH for it")


def unwrapped_hint(why: str, runner: list[str]) -> str:
    """The note a failed case gets when its command could not be given the runner."""
    return (f"[gearfarm: this test could not be run under `{' '.join(runner)}`: {why}. Register it with "
            f"add_test(NAME <test> COMMAND <target>) or $<TARGET_FILE:target>, or make the script start the "
            f"program through $GEARFARM_RUNNER]")


def relocate(build_dir: Path, root: Path) -> int:
    """Point the CTestTestfile.cmake files of a moved CMake build tree at where it is now.

    `root` is the tree the build directory now lives in; the old root is the header's
    "# Build directory:" with the build directory's place under `root` taken off. Returns the
    number of files rewritten (0 when the tree has not moved).
    """
    build_dir = Path(os.path.abspath(build_dir))
    root = Path(os.path.abspath(root))
    top = build_dir / TESTFILE
    if not top.is_file():
        raise OutcomeError(f"no {TESTFILE} in {build_dir}: is `cwd` of the ctest suite the CMake build "
                           f"directory, and are the build outputs including it (e.g. \"build/**\")?")
    try:
        rel = build_dir.relative_to(root)
    except ValueError:
        raise OutcomeError(f"the ctest build directory {build_dir} is not inside the job's tree {root}: "
                           f"make the suite's `cwd` a directory of the tree") from None
    old_root = built_root(top, rel.as_posix())
    new_root = root.as_posix()
    if old_root == new_root:
        return 0
    # A prefix of a path: not the tail of a longer path ("/x/old"), not a longer name ("/oldish").
    pattern = re.compile(r"(?<![\w.~/-])" + re.escape(old_root) + r"(?=[/\"';\s)]|$)", re.MULTILINE)
    rewritten = 0
    for path in _testfiles(build_dir):
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
            before = fh.read()
        after = pattern.sub(lambda _: new_root, before)
        if after != before:
            with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as fh:
                fh.write(after)
            rewritten += 1
    return rewritten


def built_root(top: Path, rel: str) -> str:
    """The root the tree was built under, from the header of its top CTestTestfile.cmake, whose
    build directory was ``rel`` under that root."""
    text = top.read_text(encoding="utf-8", errors="surrogateescape")
    built = re.search(r"^# Build directory: (.+?)\s*$", text, re.MULTILINE)
    if built is None:
        raise OutcomeError(f"{top} has no \"# Build directory:\" header: it was not written by CMake, "
                           f"or the build tree is damaged; rebuild it with cmake")
    # CMake writes "/" separators on every platform.
    old_parts = built.group(1).rstrip("/").split("/")
    rel_parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel_parts and old_parts[-len(rel_parts):] != rel_parts:
        source = re.search(r"^# Source directory: (.+?)\s*$", text, re.MULTILINE)
        raise OutcomeError(f"{top} says it was built in {built.group(1)}"
                           f"{' (source ' + source.group(1) + ')' if source else ''}, which does not end with "
                           f"{'/'.join(rel_parts)}: the build directory must have the same place in the tree on "
                           f"the build host as in the job's tree; keep the build's and the suite's `cwd` consistent")
    old_root = "/".join(old_parts[: len(old_parts) - len(rel_parts)])
    if old_root in ("", "/"):
        raise OutcomeError(f"{top} was built at the filesystem root ({built.group(1)}): cannot tell its "
                           f"paths from others; build under a project directory")
    return old_root
