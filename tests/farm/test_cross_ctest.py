"""CTest projects through the whole farm on three targets: a CMake project whose tests are
registered in each add_test form, cross-built for linux-aarch64 (qemu) and windows-x86_64 (wine),
comes out in the run's junit.xml with every case's right status on every target and the failing
case's assertion as its message; and a library named like the host's zlib is tested as built."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests import crossproject
from tests.farmkit import gearfarm

pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in ("cmake", "qemu-aarch64", "wine")),
                                reason="needs cmake, qemu-aarch64 and wine")


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedFarm, Path]]:
    base = tmp_path_factory.mktemp("cross")
    ring, fz = crossproject.crossring(base / "crossring"), crossproject.fakez(base / "fakez")
    empty = base / "no-repo"
    empty.mkdir()
    farm = EmbeddedFarm(base / "state", empty, projects=[ProjectConfig(name="crossring", repo=str(ring)),
                                                         ProjectConfig(name="fakez", repo=str(fz))])
    farm.start([catalog_mod.load_file(p / "jobs" / "catalog.toml") for p in (ring, fz)],
               list(crossproject.CROSS_TARGETS))
    try:
        yield farm, base
    finally:
        farm.stop()


def cases(run_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(target, test case) -> (status, message) from a run's junit.xml (its build steps left out)."""
    out = {}
    for suite in ET.parse(run_dir / "junit.xml").getroot().iter("testsuite"):
        for tc in suite.iter("testcase"):
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            status = "failed" if bad is not None else "skipped" if tc.find("skipped") is not None else "passed"
            text = "" if bad is None else (bad.get("message") or "") + (bad.text or "")
            target = next(t for t in crossproject.CROSS_TARGETS if t in (suite.get("name") or "") + (tc.get("classname")
                                                                                                    or ""))
            if tc.get("name") != "build":
                out[(target, tc.get("name") or "")] = (status, text)
    return out


def test_every_case_of_every_add_test_form_on_three_targets(farm: tuple[EmbeddedFarm, Path]) -> None:
    f, _ = farm
    p = gearfarm("nightly", "--config", str(f.config_path), "--project", "crossring", "--benchmarks", "none",
                 timeout=900)
    assert p.returncode == 1, p.stdout + p.stderr  # one case fails, on purpose
    run_dir = next(d for d in (f.state / "runs").glob("*-crossring-*") if d.suffix != ".rerun")
    got = cases(run_dir)
    want = {(t, c): s for t in crossproject.CROSS_TARGETS for c, s in crossproject.CROSS_CASES.items()}
    assert {k: v[0] for k, v in got.items()} == want, got
    for t in crossproject.CROSS_TARGETS:
        assert crossproject.ASSERTION in got[(t, "fails")][1], got[(t, "fails")]


def test_a_library_named_like_the_hosts_is_tested_as_built(farm: tuple[EmbeddedFarm, Path]) -> None:
    f, _ = farm
    p = gearfarm("nightly", "--config", str(f.config_path), "--project", "fakez", "--benchmarks", "none",
                 timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = next(d for d in (f.state / "runs").glob("*-fakez-*") if d.suffix != ".rerun")
    assert cases(run_dir) == {("linux-x86_64", "version"): ("passed", "")}
