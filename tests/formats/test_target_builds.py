"""A target's own build, [targets.NAME.build] (issue #35): how it layers over [build]
(Catalog.build_for), that each mistake in it is refused naming the file, the key and the fix,
and that it is part of that target's artifact identity and no other's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gearfarm.formats import catalog

# Two targets, one [build]: the shape of every catalog before per-target builds.
SHARED = """schema = 2
[build]
argv = ["make", "CC={cc}"]
env = { CFLAGS = "-O2" }
outputs = ["libfoo.so", "test_foo"]
[targets.linux-x86_64]
vars = { cc = "gcc" }
[targets.windows-x86_64]
exe = ".exe"
vars = { cc = "x86_64-w64-mingw32-gcc" }
runner = ["wine"]
"""
WINDOWS_BUILD = """
[targets.windows-x86_64.build]
argv = ["make", "CC={cc}", "windows"]
env = { LDFLAGS = "-static-libgcc" }
outputs = ["foo.dll", "test_foo{exe}"]
"""
# Each target's build its own, no [build] at all.
SEPARATE = """schema = 2
[targets.linux-x86_64]
vars = { cc = "gcc" }
[targets.linux-x86_64.build]
argv = ["make"]
outputs = ["libfoo.so"]
[targets.windows-x86_64]
exe = ".exe"
[targets.windows-x86_64.build]
argv = ["make", "windows"]
outputs = ["foo.dll"]
timeout = 60
"""


def test_a_targets_build_overrides_build_key_by_key_and_merges_env() -> None:
    cat = catalog.parse(SHARED + WINDOWS_BUILD, "cat.toml")
    linux, windows = cat.build_for("linux-x86_64"), cat.build_for(cat.target("windows-x86_64"))
    assert (linux.argv, linux.env, linux.outputs) == (["make", "CC={cc}"], {"CFLAGS": "-O2"},
                                                      ["libfoo.so", "test_foo"])
    assert windows.argv == ["make", "CC={cc}", "windows"]
    assert windows.env == {"CFLAGS": "-O2", "LDFLAGS": "-static-libgcc"}  # merged, the target's winning
    assert windows.outputs == ["foo.dll", "test_foo{exe}"]  # replaced whole: no Linux file in it
    assert (windows.timeout, windows.cwd) == (900, ".")  # defaults, as for [build]
    assert cat.build_key(cat.target("windows-x86_64"), "outputs") == "targets.windows-x86_64.build.outputs"
    assert cat.build_key(cat.target("windows-x86_64"), "cwd") == "build.cwd"
    assert cat.build_key(cat.target("linux-x86_64"), "outputs") == "build.outputs"
    # The target's value of a name [build] also sets wins.
    won = catalog.parse(SHARED + WINDOWS_BUILD.replace('LDFLAGS = "-static-libgcc"', 'CFLAGS = "-Os"'), "c")
    assert won.build_for("windows-x86_64").env == {"CFLAGS": "-Os"}


def test_a_catalog_without_build_but_a_build_for_every_target_is_valid() -> None:
    cat = catalog.parse(SEPARATE, "cat.toml")
    assert cat.build is None
    assert cat.build_for("linux-x86_64").outputs == ["libfoo.so"]
    assert (cat.build_for("windows-x86_64").outputs, cat.build_for("windows-x86_64").timeout) == (["foo.dll"], 60)
    # [build] with only what the targets share; each target completes it.
    partial = catalog.parse(SHARED.replace('outputs = ["libfoo.so", "test_foo"]\n', "")
                            + WINDOWS_BUILD + '[targets.linux-x86_64.build]\noutputs = ["libfoo.so"]\n', "c")
    assert partial.build_for("linux-x86_64").argv == ["make", "CC={cc}"]


@pytest.mark.parametrize("text,message", [
    # A target with no build anywhere: the target, and both fixes.
    (SEPARATE.replace('[targets.linux-x86_64.build]\nargv = ["make"]\noutputs = ["libfoo.so"]\n', ""),
     r"cat.toml: \[targets.linux-x86_64\] has no build: the catalog has no \[build\] and no "
     r"\[targets.linux-x86_64.build\]: add \[targets.linux-x86_64.build\] with argv and outputs, or a \[build\]"),
    # No build at all.
    ('schema = 2\n[targets.linux-x86_64]\n', r"cat.toml: \[build\] required key is missing: add it"),
    # A key neither the target nor [build] sets.
    (SHARED.replace('outputs = ["libfoo.so", "test_foo"]\n', "") + WINDOWS_BUILD,
     r"cat.toml: \[build.outputs\] required key is missing for target linux-x86_64, set neither in "
     r"\[targets.linux-x86_64.build\] nor in \[build\]: add outputs to \[targets.linux-x86_64.build\], or to "
     r"\[build\]"),
    (SEPARATE.replace('argv = ["make", "windows"]\n', ""),
     r"\[targets.windows-x86_64.build.argv\] required key is missing for target windows-x86_64"),
    (SHARED + WINDOWS_BUILD.replace('"test_foo{exe}"]', '"test_foo{exe}"]\noutput = ["zlib1.dll"]'),
     r"cat.toml: \[targets.windows-x86_64.build\] unknown key 'output': remove it or check its spelling"),
    (SHARED + WINDOWS_BUILD.replace('outputs = ["foo.dll", "test_foo{exe}"]', 'outputs = "foo.dll"'),
     r"cat.toml: \[targets.windows-x86_64.build.outputs\] Input should be a valid list"),
    (SHARED + WINDOWS_BUILD.replace('outputs = ["foo.dll", "test_foo{exe}"]', "outputs = []"),
     r"\[targets.windows-x86_64.build\] outputs must name at least one file or directory"),
    (SHARED + WINDOWS_BUILD.replace('argv = ["make", "CC={cc}", "windows"]', "argv = []"),
     r"\[targets.windows-x86_64.build\] argv must not be empty"),
    (SHARED + WINDOWS_BUILD + 'cwd = "../out"\n', r"\[targets.windows-x86_64.build\] cwd '../out' must be a relative"),
    (SHARED + WINDOWS_BUILD + "timeout = 0\n", r"\[targets.windows-x86_64.build.timeout\] Input should be greater"),
    # Placeholders as in [build]: a var of the target's, a whole-item {runner}, doubled braces.
    (SHARED + WINDOWS_BUILD.replace('"test_foo{exe}"', '"{dll}"'),
     r"\[targets.windows-x86_64.build\] outputs: unknown placeholder \{dll\} in '\{dll\}' \(targets windows-x86_64 "
     r"define no var 'dll'\).*add it to the targets' vars"),
    (SHARED + WINDOWS_BUILD.replace('"windows"]', '"--via={runner}"]'),
     r"\[targets.windows-x86_64.build\] argv '--via=\{runner\}': \{runner\} must be an argv item of its own"),
    (SHARED + WINDOWS_BUILD.replace('"windows"]', '"${{x}"]'), r"\[targets.windows-x86_64.build\] argv: malformed"),
    # The worker's own variables stay the worker's.
    (SHARED + WINDOWS_BUILD.replace('LDFLAGS = "-static-libgcc"', 'WINEPREFIX = "/tmp/w"'),
     r"\[targets.windows-x86_64.build\] env.WINEPREFIX: WINEPREFIX is set by the worker"),
])
def test_a_targets_build_errors_name_the_file_the_key_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(catalog.CatalogError, match=message):
        catalog.parse(text, "cat.toml")


def test_placeholders_of_build_are_checked_against_the_targets_that_use_them() -> None:
    # A var only Windows defines: fine in Windows's own build...
    text = SHARED.replace('mingw32-gcc" }', 'mingw32-gcc", dll = "foo.dll" }') + WINDOWS_BUILD
    catalog.parse(text.replace('"test_foo{exe}"', '"{dll}"'), "cat.toml")
    # ... and in a key of [build] that only Windows uses (Linux sets its own outputs) ...
    own = '[targets.linux-x86_64.build]\noutputs = ["libfoo.so"]\n'
    catalog.parse(text.replace('outputs = ["libfoo.so", "test_foo"]', 'outputs = ["{dll}"]')
                  .replace(WINDOWS_BUILD, WINDOWS_BUILD.replace('outputs = ["foo.dll", "test_foo{exe}"]\n', ""))
                  + own, "cat.toml")
    # ... but not where Linux uses it: [build] names the target lacking it.
    with pytest.raises(catalog.CatalogError, match=r"\[build\] outputs: unknown placeholder \{dll\} .*targets "
                                                   r"linux-x86_64 define no var 'dll'"):
        catalog.parse(text.replace('outputs = ["libfoo.so", "test_foo"]', 'outputs = ["{dll}"]'), "cat.toml")
    # An env name of [build] the target replaces is the target's alone to get right.
    with pytest.raises(catalog.CatalogError, match=r"\[build\] env.CFLAGS: unknown placeholder \{opt\}"):
        catalog.parse(SHARED.replace('"-O2"', '"{opt}"') + WINDOWS_BUILD, "cat.toml")
    catalog.parse(SHARED.replace('"-O2"', '"{opt}"').replace('"gcc" }', '"gcc", opt = "-O2" }')
                  + WINDOWS_BUILD.replace('LDFLAGS = "-static-libgcc"', 'CFLAGS = "-Os"'), "cat.toml")


def _digest(cat: catalog.Catalog, target: str) -> str:
    return hashlib.sha256(catalog.definition(cat, cat.target(target)).encode()).hexdigest()


def test_changing_one_targets_build_changes_that_targets_definition_only() -> None:
    # What gearfarm before [targets.NAME.build] made of SHARED: artifacts stored then are reused.
    shared = catalog.parse(SHARED, "cat.toml")
    assert _digest(shared, "linux-x86_64") == "c28202c692204adc67dff08141985db394b7862fd12566d54fe473e31f7f2f70"
    assert _digest(shared, "windows-x86_64") == "c79d268a667d32d716a8c603402dce55a71df5ea6e0888c201d86a3bc1a0be25"
    own = catalog.parse(SHARED + WINDOWS_BUILD, "cat.toml")
    changed = catalog.parse(SHARED + WINDOWS_BUILD.replace('"-static-libgcc"', '"-static-libgcc -s"'), "cat.toml")
    assert _digest(own, "linux-x86_64") == _digest(changed, "linux-x86_64") == _digest(shared, "linux-x86_64")
    assert len({_digest(c, "windows-x86_64") for c in (shared, own, changed)}) == 3
    # The build in the definition is the target's own, whichever way it is written.
    assert '"foo.dll"' in catalog.definition(own, own.target("windows-x86_64"))
    assert '"foo.dll"' not in catalog.definition(own, own.target("linux-x86_64"))
    # [build] changed: every target that uses the changed key is a new artifact.
    wider = catalog.parse((SHARED + WINDOWS_BUILD).replace('"-O2"', '"-O3"'), "cat.toml")
    assert _digest(wider, "linux-x86_64") != _digest(own, "linux-x86_64")
    assert _digest(wider, "windows-x86_64") != _digest(own, "windows-x86_64")  # env merges [build]'s CFLAGS


def test_the_documented_example_is_the_catalog_the_farm_test_builds() -> None:
    """docs/projects.md's [targets.NAME.build] example is tests/projects.py's libfoo catalog
    (tests/farm/test_target_builds.py runs it through a farm), comments aside."""
    from tests import projects

    doc = (Path(__file__).resolve().parents[2] / "docs" / "projects.md").read_text()
    example = doc.split("#### `[targets.NAME.build]`", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert catalog.parse(example, "docs/projects.md") == catalog.parse(projects.CATALOG_LIBFOO, "libfoo")


def test_an_unknown_placeholder_lists_only_what_that_key_may_use() -> None:
    text = ('schema = 2\n[build]\nargv = ["make"]\noutputs = ["x"]\n[targets.linux-x86_64]\ntools = ["gcc"]\n'
            '[targets.windows-x86_64]\ntools = ["gcc"]\n[targets.windows-x86_64.build]\noutputs = ["{dllname}"]\n')
    with pytest.raises(catalog.CatalogError) as e:
        catalog.parse(text, "foo.toml")
    said = str(e.value)
    assert "[targets.windows-x86_64.build] outputs: unknown placeholder {dllname}" in said
    # {case} names a case in a suite's `only` items: never offered for a build key.
    assert "known here: {exe}, {jobs}" in said and "{case}" not in said
