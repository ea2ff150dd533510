"""A catalog is a project's commit, so catalog.parse is fed whatever a commit holds: arrays and
tables nested thousands deep, megabytes, random bytes, valid TOML of the wrong shapes. Whatever
it is, parse answers with a CatalogError naming the catalog and the fix, never another
exception (a RecursionError took a whole nightly down, every project with it: issue #76), and a
timeout above the farm's `[farm] max_timeout` is refused naming the key and the limit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gearfarm.config import FarmConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import MAX_BYTES, CatalogError

GOOD = """schema = 2

[build]
argv = ["make"]
outputs = ["out"]

[suites.unit]
argv = ["./t"]
format = "exit-code"

[targets.linux-x86_64]
suites = ["unit"]
"""


@pytest.mark.parametrize("text", [
    "x = " + "[" * 5000 + "]" * 5000,
    "[build]\nargv = " + "[" * 5000 + "]" * 5000,
    "x = " + "{a = " * 3000 + "1" + "}" * 3000,
    "[targets.linux-x86_64]\nvars = " + "{a = " * 3000 + "1" + "}" * 3000,
    GOOD + "\n[suites.deep]\nargv = " + "[" * 900 + '"x"' + "]" * 900,
])
def test_deep_nesting_is_a_catalog_error_naming_it(text: str) -> None:
    with pytest.raises(CatalogError) as e:
        catalog_mod.parse(text, "proj@abc:jobs/catalog.toml")
    assert str(e.value).startswith("proj@abc:jobs/catalog.toml: "), e.value
    assert "nested too deeply" in str(e.value) or "[" in str(e.value), e.value


def test_the_deep_array_of_the_issue_is_named_as_nesting() -> None:
    with pytest.raises(CatalogError, match=r"proj: arrays or tables nested too deeply to read: .*remove the nesting"):
        catalog_mod.parse("x = " + "[" * 5000 + "]" * 5000, "proj")


def test_a_huge_catalog_is_refused_by_its_size_before_it_is_read() -> None:
    text = GOOD + "# " + "x" * MAX_BYTES + "\n"
    with pytest.raises(CatalogError, match=rf"big: the catalog is {len(text)} bytes, more than the {MAX_BYTES}"):
        catalog_mod.parse(text, "big")
    with pytest.raises(CatalogError, match="more than the"):
        catalog_mod.parse(text.encode(), "big")
    # Just under the limit it is read like any other.
    fits = GOOD + "# " + "x" * (MAX_BYTES - len(GOOD) - 10) + "\n"
    assert catalog_mod.parse(fits, "fits").targets


def test_bytes_that_are_not_utf8_say_so() -> None:
    with pytest.raises(CatalogError, match=r"bin: not UTF-8 text .*save the catalog as UTF-8"):
        catalog_mod.parse(b"schema = 2\n\xff\xfe\x00", "bin")
    assert catalog_mod.parse(GOOD.encode(), "ok").targets["linux-x86_64"].suites == ["unit"]


@pytest.mark.parametrize("text", [
    "targets = 3", "schema = 2\ntargets = []", "schema = 2\n[targets]\nlinux-x86_64 = 1",
    "schema = 2\nsuites = 'x'\n[targets.linux-x86_64]", "schema = 2\n[targets.linux-x86_64]\nsuites = {a = 1}",
    "schema = 2\n[targets.linux-x86_64]\nvars = [1, 2]", "schema = 2\n[targets.linux-x86_64]\nenv = {HOME = 3}",
    "schema = 2\n[build]\nargv = [1]\noutputs = 2\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['{']\noutputs = ['o']\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['{0}']\noutputs = ['o']\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['{a.b}']\noutputs = ['o']\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['{a[0]}']\noutputs = ['o']\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['x']\noutputs = ['o']\ntimeout = nan\n[targets.linux-x86_64]",
    "schema = 2\n[build]\nargv = ['x']\noutputs = ['o']\ntimeout = inf\n[targets.linux-x86_64]",
    "schema = 2\n[benchmarks.b]\nargv = ['x']\nmetrics = {m = 'higher'}\nmetrics_pattern = '(?P<m'\n"
    "[targets.linux-x86_64]\nperf = true",
    "schema = 1", "schema = 2\n[suites.a]\nname = 'x'\n[targets.linux-x86_64]", "\x00", "[[targets]]\n",
])
def test_wrong_shapes_are_catalog_errors(text: str) -> None:
    with pytest.raises(CatalogError):
        catalog_mod.parse(text, "shapes", max_timeout=3600)


def _random_value(rng: random.Random, depth: int) -> str:
    pick = rng.randrange(8 if depth < 40 else 4)
    if pick == 0:
        return str(rng.randrange(-10**6, 10**6))
    if pick == 1:
        return repr("".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(6))))
    if pick == 2:
        return rng.choice(["true", "false", "1.5", "nan", "inf", "1979-05-27", "0x1f"])
    if pick == 3:
        return '"{' + rng.choice(["root", "nope", "", "0", "runner", "case", "a.b"]) + '}"'
    if pick in (4, 5):
        return "[" + ", ".join(_random_value(rng, depth + 1) for _ in range(rng.randrange(4))) + "]"
    keys = ["argv", "outputs", "timeout", "env", "suites", "vars", "format", "metrics", "x", "HOME", "cwd"]
    return "{" + ", ".join(f"{rng.choice(keys)} = {_random_value(rng, depth + 1)}"
                           for _ in range(rng.randrange(4))) + "}"


def _random_catalog(rng: random.Random) -> str | bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(400)))
    if kind == 1:  # a valid catalog with random bytes spliced in
        data = bytearray(GOOD.encode())
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 2:  # nesting of a random depth, around the reader's recursion limit
        n = rng.choice([10, 300, 999, 1000, 1001, 2000, 5000, 20000])
        opener, closer = rng.choice([("[", "]"), ("{a = ", "}")])
        return f"{rng.choice(['x', 'schema', 'targets'])} = " + opener * n + "1" + closer * n
    # TOML of a catalog's sections with random values
    sections = ["build", "targets.linux-x86_64", "targets.win-x86_64", "suites.unit", "benchmarks.b",
                "targets.linux-x86_64.build", "targets.BAD"]
    lines = [rng.choice(["schema = 2", "schema = 1", "schema = 'x'", ""])]
    for _ in range(rng.randrange(1, 6)):
        lines.append(f"[{rng.choice(sections)}]")
        keys = ["argv", "outputs", "timeout", "env", "suites", "vars", "format", "metrics", "perf", "runner",
                "results", "only", "metrics_pattern", "repetitions", "cwd", "tools", "runner_env", "name"]
        lines += [f"{rng.choice(keys)} = {_random_value(rng, 0)}" for _ in range(rng.randrange(5))]
    return "\n".join(lines)


def test_random_input_never_raises_anything_but_a_catalog_error() -> None:
    rng = random.Random(76)
    parsed = refused = 0
    for _ in range(3000):
        text = _random_catalog(rng)
        try:
            catalog_mod.parse(text, "fuzz", max_timeout=rng.choice([None, 60.0, 3600.0]))
            parsed += 1
        except CatalogError as e:
            assert str(e).startswith("fuzz"), e
            refused += 1
    assert refused > 2500 and parsed + refused == 3000


def test_max_timeout_defaults_to_six_hours() -> None:
    assert FarmConfig().max_timeout == 6 * 3600


@pytest.mark.parametrize(("extra", "key", "value"), [
    ("[suites.unit]\ntimeout = 31536000\n", "suites.unit.timeout", "31536000"),
    ("[build]\ntimeout = 7200\n", "build.timeout", "7200"),
    ("[targets.linux-x86_64.build]\ntimeout = 3601\n", "targets.linux-x86_64.build.timeout", "3601"),
    ("[benchmarks.b]\ntimeout = 4000\n", "benchmarks.b.timeout", "4000"),
])
def test_a_timeout_above_max_timeout_is_refused_naming_the_key_the_value_and_the_limit(
        extra: str, key: str, value: str) -> None:
    text = _with(extra)
    assert catalog_mod.parse(text, "proj").targets  # no limit given: read as before
    with pytest.raises(CatalogError) as e:
        catalog_mod.parse(text, "proj", max_timeout=3600)
    assert str(e.value).startswith(f"proj: [{key}] {value} s is above the farm's limit, [farm] max_timeout = 3600 s: "
                                   f"set {key} to 3600 or less"), e.value


def test_a_catalog_may_lower_the_limit_and_the_defaults_count() -> None:
    assert catalog_mod.parse(_with("[suites.unit]\ntimeout = 10\n"), "p", max_timeout=3600).suites["unit"].timeout == 10
    # A default above a strict farm's limit is named too: the catalog lowers it.
    with pytest.raises(CatalogError, match=r"\[build.timeout\] 900 s is above .* max_timeout = 600 s"):
        catalog_mod.parse(GOOD, "p", max_timeout=600)


def _with(extra: str) -> str:
    """GOOD with sections merged in (a section given in ``extra`` adds to GOOD's own)."""
    out = GOOD
    for block in extra.strip().split("\n\n"):
        head, _, body = block.partition("\n")
        if head in out:
            out = out.replace(head + "\n", head + "\n" + body + "\n")
        elif head == "[benchmarks.b]":
            out += (f"\n{head}\nargv = ['b']\nmetrics = {{ ops = 'higher' }}\n"
                    f"metrics_pattern = '(?P<ops>[0-9]+)'\n{body}\n")
            out = out.replace('suites = ["unit"]', 'suites = ["unit"]\nperf = true')
        else:
            out += f"\n{head}\n{body}\n"
    return out


def test_a_committed_catalog_too_big_or_not_utf8_is_refused_naming_the_project(tmp_path: Path) -> None:
    """The nightly reads a project's catalog from git: one of 2 MiB is refused by its size
    (`git cat-file -s`), before the nightly reads it; bytes that are not UTF-8 are named as such."""
    from gearfarm.config import Config, ProjectConfig
    from gearfarm.run import snapshot
    from tests.farmkit import commit
    from tests.projects import _init

    cfg = Config(farm=FarmConfig(state_dir=str(tmp_path / "state")))
    for name, data, said in (
            ("huge", (GOOD + "#" * (2 * MAX_BYTES) + "\n").encode(), f"is {len(GOOD) + 2 * MAX_BYTES + 1} bytes, more "
                                                                     f"than the {MAX_BYTES} a catalog may have"),
            ("latin", GOOD.encode() + b"# caf\xe9\n", "not UTF-8 text")):
        _init(tmp_path / name, {"README": "x"})
        (tmp_path / name / "jobs").mkdir()
        (tmp_path / name / "jobs" / "catalog.toml").write_bytes(data)
        rev = commit(tmp_path / name, "catalog")
        project = ProjectConfig(name=name, repo=str(tmp_path / name))
        with pytest.raises(CatalogError) as e:
            snapshot.catalog_text(cfg, project, tmp_path / name, rev)
        assert str(e.value).startswith(f"{name}@{rev[:12]}:jobs/catalog.toml: ") and said in str(e.value), e.value
        # The same from a catalog_file beside the config.
        (tmp_path / f"{name}.toml").write_bytes(data)
        beside = project.model_copy(update={"catalog_file": str(tmp_path / f"{name}.toml")})
        with pytest.raises(CatalogError, match=said):
            snapshot.catalog_text(cfg, beside, tmp_path / name, rev)
