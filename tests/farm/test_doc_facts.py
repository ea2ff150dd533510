"""Docs that agree with the files (issue #36, part 8), where the check is mechanical: every
markdown table is one block, no file cites a path outside the repository, and the Gearman
client's size in docs/gearman-client.md is the size of gearfarm/gearman/."""

from __future__ import annotations

import re
import subprocess

from tests.farmkit import ROOT

DOCS = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])


def _cells(line: str) -> int:
    """The number of cells of a table row (a `|` in code or escaped is text, not a border)."""
    bare = re.sub(r"`[^`]*`", "", line.strip()).replace("\\|", "")
    return bare.strip("|").count("|") + 1


def _separator(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()))


def split_tables(text: str) -> list[tuple[int, str]]:
    """(line number, row) of each table row that follows a blank line after a row of a table
    with as many cells, and is no header of its own (no |---| line under it): a table that a
    blank line cut in two, which markdown renders as a table and a paragraph of pipes."""
    lines = text.splitlines()
    found = []
    fenced = False
    last_row: str | None = None  # the last table row before the blank lines, if any
    blank = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced, last_row, blank = not fenced, None, False
            continue
        if fenced:
            continue
        if not line.strip():
            blank = blank or last_row is not None
            continue
        row = line.lstrip().startswith("|")
        header = i + 1 < len(lines) and _separator(lines[i + 1])
        if row and blank and last_row is not None and _cells(line) == _cells(last_row) and not header:
            found.append((i + 1, line))
        last_row, blank = (line if row else None), False
    return found


def test_the_table_check_finds_a_table_cut_in_two() -> None:
    """The control: docs/lab.md's images table as it was, a blank line before its last row."""
    cut = ("| image | what |\n|---|---|\n| `gearfarm-base` | the package |\n| `gearfarm-worker` | toolchains |\n\n"
           "| `gearfarm-postgres` | PostgreSQL 15 |\n\nDetails:\n")
    assert split_tables(cut) == [(6, "| `gearfarm-postgres` | PostgreSQL 15 |")]
    # Two tables one after the other, each with its header, are two tables; a row in a code
    # block is no row; a `|` in code is not a border.
    two = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| c | d |\n|---|---|\n| 3 | 4 |\n"
    fenced = "| a | b |\n|---|---|\n| 1 | 2 |\n\n```\n| 3 | 4 |\n```\n"
    code = "| a | b |\n|---|---|\n| `x|y` | 2 |\n\n| text with a | pipe |\n"
    assert split_tables(two) == [] and split_tables(fenced) == []
    assert split_tables(code) == [(5, "| text with a | pipe |")]


def test_every_markdown_table_is_one_block() -> None:
    cut = {str(p.relative_to(ROOT)): rows for p in DOCS if (rows := split_tables(p.read_text()))}
    assert not cut, f"a blank line splits a table (remove it): {cut}"


def test_no_file_cites_a_path_outside_the_repository() -> None:
    """A comment or doc that points at this machine's files (the workplace's shared folder
    beside the checkout, /work/..., root's home) points at nothing in anyone else's clone.
    Tests are left out: they name such paths to check what the farm does with them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    outside = re.compile(r"\.\./shared/|(?<![\w.])/work/|(?<![\w.])/root/")
    found = []
    for name in files.stdout.split("\0"):
        path = ROOT / name
        if not name or name.startswith("tests/") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not found, found


def test_the_gearman_client_size_in_its_doc_is_the_real_one() -> None:
    doc = (ROOT / "docs" / "gearman-client.md").read_text()
    said = re.search(r"about ([\d,]+) lines", doc)
    assert said, "docs/gearman-client.md no longer says how many lines the client is"
    claimed = int(said.group(1).replace(",", ""))
    real = sum(len(p.read_text().splitlines()) for p in (ROOT / "gearfarm" / "gearman").glob("*.py"))
    assert abs(claimed - real) <= real * 0.10, f"the doc says about {claimed} lines; gearfarm/gearman/ has {real}"


def test_every_image_a_doc_shows_is_committed() -> None:
    """An image in the README or a doc (`![...](path)`, or a screenshot named in docs/dashboard.md)
    is a file in the repository: a page that shows a broken image shows nothing."""
    files = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines())
    missing, shown = [], 0
    for doc in DOCS:
        text = doc.read_text()
        named = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
        if doc.name == "dashboard.md":
            named += [f"screenshots/{n}" for n in re.findall(r"`([\w-]+\.png)`", text)]
        for target in named:
            if target.startswith(("http://", "https://")):
                continue
            shown += 1
            path = (doc.parent / target).resolve().relative_to(ROOT.resolve()).as_posix()
            if path not in files:
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert shown >= 10 and not missing, missing
