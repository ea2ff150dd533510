"""Whether the farm's services answer this host, asked once and quickly, and what a person is
told when they do not: what is down and how to start it.

A worker or a nightly waits out an outage (the store retries for minutes, gearmand's clients
fail over); a command a person or cron runs should not. Such a command asks here first: one
TCP connection to every address of gearmand and of S3, all at once, each given ``TIMEOUT``
seconds. A stopped farm then costs it a second and one message, not a minute of retries."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gearfarm.config import Config
from gearfarm.hosts import net

GEARMAND = "gearmand"
S3 = "s3"
SERVICES = (GEARMAND, S3)
TIMEOUT = 1.5
# The checkout this runs from, when it is one (nightly.bash beside the package): the embedded
# farm's default state is its state/ folder.
CHECKOUT = Path(__file__).resolve().parents[2]
# What starts a lab's services (docs/lab.md, "systemd and cron"; docker/systemd/).
GEARMAND_UNIT = "gearfarm-gearmand.service"
STUNNEL_UNIT = "gearfarm-stunnel.service"


@dataclass(frozen=True)
class Down:
    """The farm's services that did not answer, and how to start them: one message."""

    what: tuple[str, ...]  # e.g. "gearmand at 127.0.0.1:4730"
    start: str  # what to run, or which unit to start where
    state: Path | None = None  # the embedded farm's state directory; None for a lab

    def __str__(self) -> str:
        verb = "does" if len(self.what) == 1 else "do"
        if self.state is not None:
            return f"the embedded farm in {self.state} is not running ({' and '.join(self.what)} {verb} not " \
                   f"answer): {self.start}"
        return f"{' and '.join(self.what)} {verb} not answer: {self.start}"


def embedded_state(cfg: Config) -> Path | None:
    """The state directory of the embedded farm whose config ``cfg`` is (the farm.toml it
    wrote there); None for a lab's config."""
    if not cfg.source:
        return None
    state = cfg.path(cfg.farm.state_dir).resolve()
    return state if Path(cfg.source).resolve() == state / "farm.toml" else None


def _nightly_keep(state: Path) -> str:
    """The command that starts the embedded farm in ``state`` and leaves it running."""
    script = CHECKOUT / "nightly.bash"
    if not script.exists():  # an installed package: no checkout, no nightly.bash
        command = "gearfarm nightly --keep"
    else:
        command = ("./nightly.bash" if Path.cwd().resolve() == CHECKOUT else str(script)) + " --keep"
    default = Path(os.environ.get("GEARFARM_STATE", CHECKOUT / "state")).resolve()
    return command if state == default else f"{command} --state-dir {state}"


def _s3_address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def check(cfg: Config, needs: Sequence[str] = SERVICES, timeout: float = TIMEOUT) -> Down | None:
    """``Down`` when a service in ``needs`` (GEARMAND, S3) has no address that accepts a
    connection within ``timeout`` seconds (every address asked at once); None when each has one."""
    addresses: dict[str, list[tuple[str, int]]] = {}
    shown: dict[str, str] = {}
    if GEARMAND in needs:
        addresses[GEARMAND] = cfg.gearman.addresses()
        shown[GEARMAND] = f"gearmand at {', '.join(cfg.gearman.servers)}"
    if S3 in needs:
        endpoints = cfg.s3.endpoint_list()
        addresses[S3] = [_s3_address(e) for e in endpoints]
        shown[S3] = f"S3 (MinIO) at {', '.join(endpoints)}"
    every = [a for service in addresses.values() for a in service]
    if not every:
        return None
    with ThreadPoolExecutor(max_workers=len(every), thread_name_prefix="reach") as pool:
        answered = dict(zip(every, pool.map(lambda a: net.answers(*a, timeout=timeout), every), strict=True))
    down = [service for service, addrs in addresses.items() if not any(answered[a] for a in addrs)]
    if not down:
        return None
    state = embedded_state(cfg)
    if state is not None:
        return Down(tuple(shown[s] for s in down),
                    f"start it with '{_nightly_keep(state)}' (a nightly that leaves the farm running; "
                    "'gearfarm farm stop' stops it)", state)
    hints = []
    if GEARMAND in down:
        units = [GEARMAND_UNIT] + ([STUNNEL_UNIT] if cfg.gearman.tls_ca else [])
        hints.append(f"on the job server, start {' and '.join(units)} "
                     f"(sudo systemctl start {' '.join(u.removesuffix('.service') for u in units)})")
    if S3 in down:
        hints.append("on the storage host, start MinIO (its service, or its container from docker/Dockerfile.minio)")
    return Down(tuple(shown[s] for s in down), "; ".join(hints))
