"""Imports run one way (submit → build → store → test → collect → report): the core package
never imports the worker roles, report and mail know nothing of each other, history only
classifies, the artifact store imports nothing above it; and installing the package puts
only `gearfarm` into site-packages (the `workers/` and `s3/` folders install as
gearfarm.workers and gearfarm.s3)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_the_core_never_imports_the_worker_roles() -> None:
    for path in sorted((ROOT / "gearfarm").rglob("*.py")):
        found = {m for m in imports(path, top_level_only=path.name == "cli.py")
                 if m.startswith(("gearfarm.workers", "workers"))}
        assert not found, f"{path.relative_to(ROOT)} imports {sorted(found)}"


def test_report_and_mail_do_not_import_each_other_and_history_only_classifies() -> None:
    g = ROOT / "gearfarm"
    assert not {m for m in imports(g / "report.py") if "mail" in m}
    assert not {m for m in imports(g / "mail.py") if "report" in m}
    assert not {m for m in imports(g / "history.py") if m.startswith(("gearfarm.run.nightly", "gearfarm.gearman"))}
    for path in sorted((ROOT / "s3").glob("*.py")):
        above = {m for m in imports(path) if m.startswith(("gearfarm.run.nightly", "gearfarm.run.ledger", "gearfarm.workers",
                                                            "gearfarm.report.document", "gearfarm.cli.main"))}
        assert not above, f"{path.relative_to(ROOT)} imports {sorted(above)}"


def test_nothing_imports_the_generic_top_level_names() -> None:
    for path in sorted(ROOT.glob("*/*.py")) + sorted(ROOT.glob("*/*/*.py")):
        if ".venv" in path.parts:
            continue
        bad = {m for m in imports(path) if m.split(".")[0] in ("workers", "s3")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_wheel_installs_only_the_gearfarm_package(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: building leaves build/ and egg-info beside the sources
    for part in ("gearfarm", "workers", "s3"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("gearfarm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gearfarm"}
    assert "gearfarm/workers/build.py" in names and "gearfarm/s3/store.py" in names
    assert "gearfarm/templates/web/run.html.j2" in names  # the dashboard's pages ship with it
