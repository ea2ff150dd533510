"""The lab's systemd units and crontab (docker/systemd/): every unit passes `systemd-analyze
verify` with nothing to say (the check itself is shown to catch a broken unit), the worker
template instantiates per role, and the crontab line cannot start a second nightly while one
runs (its flock, run for real, with a stand-in for nightly.bash that records its starts)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "docker" / "systemd"


def _installed(tmp_path: Path) -> Path:
    """The units as `make` would install them for this checkout: /opt/gearfarm is this tree."""
    out = tmp_path / "units"
    out.mkdir()
    env = tmp_path / "gearfarm.env"
    env.write_text((UNITS / "gearfarm.env").read_text())
    for unit in sorted(UNITS.glob("*.service")) + sorted(UNITS.glob("*.timer")):
        text = unit.read_text().replace("/opt/gearfarm", str(ROOT)).replace("/etc/gearfarm/gearfarm.env", str(env))
        (out / unit.name).write_text(text)
    # The template, as the instances a lab host runs.
    for slot in ("build-test.1", "build-test.2", "perf.1"):
        shutil.copy(out / "gearfarm-worker@.service", out / f"gearfarm-worker@{slot}.service")
    (out / "gearfarm-worker@.service").unlink()
    return out


def _verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, paths)], capture_output=True, text=True,
                          timeout=120, cwd=paths[0].parent)


def test_every_unit_verifies_with_nothing_to_say(tmp_path: Path) -> None:
    units = _installed(tmp_path)
    paths = sorted(units.iterdir())
    assert {p.name for p in paths} >= {"gearfarm-gearmand.service", "gearfarm-stunnel.service",
                                       "gearfarm-collector.service", "gearfarm-web.service",
                                       "gearfarm-nightly.service", "gearfarm-nightly.timer",
                                       "gearfarm-prune.service", "gearfarm-prune.timer",
                                       "gearfarm-worker@build-test.1.service"}
    got = _verify(paths)
    assert got.returncode == 0 and got.stdout == "" and got.stderr == "", got.stdout + got.stderr
    for p in paths:
        text = p.read_text()
        if p.suffix == ".service" and "Type=oneshot" not in text:
            assert "Restart=on-failure" in text, p.name
        if p.suffix == ".service":
            assert "TimeoutStopSec=" in text, p.name
    worker = (units / "gearfarm-worker@perf.1.service").read_text()
    assert "KillMode=control-group" in worker and "EnvironmentFile=" in worker and "--role %i" in worker

    # The check can fail: a misspelt setting and a missing program are both reported.
    bad = units / "gearfarm-web.service"
    bad.write_text(bad.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    assert "sometimes" in _verify([bad]).stderr
    bad.write_text(bad.read_text().replace(f"{ROOT}/.venv/bin/gearfarm", "/nonexistent/gearfarm"))
    assert _verify([bad]).returncode != 0


def test_the_crontab_line_cannot_start_a_second_nightly_while_one_runs(tmp_path: Path) -> None:
    lines = [ln for ln in (UNITS / "crontab").read_text().splitlines() if ln and not ln.startswith("#")]
    (line,) = [ln for ln in lines if ln.endswith("/nightly.bash")]
    # The daily prune waits for the same lock (no --nonblock): it never runs beside a nightly.
    (prune,) = [shlex.split(ln.split(None, 5)[5]) for ln in lines if ln.endswith("store prune")]
    assert prune[1:3] == ["/usr/bin/flock", "/run/lock/gearfarm-nightly.lock"]
    fields = line.split(None, 5)
    assert fields[:5] == ["0", "2", "*", "*", "*"]
    argv = shlex.split(fields[5])
    assert argv[0].startswith("GEARFARM_CONFIG=") and argv[1:3] == ["/usr/bin/flock", "--nonblock"]
    # A stand-in for nightly.bash that records each start and takes a while, like a nightly.
    starts = tmp_path / "starts"
    stand_in = tmp_path / "nightly.bash"
    stand_in.write_text(f"#!/bin/sh\necho started >> {starts}\nsleep 3\n")
    stand_in.chmod(0o755)
    lock = tmp_path / "gearfarm-nightly.lock"
    cmd = [a.replace("/run/lock/gearfarm-nightly.lock", str(lock)).replace("/opt/gearfarm/nightly.bash", str(stand_in))
           for a in argv[1:]]
    first = subprocess.Popen(cmd)
    deadline = time.monotonic() + 10
    while not starts.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = subprocess.run(cmd, timeout=10)
    assert second.returncode == 1  # flock --nonblock: the lock is held, nothing started
    assert first.wait(10) == 0
    assert starts.read_text().splitlines() == ["started"]
    assert subprocess.run(cmd, timeout=10).returncode == 0  # and the next night starts again
    assert starts.read_text().splitlines() == ["started", "started"]


def test_a_workers_slot_number_names_the_unit_and_nothing_else(tmp_path: Path) -> None:
    from tests.farmkit import gearfarm

    config = tmp_path / "farm.toml"
    config.write_text('[farm]\nstate_dir = "state"\n')
    p = gearfarm("worker", "--role", "bogus.1", "--config", str(config), timeout=60)
    assert p.returncode == 2 and "--role 'bogus.1': give build, test, perf or collector" in p.stderr
    p = gearfarm("worker", "--role", "build,test.x", "--config", str(config), timeout=60)
    assert p.returncode == 2  # only a trailing .N is a slot number


def test_the_gearmand_units_command_line_runs_a_job_server(tmp_path: Path) -> None:
    from gearfarm.gearman import admin
    from gearfarm.hosts import process
    from gearfarm.hosts.net import free_port

    text = (UNITS / "gearfarm-gearmand.service").read_text().replace("\\\n", " ")
    (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    port = free_port()
    argv = [a.replace("--port=4730", f"--port={port}").replace("/var/lib/gearfarm/gearmand", str(tmp_path))
            for a in shlex.split(exec_line.removeprefix("ExecStart="))]
    assert argv[0] == "/usr/sbin/gearmand" and f"--libsqlite3-db={tmp_path}/queue.db" in argv
    proc = process.spawn(argv, tmp_path / "gearmand.log")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert admin.status("127.0.0.1", port) == {}  # a job server, with nothing queued yet
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gearmand.log").read_text()
                time.sleep(0.1)
        assert (tmp_path / "queue.db").exists()  # the persistent queue the unit asks for
    finally:
        process.stop(proc, timeout=5)
