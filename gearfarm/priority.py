"""Which queued job a worker slot takes first: the one on the longest remaining path of the
nightly (critical-path list scheduling), so slow emulated suites and the builds they wait for
start before quick native ones instead of being left for last on a busy host.

gearmand orders jobs only within one function (priorities) and offers a worker the functions in
the order it registered them (gearfarm.gearman.Worker.register), so a slot registers its
functions in this order. Each host learns how long its jobs take: every finished job updates a
per-host file of durations in the state directory, read at the next start. Until a function has
been seen, an emulated target's suites count three times a native one's (measured on the default
nightly: the aarch64 suites under qemu and the Windows suites under wine took 2.5-4 times the
native ones)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from gearfarm.catalog import Target

EMULATED = 3.0
# Weight of the newest duration in the running average: the engine and the host change.
RECENT = 0.5


class Durations:
    """Seconds per job of each function on one host (a running average), kept in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of_host(cls, state_dir: Path) -> Durations:
        return cls(state_dir / "durations" / f"{socket.gethostname()}.json")

    def load(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # never measured, or unreadable: the defaults order the slots
        return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and v >= 0} \
            if isinstance(data, dict) else {}

    def record(self, function: str, seconds: float) -> None:
        """Fold one job's duration in; several slot processes of the host write the file."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = self.load()
                old = data.get(function)
                data[function] = seconds if old is None else RECENT * seconds + (1 - RECENT) * old
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".durations-")
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
        except OSError:
            pass  # only the next start's order depends on it


def order(functions: Iterable[tuple[str, str]], targets: Mapping[str, Target],
          durations: Mapping[str, float]) -> list[tuple[str, str]]:
    """(role, target) pairs, longest remaining path first. A build's path is its own duration
    and then its target's suites (they wait for it); a suite job's is its own."""

    def job(role: str, target: str) -> float:
        seen = durations.get(f"{role}:{target}")
        if seen is not None:
            return seen
        t = targets.get(target)
        return EMULATED if role == "test" and t is not None and t.runner else 1.0

    def path(role: str, target: str) -> float:
        if role == "build":
            t = targets.get(target)
            suites = len(t.suites) if t is not None else 1
            return job("build", target) + suites * job("test", target)
        return job(role, target)

    pairs = list(functions)
    return sorted(pairs, key=lambda rt: (-path(*rt), rt))
