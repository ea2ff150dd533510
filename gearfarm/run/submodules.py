"""A revision's git submodules, recursively: the commit each gitlink of the tree pins, the URL
.gitmodules (at that revision) gives for it, and a mirror of that repository on the nightly's
host holding the commit, for the source snapshot to archive.

The project's repository is untrusted input: its .gitmodules reaches git's command line and the
snapshot's layout. So every URL and path is checked before git sees it: no option-like URL
(CVE-2017-1000117's `--upload-pack=…`, an ssh host `-oProxyCommand=…`), no transport helper
(`ext::sh -c …` runs a command), no path on the nightly's host unless the project itself is
one (a project fetched from a server may not read the host's other repositories: why git
refuses file submodules by default), no path leaving the tree or naming `.git`."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gearfarm.run.gitrun import SourceError, git, stderr_text

GITLINK = "160000"
MAX_DEPTH = 8
MAX_MODULES = 256
SCHEMES = ("https", "http", "ssh", "git", "git+ssh", "ssh+git", "file")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)")
_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")


@dataclass(frozen=True)
class Module:
    """A submodule as the snapshot lays it out."""

    path: str  # in the snapshot, e.g. "picotest/fmt" for a submodule of the submodule picotest
    url: str  # as .gitmodules writes it, e.g. "../tinyfmt.git"
    fetch_url: str  # resolved against its superproject's URL
    commit: str  # the gitlink's commit
    mirror: Path  # a repository on this host that holds the commit


def base_url(repo: Path) -> str:
    """What a relative submodule URL of ``repo`` resolves against, as `git submodule init` does:
    its remote origin's URL (a mirror's is the project's URL), else its own path."""
    proc = git(["config", "--get", "remote.origin.url"], cwd=repo, timeout=30)
    url = proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""
    if not url:
        return str(repo.resolve())
    relative = is_local(url) and not _SCHEME.match(url) and not url.startswith("/")
    return str((repo / url).resolve()) if relative else url


def resolve_url(base: str, url: str) -> str:
    """``url`` (./ or ../ relative) resolved against ``base`` by git's rules: each ../ drops the
    base's last /-component (or its host:path colon); anything else is returned as it is."""
    if not url.startswith(("./", "../")):
        return url
    remote, colon = base[:-1] if base.endswith("/") else base, False
    while url.startswith(("./", "../")):
        if url.startswith("./"):
            url = url[2:]
            continue
        url = url[3:]
        if (i := remote.rfind("/")) >= 0:
            remote = remote[:i]
        elif (i := remote.rfind(":")) >= 0:
            remote, colon = remote[:i], True
        else:
            raise ValueError(f"has one ../ more than {base!r} has components")
    return f"{remote}{':' if colon else '/'}{url}"


def is_local(url: str) -> bool:
    """A path or file:// URL: something on this host rather than on a server."""
    if m := _SCHEME.match(url):
        return m[1].lower() == "file"
    colon, slash = url.find(":"), url.find("/")
    return colon < 0 or 0 <= slash < colon


def url_refused(url: str, local_ok: bool) -> str | None:
    """Why the farm will not hand ``url`` (resolved) to git, or None."""
    if not url:
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "contains a control character"
    if url.startswith("-"):
        return "starts with '-', so git would read it as an option (an --upload-pack=… runs any command)"
    if _HELPER.match(url):
        return "names a git transport helper ('<helper>::…'), which can run any command"
    if m := _SCHEME.match(url):
        scheme = m[1].lower()
        if scheme not in SCHEMES:
            return f"uses the scheme {scheme}://; submodules are fetched over {', '.join(SCHEMES)}"
        if m[2].startswith("-") or m[2].rpartition("@")[2].startswith("-"):
            return "has a host starting with '-', which ssh would read as an option (-oProxyCommand=…)"
        if scheme == "file" and not local_ok:
            return _LOCAL_REFUSED
        return None
    if not is_local(url):  # host:path, as scp writes it
        userhost = url[: url.find(":")]
        if userhost.startswith("-") or userhost.rpartition("@")[2].startswith("-"):
            return "has a host starting with '-', which ssh would read as an option (-oProxyCommand=…)"
        return None
    if not url.startswith("/"):
        return "is a relative path that starts with neither ./ nor ../ (git would read it from its working directory)"
    return None if local_ok else _LOCAL_REFUSED


_LOCAL_REFUSED = (
    "is a path on the nightly's host, but the project is fetched from a server: its submodules "
    "may not read the host's own repositories; give a URL the project's server serves"
)


def path_refused(path: str) -> str | None:
    """Why a submodule path cannot be laid out in the snapshot, or None."""
    if not path or path.startswith("/") or "\\" in path or any(ord(c) < 32 for c in path):
        return "is not a relative path inside the tree"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "leaves the tree or is not a plain path (no '..', '.' or empty component)"
    if any(p.lower().rstrip(". ") == ".git" for p in parts):
        return "names a .git directory"
    return None


def gitlinks(repo: Path, rev: str) -> list[tuple[str, str]]:
    """(path, commit) of every gitlink in ``rev``'s tree, in tree order."""
    proc = git(["ls-tree", "-r", "-z", "--full-tree", rev], cwd=repo, timeout=120)
    if proc.returncode != 0:
        raise SourceError(f"git ls-tree {rev[:12]} in {repo}: {stderr_text(proc)}")
    out = []
    for entry in proc.stdout.split(b"\0"):
        meta, _, name = entry.partition(b"\t")
        if meta.startswith(GITLINK.encode() + b" "):
            out.append((name.decode(errors="replace"), meta.split()[2].decode()))
    return out


def declared(repo: Path, rev: str, where: str, prefix: str = "") -> dict[str, tuple[str, str, str]]:
    """Path -> (name, url, url resolved) of ``rev``'s .gitmodules, every entry checked (those
    no gitlink uses too: a refusal should not depend on which entries are stale)."""
    proc = git(["ls-tree", "-z", rev, "--", ".gitmodules"], cwd=repo, timeout=30)
    if not proc.stdout:
        return {}
    if not proc.stdout.startswith((b"100644 ", b"100755 ")):
        raise SourceError(f"{where}: .gitmodules is not a regular file (a link?): refused; commit it as a file")
    proc = git(["config", "-z", "--no-includes", "--blob", f"{rev}:.gitmodules", "--list"], cwd=repo, timeout=30)
    if proc.returncode != 0:
        raise SourceError(f"{where}: .gitmodules cannot be read: {stderr_text(proc)}; fix its syntax")
    entries: dict[str, dict[str, str]] = {}
    for item in proc.stdout.decode(errors="replace").split("\0"):
        key, _, value = item.partition("\n")
        section, _, rest = key.partition(".")
        name, _, var = rest.rpartition(".")
        if section == "submodule" and name and var in ("path", "url"):
            entries.setdefault(name, {})[var] = value
    base = base_url(repo)
    out: dict[str, tuple[str, str, str]] = {}
    for name, e in sorted(entries.items()):
        path, url = e.get("path", ""), e.get("url", "")
        if why := path_refused(path):
            raise SourceError(
                f"{where}: .gitmodules [submodule {name!r}] path {path!r} {why}: refused; fix the path in .gitmodules"
            )
        if path in out:
            raise SourceError(
                f"{where}: .gitmodules gives the path {path!r} to both [submodule {out[path][0]!r}] "
                f"and [submodule {name!r}]: keep one"
            )
        fetch_url, why = "", None
        try:
            fetch_url = resolve_url(base, url) if url else ""
            why = url_refused(fetch_url, is_local(base)) if url else None
        except ValueError as err:
            why = str(err)
        if why:
            raise SourceError(
                f"submodule {prefix}{path}: url {url!r} in .gitmodules of {where} {why}: refused; "
                "fix the URL in .gitmodules"
            )
        out[path] = (name, url, fetch_url)
    return out


def find(repo: Path, rev: str, mirrors: Path, prefix: str = "", depth: int = 0) -> list[Module]:
    """Every submodule of ``rev`` in ``repo``, nested ones after their superproject's, each
    fetched into a mirror under ``mirrors`` (one per URL, kept: a later nightly fetches only
    what it lacks). SourceError naming the submodule, its URL, the commit and the fix."""
    links = gitlinks(repo, rev)
    if not links:
        return []
    where = f"submodule {prefix[:-1]} at {rev[:12]}" if prefix else f"the project at {rev[:12]}"
    if depth >= MAX_DEPTH:
        raise SourceError(f"{where}: submodules nested deeper than {MAX_DEPTH} levels: refused")
    entries = declared(repo, rev, where, prefix)
    out: list[Module] = []
    for path, commit in links:
        full = prefix + path
        if why := path_refused(path):
            raise SourceError(f"{where}: gitlink {path!r} {why}: refused")
        _, url, fetch_url = entries.get(path, ("", "", ""))
        if not url:
            raise SourceError(
                f"submodule {full} (commit {commit[:12]}): {where} has no url for it in .gitmodules; "
                f'add [submodule "{path}"] with path = {path} and url = <its repository>, or remove it'
            )
        mirror = _fetched(mirrors, full, url, fetch_url, commit)
        out.append(Module(full, url, fetch_url, commit, mirror))
        out += find(mirror, commit, mirrors, full + "/", depth + 1)
        if len(out) > MAX_MODULES:
            raise SourceError(f"{where}: more than {MAX_MODULES} submodules: refused")
    return out


def _first_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    # git's first line says why (not found, no such host, access denied); the rest is advice.
    return next(iter(stderr_text(proc).splitlines()), f"git exited {proc.returncode}")


def _mirror_dir(mirrors: Path, url: str) -> Path:
    # Named by the URL (not by .gitmodules' name, which the project chooses): readable, and
    # one mirror per repository whichever project or level names it.
    tail = re.sub(r"[^A-Za-z0-9._-]", "-", url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    tail = tail.removesuffix(".git").strip(".-")[:40] or "module"
    return mirrors / f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"


def _has(repo: Path, commit: str) -> bool:
    return git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=repo, timeout=30).returncode == 0


def _fetched(mirrors: Path, path: str, url: str, fetch_url: str, commit: str) -> Path:
    """The mirror of ``fetch_url`` holding ``commit``: as it is when it has it, else fetched."""
    dest = _mirror_dir(mirrors, fetch_url)
    if (dest / "HEAD").exists() and _has(dest, commit):
        return dest
    # URLs from .gitmodules are not the user's: git's own rule for them (GIT_PROTOCOL_FROM_USER=0)
    # refuses protocols it does not trust; file is allowed back only when url_refused let it through.
    env = {**os.environ, "GIT_PROTOCOL_FROM_USER": "0", "GIT_TERMINAL_PROMPT": "0"}
    allow = ["-c", "protocol.file.allow=always"] if is_local(fetch_url) else []
    shown = fetch_url if fetch_url == url else f"{url} = {fetch_url}"
    fresh = not (dest / "HEAD").exists()
    if fresh:
        mirrors.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        # --no-local: a repository on this host is read through git's transport too, never by
        # copying (or hard-linking) its files, which would follow whatever links it holds.
        proc = git([*allow, "clone", "--mirror", "--no-local", "--quiet", "--", fetch_url, str(dest)], env=env)
    else:
        proc = git([*allow, "fetch", "--prune", "--quiet", "origin"], cwd=dest, env=env)
    if proc.returncode != 0:
        if fresh:
            shutil.rmtree(dest, ignore_errors=True)
        raise SourceError(
            f"submodule {path} ({shown}, commit {commit[:12]}) cannot be fetched: {_first_line(proc)}; "
            "fix the URL in .gitmodules, or make the repository readable from the nightly's host"
        )
    if not _has(dest, commit):
        # On no branch or tag: servers that allow fetching a commit by its id still hand it over.
        git([*allow, "fetch", "--quiet", "origin", commit], cwd=dest, env=env)
    if not _has(dest, commit):
        raise SourceError(
            f"submodule {path}: commit {commit} is not in {shown} (fetched just now): push that "
            "commit there, or commit the submodule at a commit its repository has"
        )
    return dest
