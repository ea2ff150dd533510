"""Capability probes: a success is remembered per machine and toolchain, a failure never is,
and a changed toolchain is probed again. Counted from the compiler wrapper's own starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gearfarm.formats.catalog import Target
from gearfarm.hosts import probe


@pytest.fixture()
def cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A C compiler wrapper on PATH that counts its starts, and a private probe cache."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    starts = tmp_path / "starts"
    wrapper = bindir / "counting-cc"
    real = shutil.which("gcc")
    assert real, "gcc is needed (make setup)"
    wrapper.write_text(f'#!/bin/sh\necho x >> {starts}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    probe._probe.cache_clear()
    yield wrapper, starts
    probe._probe.cache_clear()


def _starts(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_success_is_remembered_across_processes(cc: tuple[Path, Path]) -> None:
    wrapper, starts = cc
    target = Target(name="linux-x86_64", vars={"cc": wrapper.name})
    assert probe.probe(target, "test") is None
    assert _starts(starts) == 1
    assert probe.cache_path().is_file()
    # A new process (its in-memory cache empty) reads the machine's cache: no compile.
    probe._probe.cache_clear()
    assert probe.probe(target, "test") is None
    assert _starts(starts) == 1
    # A different definition of the target is probed on its own.
    probe._probe.cache_clear()
    assert probe.probe(Target(name="linux-x86_64", vars={"cc": wrapper.name, "static": "1"}), "test") is None
    assert _starts(starts) == 2


def test_changed_toolchain_is_probed_again(cc: tuple[Path, Path]) -> None:
    wrapper, starts = cc
    target = Target(name="linux-x86_64", vars={"cc": wrapper.name})
    assert probe.probe(target, "build") is None
    wrapper.write_text(wrapper.read_text() + "# upgraded\n")  # another size and mtime
    probe._probe.cache_clear()
    assert probe.probe(target, "build") is None
    assert _starts(starts) == 2


def test_failure_is_not_remembered(cc: tuple[Path, Path]) -> None:
    wrapper, starts = cc
    good = wrapper.read_text()
    wrapper.write_text(f"#!/bin/sh\necho x >> {starts}\necho 'broken toolchain' >&2\nexit 1\n")
    target = Target(name="linux-x86_64", vars={"cc": wrapper.name})
    why = probe.probe(target, "build")
    assert why is not None and "counting-cc cannot build a program" in why and "broken toolchain" in why
    # Fixed (same size is irrelevant: a failure was never stored), the next start sees it work.
    wrapper.write_text(good)
    probe._probe.cache_clear()
    assert probe.probe(target, "build") is None
    assert _starts(starts) == 2


def test_servable_probes_targets_in_parallel_and_names_what_is_missing(cc: tuple[Path, Path]) -> None:
    from gearfarm.formats.catalog import parse

    wrapper, starts = cc
    cat = parse(Path(__file__).resolve().parents[2].joinpath("jobs", "catalog.toml").read_text(), "catalog")
    targets = {"linux-x86_64": Target(name="linux-x86_64", vars={"cc": wrapper.name}),
               "linux-nothing": Target(name="linux-nothing", vars={"cc": "no-such-cc-here"}, tools=["no-such-cc-here"])}
    cat = cat.model_copy(update={"targets": targets})
    ok, missing = probe.servable(cat, "build")
    assert ok == ["linux-x86_64"]
    assert "no-such-cc-here not found" in missing["linux-nothing"]
    assert _starts(starts) == 1


def test_a_worker_is_assigned_what_it_can_serve_and_refused_what_it_cannot(cc: tuple[Path, Path]) -> None:
    from gearfarm.formats.catalog import parse

    wrapper, _starts_path = cc
    cat = parse(Path(__file__).resolve().parents[2].joinpath("jobs", "catalog.toml").read_text(), "catalog")
    cat = cat.model_copy(update={"targets": {
        "linux-x86_64": Target(name="linux-x86_64", vars={"cc": wrapper.name}),
        "linux-nothing": Target(name="linux-nothing", vars={"cc": "no-such-cc-here"}, tools=["no-such-cc-here"])}})
    # Nothing named: every target it can serve, the others said.
    a = probe.assign([cat], ["build", "test"], None, label="build-test.1")
    # (a test job runs the built binaries, not the compiler: this host can test both targets)
    assert a.served == {"build": ["linux-x86_64"], "test": ["linux-nothing", "linux-x86_64"]}
    assert "no-such-cc-here not found" in a.unserved[("build", "linux-nothing")]
    # A named target no catalog defines yet (a project's first night) is served as asked.
    assert probe.assign([cat], ["build"], ["linux-x86_64", "linux-new"], label="build").served == {
        "build": ["linux-x86_64", "linux-new"]}
    # Without catalogs (no nightly yet) the named targets are served as asked.
    assert probe.assign([], ["test"], ["linux-x86_64"], label="test").served == {"test": ["linux-x86_64"]}
    # A named target this host cannot serve, and a host that can serve nothing, are refused by name.
    with pytest.raises(probe.AssignmentError, match="cannot serve build for linux-nothing: no-such-cc-here not found"):
        probe.assign([cat], ["build"], ["linux-nothing"], label="build")
    only = cat.model_copy(update={"targets": {"linux-nothing": cat.targets["linux-nothing"]}})
    with pytest.raises(probe.AssignmentError, match="can serve no target for role build.2: linux-nothing"):
        probe.assign([only], ["build"], None, label="build.2")
