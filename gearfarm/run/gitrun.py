"""How the nightly runs git, and the one error it raises for a repository it cannot use. Shared
by the source snapshot and the submodules it takes in (each imports this, not the other)."""

from __future__ import annotations

import subprocess
from pathlib import Path


class SourceError(RuntimeError):
    """The project's repository cannot be fetched, or the revision is not in it."""


def git(
    args: list[str], cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError as e:
        raise SourceError("git is not installed on the host that runs the nightly (apt-get install git)") from e
    except subprocess.TimeoutExpired as e:
        raise SourceError(f"git {' '.join(args[:2])} took longer than {timeout:.0f}s") from e


def stderr_text(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode(errors="replace").strip()
