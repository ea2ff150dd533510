"""The build worker's artifact key follows the target's own build: a change to one target's
[targets.NAME.build] gives that target a new toolchain id (a new artifact) and leaves every other
target's key, so its stored artifact is reused."""

from __future__ import annotations

from gearfarm.formats import catalog as catalog_mod
from gearfarm.workers import build
from tests.formats.test_target_builds import SHARED, WINDOWS_BUILD


def _ids(text: str) -> dict[str, str]:
    cat = catalog_mod.parse(text, "cat.toml")
    return {name: build.toolchain(cat, t)[0] for name, t in cat.targets.items()}


def test_a_targets_own_build_changes_only_its_toolchain_id() -> None:
    shared, own = _ids(SHARED), _ids(SHARED + WINDOWS_BUILD)
    changed = _ids(SHARED + WINDOWS_BUILD.replace('outputs = ["foo.dll"', 'outputs = ["zlib1.dll"'))
    assert shared["linux-x86_64"] == own["linux-x86_64"] == changed["linux-x86_64"]
    assert len({shared["windows-x86_64"], own["windows-x86_64"], changed["windows-x86_64"]}) == 3
