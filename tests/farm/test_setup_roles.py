"""Setup by role (Makefile, nightly.bash): each host's role installs only what it runs, the
nightly picks its role from its config, and apt is never reached through sudo from a service or
without a terminal. The installs themselves are measured on clean Debian 12 containers by
bench/fresh_machine.py; these tests read what each role would install and run the decision
paths for real with stand-in `make`/`sudo` programs that record their calls."""

from __future__ import annotations

import os
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _packages(role: str, **variables: str) -> set[str]:
    extra = [f"{k}={v}" for k, v in variables.items()]
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), f"packages-{role}", *extra], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


DEV_ONLY = {"podman", "chromium", "postgresql", "debootstrap", "podman-compose", "libgearman-dev"}
COMPILERS = {"build-essential", "gcc-i686-linux-gnu", "gcc-aarch64-linux-gnu", "mingw-w64", "wine", "qemu-user"}


def test_each_role_installs_only_what_its_host_runs() -> None:
    dev = _packages("dev")
    assert DEV_ONLY <= dev and COMPILERS <= dev
    nightly = _packages("nightly")
    assert "git" in nightly and not nightly & (DEV_ONLY | COMPILERS | {"gearman-job-server", "bubblewrap"})
    dashboard = _packages("dashboard")
    assert not dashboard & (DEV_ONLY | COMPILERS | {"git", "bubblewrap"})
    embedded = _packages("embedded")
    assert {"gearman-job-server", "bubblewrap"} | COMPILERS <= embedded and not embedded & DEV_ONLY
    worker = _packages("worker", TARGETS="linux-x86_64")
    assert {"bubblewrap", "build-essential", "zlib1g-dev", "valgrind"} <= worker
    assert not worker & (DEV_ONLY | {"wine", "mingw-w64", "qemu-user", "gearman-job-server"})
    aarch64 = _packages("worker", TARGETS="linux-aarch64")
    assert {"gcc-aarch64-linux-gnu", "qemu-user"} <= aarch64 and not aarch64 & {"wine", "mingw-w64"}


def test_every_catalog_target_has_its_packages_and_a_wrong_name_is_refused() -> None:
    catalog = tomllib.loads((ROOT / "jobs" / "catalog.toml").read_text())
    for target in catalog["targets"]:
        assert _packages("worker", TARGETS=target) - _packages("worker", TARGETS=""), target
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "setup-worker", "TARGETS=linux-mips"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown target in TARGETS: linux-mips" in proc.stderr
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "setup-nightlyy"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "no setup role 'nightlyy'" in proc.stderr and "nightly" in proc.stderr


def _stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir whose `sudo` and `make` record their argv to ``calls`` (sudo answers `-n` with
    'a password is required', as a host without NOPASSWD does)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    calls.chmod(0o666)
    for name in ("sudo", "make"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n'
                                    + ('[ "$1" = -n ] && exit 1\n' if name == "sudo" else "") + "exit 0\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir, calls


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the check as another user (nobody)")
@pytest.mark.parametrize("where", ["unit", "no-terminal"])
def test_a_missing_package_never_reaches_sudo_from_a_unit_or_without_a_terminal(where: str) -> None:
    # Not pytest's tmp_path: its parent is root's alone, and the check runs as nobody.
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        _check_sudo_policy(Path(tmp), where)


def _check_sudo_policy(tmp_path: Path, where: str) -> None:
    bin_dir, calls = _stand_ins(tmp_path)
    (bin_dir / "make").unlink()  # the real make runs the Makefile; only sudo is a stand-in
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    if where == "unit":
        env["INVOCATION_ID"] = "0123456789abcdef"  # what systemd sets in every unit's environment
    proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           "make", "-s", "-C", str(ROOT), "debian-nightly", "PKG_BASE=gearfarm-no-such-package"],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "this host lacks Debian packages: gearfarm-no-such-package" in proc.stderr
    assert "sudo make setup-nightly" in proc.stderr
    sudo_calls = [line for line in calls.read_text().splitlines() if line.startswith("sudo")]
    # From a unit sudo is never run at all; without a terminal only `sudo -n true` asks whether a
    # password would be needed (it is), and nothing is installed.
    assert sudo_calls == ([] if where == "unit" else ["sudo -n true"])


@pytest.mark.parametrize(("args", "env", "role"), [
    ([], {}, "embedded"),
    (["--config", "/etc/gearfarm/farm.toml"], {}, "nightly"),
    (["--config=/etc/gearfarm/farm.toml"], {}, "nightly"),
    ([], {"GEARFARM_CONFIG": "/etc/gearfarm/farm.toml"}, "nightly"),
    (["--projects", "projects.toml"], {}, "embedded"),
])
def test_nightly_bash_sets_up_the_role_its_config_says(tmp_path: Path, args: list[str], env: dict[str, str],
                                                       role: str) -> None:
    bin_dir, calls = _stand_ins(tmp_path)
    (bin_dir / "make").write_text(f'#!/bin/sh\necho "make $*" >> {calls}\nexit 3\n')  # setup "fails": no nightly
    proc = subprocess.run(["bash", str(ROOT / "nightly.bash"), *args],
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "setup failed" in proc.stderr
    assert calls.read_text().splitlines() == [f"make -s -C {ROOT} setup-{role}"]
