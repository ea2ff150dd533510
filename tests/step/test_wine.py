"""A job's own wine prefix (gearfarm/step/wine.py), from a template tree made here: what the job may
write is its own, what every job shares it cannot write, and nothing points at the HOME the
template was made with. The whole path, wineboot included, runs in tests/farm/test_hostile.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gearfarm.step import wine

JOB_UID = 2_000_000_000


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to the job uid needs root, as a worker does")
def test_a_jobs_prefix_shares_only_what_it_cannot_write(tmp_path: Path) -> None:
    template = tmp_path / "template"
    (template / "drive_c/windows/system32").mkdir(parents=True)
    (template / "drive_c/users/nobody").mkdir(parents=True)
    (template / "dosdevices").mkdir()
    (template / "drive_c/windows/system32/kernel32.dll").write_bytes(b"MZ dll")
    (template / "system.reg").write_text("WINE REGISTRY Version 2\n")
    (template / "wineserver").write_text("server dir\n")
    (template / ".complete").write_text("")
    os.symlink("/tmp/template-home", template / "drive_c/users/nobody/Documents")
    os.symlink("../drive_c", template / "dosdevices/c:")
    os.symlink("/", template / "dosdevices/z:")

    prefix = wine.copy(template, tmp_path / "job" / "wine", JOB_UID)

    dll = prefix / "drive_c/windows/system32/kernel32.dll"
    assert dll.stat().st_ino == (template / "drive_c/windows/system32/kernel32.dll").stat().st_ino
    assert dll.stat().st_uid == 0  # shared, and not the job's to write
    reg = prefix / "system.reg"
    assert reg.read_text() == "WINE REGISTRY Version 2\n" and reg.stat().st_uid == JOB_UID
    assert reg.stat().st_ino != (template / "system.reg").stat().st_ino
    docs = prefix / "drive_c/users/nobody/Documents"
    assert docs.is_dir() and not docs.is_symlink() and docs.stat().st_uid == JOB_UID
    assert os.readlink(prefix / "dosdevices/z:") == "/" and os.readlink(prefix / "dosdevices/c:") == "../drive_c"
    assert not (prefix / "wineserver").exists() and not (prefix / ".complete").exists()
    assert all(p.stat().st_uid == JOB_UID for p in [prefix, *prefix.rglob("*")] if p.is_dir() and not p.is_symlink())


def test_a_job_running_as_the_worker_gets_copies_it_cannot_share(tmp_path: Path) -> None:
    template = tmp_path / "template"
    (template / "drive_c").mkdir(parents=True)
    (template / "drive_c/kernel32.dll").write_bytes(b"MZ dll")
    prefix = wine.copy(template, tmp_path / "wine", None)
    assert (prefix / "drive_c/kernel32.dll").stat().st_ino != (template / "drive_c/kernel32.dll").stat().st_ino
