"""`./nightly.bash --projects FILE`: several teams' projects on the embedded farm, with no lab
config. Three projects (Make + TAP, CMake + CTest, a library whose catalog sits beside the file)
named by paths relative to the file run green on a fresh state; a second night reuses every
build; a file that is not a projects file, or one given with a lab config, is a clear error."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests import projects
from tests.farmkit import ROOT, gearfarm

PROJECTS_TOML = """# Three teams' projects on this host's embedded farm.
[[projects]]
name = "tapkv"
repo = "tapkv"
catalog = ".gearfarm/catalog.toml"

[[projects]]
name = "cmring"
repo = "cmring"

[[projects]]
name = "plainc"
repo = "plainc"
catalog_file = "catalogs/plainc.toml"

[farm]
slots = 2
ccache = "ccache"
"""


def nightly_bash(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GEARFARM_CONFIG", "GEARFARM_STATE")}
    return subprocess.run([str(ROOT / "nightly.bash"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)


def builds(state: Path) -> dict[str, list[bool]]:
    """Per project, whether each build job of its newest night reused a stored build."""
    out: dict[str, list[bool]] = {}
    with sqlite3.connect(state / "results.db") as db:
        for project, rec in db.execute(
                "SELECT r.project, j.record FROM jobs j JOIN runs r USING (run_id) WHERE j.job_id LIKE '%:build' "
                "AND r.parent_run_id IS NULL AND r.created_at = (SELECT MAX(created_at) FROM runs x "
                "WHERE x.project = r.project AND x.parent_run_id IS NULL)"):
            out.setdefault(project, []).append(bool(json.loads(rec)["reused_artifact"]))
    return out


def test_three_projects_from_a_file_run_green_and_a_second_night_reuses_every_build(tmp_path: Path) -> None:
    projects.tapkv(tmp_path / "tapkv")
    projects.cmring(tmp_path / "cmring")
    projects.plainc(tmp_path / "plainc")
    (tmp_path / "catalogs").mkdir()
    (tmp_path / "catalogs" / "plainc.toml").write_text(projects.CATALOG_PLAINC)
    (tmp_path / "projects.toml").write_text(PROJECTS_TOML)
    state = tmp_path / "state"
    # Run from elsewhere: the file's paths are relative to the file, not to the current directory.
    args = ("--projects", str(tmp_path / "projects.toml"), "--state-dir", str(state), "--benchmarks", "none")
    first = nightly_bash(*args, cwd=ROOT)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with sqlite3.connect(state / "results.db") as db:
        runs = db.execute("SELECT project FROM runs WHERE parent_run_id IS NULL").fetchall()
    assert sorted(p for (p,) in runs) == ["cmring", "plainc", "tapkv"]  # and no run of the engine
    assert builds(state) == {p: [False, False] for p in ("cmring", "plainc", "tapkv")}
    # Progress names each project; no database or log is left beside the projects file, only
    # the compiler cache it asked for.
    assert "cmring: linux-i686:build" in first.stderr and "tapkv: linux-x86_64:test-tap" in first.stderr
    assert "alembic" not in first.stdout + first.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalogs", "ccache", "cmring", "plainc",
                                                           "projects.toml", "state", "tapkv"]
    # The file's ccache, one part per project whose builds ran.
    assert sorted(p.name for p in (tmp_path / "ccache").iterdir()) == ["cmring", "plainc", "tapkv"]
    # The farm's config carries the file's [farm] settings (its ccache, as an absolute path).
    farm_toml = (state / "farm.toml").read_text()
    assert f'ccache = "{tmp_path / "ccache"}"' in farm_toml and "slots = 2" in farm_toml

    second = nightly_bash(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert builds(state) == {p: [True, True] for p in ("cmring", "plainc", "tapkv")}


@pytest.mark.parametrize(("text", "said"), [
    ('[gearman]\nservers = ["127.0.0.1:4730"]\n[[projects]]\nname = "a"\nrepo = "."\n',
     "has [gearman]: a projects file holds only [[projects]]"),
    ("[farm]\nslots = 1\n", "has no [[projects]]"),
    ('[[projects]]\nname = "a"\nrepo = "."\n[farm]\nsigning_key = "k"\n', "[farm.signing_key]"),
    ('[[projects]]\nname = "Bad Name"\nrepo = "."\n', "[projects.0.name]"),
])
def test_a_file_that_is_not_a_projects_file_is_named_with_the_fix(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "p.toml").write_text(text)
    p = gearfarm("nightly", "--projects", str(tmp_path / "p.toml"), "--state-dir", str(tmp_path / "state"))
    assert p.returncode == 2 and said in p.stderr, p.stderr
    assert not (tmp_path / "state").exists()  # nothing started


def test_projects_with_a_lab_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lab.toml").write_text("[farm]\nstate_dir = \"s\"\n")
    (tmp_path / "p.toml").write_text('[[projects]]\nname = "a"\nrepo = "."\n')
    p = gearfarm("nightly", "--projects", str(tmp_path / "p.toml"), "--config", str(tmp_path / "lab.toml"))
    assert p.returncode == 2 and "--projects runs its projects on the embedded farm, but --config" in p.stderr
