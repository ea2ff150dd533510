"""A revision's submodules in its source snapshot: nested ones too, byte-identical whoever packs
it, fetched once into mirrors; a submodule that cannot be fetched or lacks its commit named with
the fix; a hostile .gitmodules refused before git runs, and its command never run."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from gearfarm.config import Config, ProjectConfig
from gearfarm.run import snapshot, submodules
from gearfarm.run.gitrun import SourceError
from gearfarm.s3.artifact import open_tar
from tests import subprojects
from tests.farmkit import gearfarm


def config(state: Path) -> Config:
    cfg = Config()
    cfg.farm.state_dir = str(state)
    return cfg


def packed(cfg: Config, repo: str, dest: Path) -> tuple[str, list[submodules.Module]]:
    """(rev of main, submodules) of a snapshot of ``repo`` written to ``dest``, as the nightly packs it."""
    project = ProjectConfig(name="calc", repo=repo)
    path = snapshot.repository(cfg, project)
    rev = snapshot.resolve(path, "main")
    return rev, snapshot.pack(path, rev, dest, snapshot.module_mirrors(cfg, project))


def members(archive: Path) -> dict[str, bytes | None]:
    with open_tar(archive) as tar:
        return {m.name: tar.extractfile(m).read() if m.isfile() else None for m in tar}  # type: ignore[union-attr]


def test_the_snapshot_holds_nested_submodules_byte_identical_whoever_packs_it(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    cfg = config(tmp_path / "state")
    rev, mods = packed(cfg, calc.url, tmp_path / "a.tar.zst")
    got = members(tmp_path / "a.tar.zst")
    assert got["picotest/picotest.c"] == subprojects.PICOTEST["picotest.c"].encode()
    assert got["picotest/fmt/fmt.c"] == subprojects.TINYFMT["fmt.c"].encode()
    assert got["calc.c"] == subprojects.CALC["calc.c"].encode()
    # Superproject first, each submodule after its superproject, every directory once.
    names = list(got)
    assert names.index("Makefile") < names.index("picotest/picotest.c") < names.index("picotest/fmt/fmt.c")
    assert len(names) == len(set(names))
    pico_rev, fmt_rev = (subprojects.git(calc.work(n), "rev-parse", "HEAD") for n in ("picotest", "tinyfmt"))
    assert [(m.path, m.url, m.commit) for m in mods] == [
        ("picotest", "../picotest.git", pico_rev),
        ("picotest/fmt", "../tinyfmt.git", fmt_rev),
    ]
    assert mods[0].fetch_url == f"file://{calc.bare('picotest')}"
    assert mods[1].fetch_url == f"file://{calc.bare('tinyfmt')}"
    mirrors = tmp_path / "state" / "repos" / "calc" / "modules"
    assert sorted(p.parent for p in mirrors.glob("*/HEAD")) == sorted(m.mirror for m in mods)

    # Again, with the submodules' server gone: the mirrors have the commits, nothing is fetched.
    shutil.move(calc.base / "git" / "picotest.git", tmp_path / "away.git")
    assert packed(cfg, calc.url, tmp_path / "b.tar.zst")[0] == rev
    shutil.move(tmp_path / "away.git", calc.base / "git" / "picotest.git")
    # Another host (fresh mirrors), and the project as a path used in place: the same bytes.
    assert packed(config(tmp_path / "state2"), calc.url, tmp_path / "c.tar.zst")[0] == rev
    assert packed(config(tmp_path / "state3"), str(calc.bare("calc")), tmp_path / "d.tar.zst")[0] == rev
    first = (tmp_path / "a.tar.zst").read_bytes()
    assert all((tmp_path / f"{n}.tar.zst").read_bytes() == first for n in "bcd")
    with open_tar(tmp_path / "a.tar.zst") as tar:
        assert {(m.uid, m.gid, m.uname) for m in tar} == {(0, 0, "root")}


def test_a_snapshot_without_submodules_is_still_git_archives_stream(tmp_path: Path) -> None:
    """Byte for byte what the farm packed before it knew of submodules."""
    calc = subprojects.Calc(tmp_path / "server")
    calc.commit("tinyfmt", "tinyfmt", subprojects.TINYFMT)
    rev, mods = packed(config(tmp_path / "state"), f"file://{calc.bare('tinyfmt')}", tmp_path / "a.tar.zst")
    assert mods == []
    plain = subprocess.run(
        ["git", "archive", "--format=tar", rev], cwd=calc.bare("tinyfmt"), capture_output=True, check=True
    ).stdout
    with (tmp_path / "a.tar.zst").open("rb") as f:
        assert zstandard.ZstdDecompressor().stream_reader(f).read() == plain


def test_a_new_pinned_commit_is_fetched_into_the_mirror_it_has(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    cfg = config(tmp_path / "state")
    _, mods = packed(cfg, calc.url, tmp_path / "a.tar.zst")
    (mods[0].mirror / "kept").write_text("the mirror is fetched into, not cloned again")
    pico = calc.commit("picotest", "louder", {"picotest.h": subprojects.PICOTEST["picotest.h"] + "/* v2 */\n"})
    calc.commit("calc", "picotest v2", links={"picotest": pico})
    _, again = packed(cfg, calc.url, tmp_path / "b.tar.zst")
    assert again[0].commit == pico and again[0].mirror == mods[0].mirror and (mods[0].mirror / "kept").exists()
    assert members(tmp_path / "b.tar.zst")["picotest/picotest.h"].endswith(b"/* v2 */\n")  # type: ignore[union-attr]


def test_a_missing_commit_names_the_submodule_its_url_the_commit_and_the_fix(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    # Committed in tinyfmt but never pushed; picotest (pushed) and calc pin it.
    fmt = calc.commit("tinyfmt", "unpushed", {"fmt.h": subprojects.TINYFMT["fmt.h"] + "/* local */\n"}, push=False)
    pico = calc.commit("picotest", "fmt: unpushed", links={"fmt": fmt})
    calc.commit("calc", "picotest: unpushed fmt", links={"picotest": pico})
    with pytest.raises(SourceError) as e:
        packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")
    msg = str(e.value)
    assert f"submodule picotest/fmt: commit {fmt} is not in ../tinyfmt.git = file://{calc.bare('tinyfmt')}" in msg
    assert "push that commit there" in msg


def test_an_unreachable_submodule_names_it_its_url_and_the_fix(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    calc.commit(
        "calc",
        "moved",
        {".gitmodules": '[submodule "picotest"]\n    path = picotest\n    url = ../moved/picotest.git\n'},
    )
    pico = subprojects.git(calc.work("picotest"), "rev-parse", "HEAD")
    with pytest.raises(SourceError) as e:
        packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")
    msg = str(e.value)
    assert msg.startswith(
        f"submodule picotest (../moved/picotest.git = file://{calc.base}/git/moved/picotest.git, "
        f"commit {pico[:12]}) cannot be fetched: "
    ), msg
    assert "fix the URL in .gitmodules" in msg
    # Through `gearfarm project check`: exit 2 and the same message.
    p = gearfarm("project", "check", "--repo", calc.url, "--rev", "main", "--no-run", timeout=120)
    assert p.returncode == 2 and "submodule picotest (../moved/picotest.git" in p.stdout + p.stderr, p.stderr


def test_project_check_lists_the_submodules_and_builds_with_them(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    pico, fmt = (subprojects.git(calc.work(n), "rev-parse", "HEAD") for n in ("picotest", "tinyfmt"))
    p = gearfarm("project", "check", "--repo", calc.url, "--rev", "main", "--target", "linux-i686", timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "submodules (2, each at the commit the tree records):" in out
    assert f"  picotest at {pico[:12]} from ../picotest.git = file://{calc.bare('picotest')}" in out
    assert f"  picotest/fmt at {fmt[:12]} from ../tinyfmt.git = file://{calc.bare('tinyfmt')}" in out
    assert "suite calc (tap): passed, 2 test cases 2 passed" in out


HOSTILE_URLS = [
    ("--upload-pack=touch {pwned};false", "starts with '-', so git would read it as an option"),
    ("ssh://-oProxyCommand=touch {pwned}/x", "has a host starting with '-'"),
    ("ssh://user@-oProxyCommand=touch {pwned}/x", "has a host starting with '-'"),
    ("-oProxyCommand=touch {pwned}:x", "starts with '-'"),
    ("ext::sh -c touch% {pwned}", "names a git transport helper"),
    ("fd::17", "names a git transport helper"),
    ("picotest.git", "is a relative path that starts with neither ./ nor ../"),
    ("https://example.org/a\n[core]\n", "contains a control character"),
    ("../" * 40 + "x.git", "has one ../ more than"),
]


@pytest.mark.parametrize(("url", "why"), HOSTILE_URLS, ids=[u.split("=")[0][:16] for u, _ in HOSTILE_URLS])
def test_a_hostile_submodule_url_is_refused_and_its_command_never_runs(tmp_path: Path, url: str, why: str) -> None:
    calc = subprojects.calc(tmp_path / "server")
    pwned = tmp_path / "pwned"
    url = url.format(pwned=pwned)
    quoted = url.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    calc.commit(
        "calc", "hostile", {".gitmodules": f'[submodule "picotest"]\n    path = picotest\n    url = "{quoted}"\n'}
    )
    with pytest.raises(SourceError) as e:
        packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")
    assert f"submodule picotest: url {url!r} in .gitmodules of the project at " in str(e.value), e.value
    assert why in str(e.value) and "refused; fix the URL in .gitmodules" in str(e.value)
    assert not pwned.exists()
    assert not (tmp_path / "state" / "repos" / "calc").exists()  # no submodule was fetched at all


@pytest.mark.parametrize("path", ["../escape", "/tmp/escape", "picotest/../../escape", "x/.git/hooks", "a//b"])
def test_a_submodule_path_leaving_the_tree_is_refused(tmp_path: Path, path: str) -> None:
    calc = subprojects.calc(tmp_path / "server")
    calc.commit(
        "calc",
        "escape",
        {
            ".gitmodules": subprojects.doc_block("# calc/.gitmodules")
            + f'[submodule "evil"]\n    path = {path}\n    url = ../picotest.git\n'
        },
    )
    with pytest.raises(SourceError) as e:
        packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")
    assert f".gitmodules [submodule 'evil'] path {path!r} " in str(e.value) and "refused" in str(e.value)
    assert not (tmp_path / "escape").exists() and not (tmp_path / "state" / "repos" / "calc").exists()


def test_a_local_submodule_of_a_project_on_a_server_is_refused() -> None:
    """A project fetched from a server may not make the nightly read its host's repositories."""
    assert submodules.url_refused("/srv/other-team/secret.git", local_ok=False)
    assert submodules.url_refused("file:///srv/other-team/secret.git", local_ok=False)
    assert submodules.url_refused("/srv/git/picotest.git", local_ok=True) is None
    assert submodules.url_refused("https://git.example.org/picotest.git", local_ok=False) is None
    assert submodules.url_refused("git@git.example.org:tools/picotest.git", local_ok=False) is None
    assert submodules.is_local("file:///x") and submodules.is_local("/x") and submodules.is_local("./a:b")
    assert not submodules.is_local("host:x") and not submodules.is_local("https://h/x")


RELATIVE = [  # (superproject URL, .gitmodules URL)
    ("https://git.example.org/tools/calc.git", "../picotest.git"),
    ("https://git.example.org/tools/calc.git/", "./sub.git"),
    ("https://git.example.org/tools/calc.git", "../../other/./x.git"),
    ("git@git.example.org:tools/calc.git", "../../x.git"),
    ("git@git.example.org:calc.git", "../x.git"),
    ("/srv/git/calc.git", "../x.git"),
    ("file:///srv/git/calc.git", "../../y/x.git"),
    ("https://git.example.org/tools/calc.git", "https://elsewhere.example.org/x.git"),
]


def test_relative_urls_resolve_as_git_submodule_init_resolves_them(tmp_path: Path) -> None:
    """The oracle is git itself: `git submodule init` in a superproject with that origin."""
    sup = tmp_path / "sup"
    sup.mkdir()
    subprojects.git(sup, "init", "-q", "-b", "main")
    subprojects.git(sup, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},sub")
    for base, url in RELATIVE:
        (sup / ".gitmodules").write_text(f'[submodule "sub"]\n    path = sub\n    url = {url}\n')
        subprojects.git(sup, "config", "remote.origin.url", base)
        subprocess.run(["git", "config", "--unset", "submodule.sub.url"], cwd=sup)
        subprojects.git(sup, "submodule", "init", "-q")
        assert submodules.resolve_url(base, url) == subprojects.git(sup, "config", "submodule.sub.url"), (base, url)


def test_a_gitlink_without_a_gitmodules_entry_says_what_to_add(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    pico = subprojects.git(calc.work("picotest"), "rev-parse", "HEAD")
    calc.commit("calc", "vendor", links={"vendor/pt": pico})
    with pytest.raises(
        SourceError,
        match=r"submodule vendor/pt \(commit [0-9a-f]{12}\): the project at [0-9a-f]{12} "
        r"has no url for it in \.gitmodules; add \[submodule \"vendor/pt\"\]",
    ):
        packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")


def test_archive_members_keep_gits_modes_and_times(tmp_path: Path) -> None:
    calc = subprojects.calc(tmp_path / "server")
    packed(config(tmp_path / "state"), calc.url, tmp_path / "a.tar.zst")
    with open_tar(tmp_path / "a.tar.zst") as tar:
        by = {m.name: m for m in tar}
        assert tar.pax_headers.get("comment") == snapshot.resolve(calc.bare("calc"), "main")
    assert by["picotest"].type == tarfile.DIRTYPE and by["picotest/picotest.c"].mode == 0o664
    assert by["picotest/fmt/fmt.c"].mtime == int(subprojects.git(calc.work("tinyfmt"), "log", "-1", "--format=%ct"))
