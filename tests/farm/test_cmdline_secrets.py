"""No secret on a command line (issue #32, point 6): any local user can read every process's
argv in /proc/PID/cmdline (`ps`), so the farm hands keys to its helpers (mc, MinIO, gearmand,
the workers) only through their environment or a 0600 file.

While an embedded farm starts on a fresh state directory (so the role users are made, with mc),
a thread samples the cmdline of every process every few milliseconds; afterwards none of the
farm's secrets (the signing keys, MinIO's root key, each role's key) may be in any of them. The
sampler must have seen the mc processes the start ran, or the test proves nothing."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from gearfarm import config as config_mod
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import key_secrets

CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt"]

[targets.linux-x86_64]
tools = ["sh"]
"""


class Sampler(threading.Thread):
    """Every distinct (pid, parent pid, argv) of the host's processes, read from /proc until
    stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[tuple[int, int, bytes]] = set()
        self.sweeps = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        argv = f.read()
                    with open(f"/proc/{entry.name}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue  # gone meanwhile, or a kernel thread
                if argv:
                    self.seen.add((int(entry.name), ppid, argv))
            self.sweeps += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._done.set()
        self.join(10)


def test_no_secret_is_on_any_command_line_while_the_farm_starts(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    farm = EmbeddedFarm(tmp_path / "state", tmp_path / "repo", slots=1)
    sampler = Sampler()
    sampler.start()
    try:
        farm.start(catalog_mod.parse(CATALOG, "tiny"))
    finally:
        sampler.stop()
        farm.stop()
    cfg = config_mod.load(farm.config_path)
    secrets = {"signing keys": key_secrets(cfg), "s3.secret_key": [cfg.s3.secret_key],
               **{f"s3.roles.{r}.secret_key": [k.secret_key] for r, k in cfg.s3.roles.items()}}
    assert len(secrets) >= 4 and all(v and all(len(s) >= 16 for s in v) for v in secrets.values()), secrets

    # mc started by this process (the farm makes the role users from a thread of it): what the
    # change is about, so the sampler must have caught it.
    mine = [argv for _, ppid, argv in sampler.seen if ppid == os.getpid()]
    mc = [argv for argv in mine if os.path.basename(argv.split(b"\0", 1)[0]) == b"mc"]
    assert mc, f"the sampler saw no mc process in {sampler.sweeps} sweeps (of {len(mine)} children)"
    assert any(b"minio" in argv and b"server" in argv for _, _, argv in sampler.seen)

    leaks = [(what, argv.replace(b"\0", b" ").decode(errors="replace"))
             for what, values in secrets.items() for value in values
             for _, _, argv in sampler.seen if value.encode() in argv]
    assert not leaks, f"secrets on command lines (readable by any local user with ps): {leaks}"
