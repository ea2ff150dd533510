"""Imports run one way (submit → build → store → test → collect → report): the core package
never imports the worker roles, report and mail know nothing of each other, history only
classifies, the artifact store imports nothing above it; and installing the package puts
only `gearfarm` into site-packages (the `workers/` and `s3/` folders install as
gearfarm.workers and gearfarm.s3). The tests mirror the same order: tests/<package>/ holds the
tests of one package, tests/farm/ (this file's folder: it checks the whole tree, not one
package) those of the whole farm end to end."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


# The farm's packages from the bottom up (submit -> build -> store -> test -> collect -> report
# runs through them upwards). A module may import its own package and any package below it,
# never one above: gearman/ and s3/ import nothing of the farm's, formats/ only those two, and
# so on up to cli/, the only one that may import everything (the worker roles included).
LAYERS = ("gearman", "s3", "formats", "config", "hosts", "step", "db", "run", "perf", "workers", "bisection",
          "report", "night", "web", "cli")
def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gearfarm" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


def upward_imports(root: Path = ROOT) -> list[str]:
    found = []
    for layer, name in enumerate(LAYERS):
        folder = root / name if name in ("workers", "s3") else root / "gearfarm" / name
        files = [folder.with_suffix(".py")] if name == "config" else sorted(folder.rglob("*.py"))
        for path in files:
            for m in sorted(imports(path)):
                above = package_of(m)
                if above is not None and LAYERS.index(above) > layer:
                    found.append(f"{path.relative_to(root)} ({name}) imports {m} ({above}, above it)")
    return found


def test_each_package_imports_only_its_own_and_the_packages_below_it() -> None:
    assert upward_imports() == []


def test_the_layer_check_finds_a_planted_upward_import(tmp_path: Path) -> None:
    for part in ("gearfarm", "workers", "s3"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    assert upward_imports(tmp_path) == []
    seal = tmp_path / "gearfarm" / "formats" / "seal.py"
    seal.write_text(seal.read_text() + "\nfrom gearfarm.run.nightly import plan  # planted\n")
    store = tmp_path / "s3" / "store.py"
    store.write_text(store.read_text() + "\nfrom gearfarm import config  # planted\n")
    assert upward_imports(tmp_path) == [
        "s3/store.py (s3) imports gearfarm.config (config, above it)",
        "gearfarm/formats/seal.py (formats) imports gearfarm.run.nightly (run, above it)",
        "gearfarm/formats/seal.py (formats) imports gearfarm.run.nightly.plan (run, above it)"]


def test_every_module_is_in_a_package_of_the_order() -> None:
    loose = sorted(p.name for p in (ROOT / "gearfarm").glob("*.py") if p.stem not in ("__init__", "config"))
    assert loose == []
    packages = sorted(p.name for p in (ROOT / "gearfarm").iterdir() if (p / "__init__.py").exists())
    assert set(packages) == set(LAYERS) - {"config", "workers", "s3"}


# Beside the packages' folders, tests/ holds the tests of the whole farm end to end (farm/) and
# the data they read (fixtures/); its shared helpers (conftest.py, farmkit.py, ...) sit at its top.
TEST_FOLDERS = (*LAYERS, "farm")


def misplaced_tests(root: Path = ROOT) -> list[str]:
    """What breaks the tests' mirror of the packages: a test module anywhere but directly in
    tests/<package>/ for a package of LAYERS or in tests/farm/, a folder of tests/ named for
    no package, and a folder that is no Python package (pytest would import its modules by
    basename, and two of one basename in two folders would clash)."""
    tests = root / "tests"
    found = [f"{p.relative_to(root)}: not in tests/<package>/ or tests/farm/"
             for p in sorted(tests.rglob("test_*.py"))
             if len(p.relative_to(tests).parts) != 2 or p.parent.name not in TEST_FOLDERS]
    folders = [tests] + sorted(d for d in tests.iterdir() if d.is_dir() and d.name not in ("fixtures", "__pycache__"))
    found += [f"{d.relative_to(root)}/: named for no package" for d in folders[1:] if d.name not in TEST_FOLDERS]
    found += [f"{d.relative_to(root)}/: no __init__.py" for d in folders if not (d / "__init__.py").exists()]
    return found


def test_every_test_module_sits_in_the_folder_of_its_package_or_in_farm() -> None:
    assert misplaced_tests() == []


def test_the_test_layout_check_finds_planted_misplaced_tests(tmp_path: Path) -> None:
    for path in ("tests/__init__.py", "tests/conftest.py", "tests/farmkit.py", "tests/fixtures/data.json",
                 "tests/run/__init__.py", "tests/run/test_ledger.py", "tests/farm/__init__.py",
                 "tests/farm/test_nightly.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert misplaced_tests(tmp_path) == []
    for path in ("tests/test_loose.py", "tests/run/deeper/test_nested.py", "tests/misc/__init__.py",
                 "tests/misc/test_odd.py", "tests/web/test_dashboard.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert misplaced_tests(tmp_path) == [
        "tests/misc/test_odd.py: not in tests/<package>/ or tests/farm/",
        "tests/run/deeper/test_nested.py: not in tests/<package>/ or tests/farm/",
        "tests/test_loose.py: not in tests/<package>/ or tests/farm/",
        "tests/misc/: named for no package",
        "tests/web/: no __init__.py"]


def test_report_and_mail_do_not_import_each_other() -> None:
    g = ROOT / "gearfarm" / "report"
    assert not {m for m in imports(g / "document.py") if "mail" in m}
    assert not {m for m in imports(g / "mail.py") if "report" in m}


def test_no_two_modules_share_a_basename() -> None:
    seen: dict[str, list[str]] = {}
    for folder in (ROOT / "gearfarm", ROOT / "workers", ROOT / "s3"):
        for path in folder.rglob("*.py"):
            if path.name in ("__init__.py", "__main__.py") or "migrations" in path.parts:
                continue
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def _sources() -> list[Path]:
    return sorted(p for folder in (ROOT / "gearfarm", ROOT / "workers", ROOT / "s3") for p in folder.rglob("*.py")
                  if "migrations" not in p.parts)


def _type_names(tree: ast.Module) -> list[str]:
    """Classes and type aliases (``Name = Literal[...]``) defined at a module's top level."""
    out = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, ast.Subscript) and isinstance(n.value.value, ast.Name) \
                and n.value.value.id in ("Literal", "Callable", "Union"):
            out.append(n.targets[0].id)
    return out


def test_one_definition_of_each_class_name() -> None:
    # Two classes of one name (the ledger's Outcome beside history's and bisection's) make a
    # reader open both to know which one a signature means.
    seen: dict[str, list[str]] = {}
    for path in _sources():
        for name in _type_names(ast.parse(path.read_text())):
            seen.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


# Route tables: one entry per page, read as a table rather than as a sequence.
LONG_ALLOWED = {("gearfarm/web/app.py", "create_app")}
LONGEST = 100


def test_no_function_is_longer_than_100_lines() -> None:
    lengths = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lengths.append((node.end_lineno - node.lineno + 1, str(path.relative_to(ROOT)), node.name))
    lengths.sort(reverse=True)
    print("longest functions:", ", ".join(f"{f}:{name} {n}" for n, f, name in lengths[:5]))
    over = [(n, f, name) for n, f, name in lengths if n > LONGEST and (f, name) not in LONG_ALLOWED]
    assert not over, f"functions over {LONGEST} lines: {over}"


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
