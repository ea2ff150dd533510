"""gearfarm as a Python package: `pip install .` into a fresh virtualenv gives a working command
(runtime dependencies declared, templates and migrations inside the wheel, one version), the
dashboard is an extra whose absence is named, and with the extra `gearfarm web` serves `/`.
Pins come from requirements.txt as constraints, as `make setup` installs them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from gearfarm.hosts.net import free_port
from tests.farmkit import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of what the package is made of: setuptools writes build/ and *.egg-info
    # beside the sources it builds, which must not land in the checkout.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("gearfarm", "workers", "s3"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    proc = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                str(source))
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("gearfarm-*.whl")
    return built


def test_the_wheel_declares_its_dependencies_and_carries_its_data(wheel: Path) -> None:
    import gearfarm

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(meta_name).decode()
    assert f"Version: {gearfarm.__version__}" in meta
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {re.split(r"[<>=\[;]", d)[0].lower() for d in declared["dependencies"]}
    required = {re.split(r"[<>=\[; ]", line.split(":", 1)[1].strip())[0].lower()
                for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert required == runtime and {"boto3", "sqlalchemy", "click", "alembic"} <= required
    assert {"dashboard", "lab", "test", "bench", "dev"} <= set(re.findall(r"^Provides-Extra: (\S+)", meta, re.M))
    assert "gearfarm/templates/report.html.j2" in names and "gearfarm/db/migrations/env.py" in names
    assert any(n.startswith("gearfarm/db/migrations/versions/0001_") for n in names)
    assert "gearfarm/workers/base.py" in names and "gearfarm/s3/store.py" in names
    assert not any(n.startswith(("tests/", "bench/", "workers/", "s3/")) for n in names)


def test_a_fresh_venv_gets_a_working_command_and_the_dashboard_as_an_extra(wheel: Path, tmp_path: Path) -> None:
    import gearfarm

    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", str(venv)).returncode == 0
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "-c", str(ROOT / "requirements.txt")]
    proc = _run(*pip, str(wheel), timeout=900)
    assert proc.returncode == 0, proc.stderr
    cmd = str(venv / "bin" / "gearfarm")
    version = _run(cmd, "--version")
    assert version.returncode == 0 and gearfarm.__version__ in version.stdout, version.stdout + version.stderr
    for group in ("worker", "web", "nightly", "collector"):
        helped = _run(cmd, group, "--help", timeout=60)
        assert helped.returncode == 0 and "Usage: gearfarm" in helped.stdout, group + helped.stderr
    state = tmp_path / "state"
    port = free_port()
    bare = _run(cmd, "web", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}", timeout=60)
    assert bare.returncode == 2
    assert "pip install 'gearfarm[dashboard]'" in bare.stdout + bare.stderr
    assert "Traceback" not in bare.stdout + bare.stderr

    proc = _run(*pip, f"{wheel}[dashboard]", timeout=900)
    assert proc.returncode == 0, proc.stderr
    # A farm's config naming only its state: the dashboard makes the results database from the
    # wheel's migrations and needs no farm running.
    from gearfarm import config as config_mod

    config = tmp_path / "farm.toml"
    config_mod.dump(config_mod.Config(farm=config_mod.FarmConfig(state_dir=str(state))), config)
    config.chmod(0o600)
    log = (tmp_path / "web.log").open("w")
    web = subprocess.Popen([cmd, "web", "--config", str(config), "--listen", f"127.0.0.1:{port}"], stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        def page() -> str | None:
            assert web.poll() is None, (tmp_path / "web.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    return r.read().decode() if r.status == 200 else None
            except OSError:
                return None
        body = wait_for("the dashboard to serve /", page, timeout=60)
        assert "gearfarm" in body.lower() and "<html" in body.lower()
    finally:
        web.terminate()
        web.wait(timeout=30)
        log.close()
