"""The lab's systemd units and crontab (docker/systemd/): every unit passes `systemd-analyze
verify` with nothing to say (the check itself is shown to catch a broken unit), every
long-running unit is confined to an exposure of at most 4.0 in `systemd-analyze security` (a
worker slot 4.1: its cgroup is delegated to it for its jobs' limits), the
worker template instantiates per role, and the crontab line cannot start a second nightly while
one runs (its flock, run for real, with a stand-in for nightly.bash that records its starts).
The timers agree with the crontab and the nightly's timeout with the example config's deadline;
no doc names another install path than /opt/gearfarm.

Then the units as docs/lab.md installs them run a farm under a real systemd (PID 1 of a podman
container, tests/farm/unitlab.py): gearmand behind stunnel, the collector, the dashboard and two
worker slots, confined as the units say, serve a nightly of a small project on three targets."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.farm import unitlab

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "docker" / "systemd"
# The units that run all the time (the nightly and the prune are oneshot, started by timers).
LONG_RUNNING = ("gearfarm-gearmand.service", "gearfarm-stunnel.service", "gearfarm-collector.service",
                "gearfarm-web.service", "gearfarm-worker@build-test.1.service")
# The most exposure each may have: 4.0, but a worker slot's cgroup is delegated to it (Delegate=,
# and so no ProtectControlGroups=, which would make it read-only on systemd 252), where it makes
# its jobs' cgroups: their process, memory and CPU limits (gearfarm/hosts/cgroup.py) cost 0.2.
MOST = {name: 4.1 if name.startswith("gearfarm-worker@") else 4.0 for name in LONG_RUNNING}


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
    (pre_line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStartPre=")]
    (exec_line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    port = free_port()
    pre, argv = ([a.replace("--port=4730", f"--port={port}").replace("/var/lib/gearfarm/gearmand", str(tmp_path))
                  for a in shlex.split(line.split("=", 1)[1])] for line in (pre_line, exec_line))
    assert argv[0] == "/usr/sbin/gearmand" and f"--libsqlite3-db={tmp_path}/queue.db" in argv
    # First the queue in WAL mode (gearfarm.hosts.gearmand.write_ahead: the same, for the unit).
    assert subprocess.run(pre, capture_output=True, text=True, check=True).stdout.strip() == "wal"
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
        with contextlib.closing(sqlite3.connect(tmp_path / "queue.db")) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # kept in the file
    finally:
        process.stop(proc, timeout=5)


# ------------------------------------------------------------------ confinement, times, paths

EXPOSURE = re.compile(r"Overall exposure level for (\S+): (\d+\.\d+) ")


def _exposure(unit: Path) -> float:
    got = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
                         capture_output=True, text=True, timeout=120, cwd=unit.parent)
    found = EXPOSURE.search(got.stdout)
    assert found and found.group(1) == unit.name, got.stdout + got.stderr
    return float(found.group(2))


def test_every_long_running_unit_is_confined_to_an_exposure_of_at_most_4(tmp_path: Path) -> None:
    units = _installed(tmp_path)
    rated = {name: _exposure(units / name) for name in LONG_RUNNING}
    assert all(exposure <= MOST[name] for name, exposure in rated.items()), rated
    # The figures the units' comments and docs/lab.md's table quote are these.
    table = dict(re.findall(r"^\| `(gearfarm-[a-z@]+)` \| (\d\.\d) \|", (ROOT / "docs" / "lab.md").read_text(), re.M))
    for name, exposure in rated.items():
        template = re.sub(r"@.*\.service$", "@.service", name)
        assert f"systemd-analyze security: {exposure:.1f} " in (UNITS / template).read_text(), name
        assert table[template.removesuffix(".service")] == f"{exposure:.1f}", name
    # The oneshot units are confined too.
    for name in ("gearfarm-nightly.service", "gearfarm-prune.service"):
        assert _exposure(units / name) <= 4.0, name
    # The check can fail: a unit without its confinement (all from its "# Confinement" comment on,
    # as the units were before) is exposed.
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("gearfarm-web.service", "gearfarm-worker@build-test.1.service"):
        head, found, _ = (units / name).read_text().partition("\n# Confinement")
        assert found, name
        (bare / name).write_text(head + "\n\n[Install]\nWantedBy=multi-user.target\n")
        assert _exposure(bare / name) > 4.0, name


def _cron_time(line: str) -> str:
    minute, hour = line.split()[:2]
    return f"{int(hour):02d}:{int(minute):02d}:00"


def _on_calendar(timer: Path) -> str:
    (line,) = [ln for ln in timer.read_text().splitlines() if ln.startswith("OnCalendar=")]
    day, time_of_day = line.removeprefix("OnCalendar=").split()
    assert day == "*-*-*", line  # daily, as the crontab's lines
    return time_of_day


def test_the_timers_run_when_the_crontab_does_and_the_prune_after_the_nightly() -> None:
    lines = [ln for ln in (UNITS / "crontab").read_text().splitlines() if ln and not ln.startswith("#")]
    (nightly,) = [ln for ln in lines if ln.endswith("/nightly.bash")]
    (prune,) = [ln for ln in lines if ln.endswith("store prune")]
    assert _on_calendar(UNITS / "gearfarm-nightly.timer") == _cron_time(nightly) == "02:00:00"
    assert _on_calendar(UNITS / "gearfarm-prune.timer") == _cron_time(prune) == "12:30:00"
    # After the nightly, and when a nightly still runs, after it: the prune unit waits for its lock.
    unit = (UNITS / "gearfarm-prune.service").read_text()
    lock = "/usr/bin/flock /run/lock/gearfarm-nightly.lock "
    assert f"ExecStart={lock}" in unit and f"ExecStart=/usr/bin/flock --nonblock {lock.split()[-1]}" in (
        UNITS / "gearfarm-nightly.service").read_text()
    for text in ((UNITS / "gearfarm-prune.timer").read_text(), (ROOT / "docs" / "lab.md").read_text()):
        assert "12:00" not in text and "12:30" in text


def test_one_install_path_everywhere() -> None:
    """gearfarm is installed in /opt/gearfarm: the units, the crontab and every doc say so, and
    nothing names /srv/gearfarm."""
    texts = {p: p.read_text() for base in ("docs", "docker") for p in (ROOT / base).rglob("*")
             if p.is_file() and p.suffix in ("", ".md", ".toml", ".service", ".timer", ".env", ".yaml", ".conf")}
    texts.update({p: p.read_text() for p in (ROOT / "README.md", ROOT / "Makefile", ROOT / "nightly.bash")})
    assert [str(p.relative_to(ROOT)) for p, text in texts.items() if "/srv/gearfarm" in text] == []
    for p in [*UNITS.glob("gearfarm-*.service"), UNITS / "crontab"]:
        if "gearfarm-gearmand" in p.name or "gearfarm-stunnel" in p.name:
            continue  # Debian's gearmand and stunnel: nothing of gearfarm's checkout
        assert "/opt/gearfarm/" in p.read_text(), p.name
    assert "`/opt/gearfarm`" in (ROOT / "docs" / "lab.md").read_text()


def _seconds(span: str) -> float:
    """A systemd time span ("11h", "1h 30min") in seconds, as systemd reads it."""
    out = subprocess.run(["systemd-analyze", "timespan", span], capture_output=True, text=True, timeout=30)
    (micro,) = [ln.split(":", 1)[1] for ln in out.stdout.splitlines() if ln.strip().startswith("μs:")]
    return int(micro) / 1e6


def test_the_nightly_units_timeout_covers_the_example_configs_deadline() -> None:
    """The nightly's unit must not kill a nightly the config lets run: its runs end by [farm]
    run_deadline, then it bisects within [bisect] hours; setup and the reports get half an hour
    at least. And it ends before the next night's timer."""
    from gearfarm import config as config_mod

    cfg = config_mod.load(ROOT / "docs" / "farm.example.toml")
    (line,) = [ln for ln in (UNITS / "gearfarm-nightly.service").read_text().splitlines()
               if ln.startswith("TimeoutStartSec=")]
    timeout = _seconds(line.removeprefix("TimeoutStartSec="))
    needed = cfg.farm.run_deadline + (cfg.bisect.hours * 3600 if cfg.bisect.auto else 0) + 1800
    assert cfg.farm.run_deadline == 6 * 3600  # the figure the unit's comment and docs/lab.md quote
    assert needed <= timeout < 24 * 3600, (needed, timeout)


# ------------------------------------------------------------------ under a real systemd

PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF",
                                                              str(ROOT / "docker" / "containers.conf"))}


def _podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    got = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=PODMAN_ENV)
    assert got.returncode == 0 or not check, f"podman {' '.join(args[:3])}: {got.stdout}{got.stderr}"
    return got


def _install_steps() -> tuple[list[str], list[str]]:
    """docs/lab.md's install commands (without sudo) and the units its enable lines start."""
    section = (ROOT / "docs" / "lab.md").read_text().split("## systemd and cron", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/lab.md's systemd section: expected the install block and the enable block"
    install = [ln.removeprefix("sudo ") for ln in blocks[0].replace("\\\n", " ").splitlines()
               if ln.strip() and not ln.startswith("#")]
    units = []
    for ln in blocks[1].replace("\\\n", " ").splitlines():
        argv = shlex.split(ln, comments=True)
        assert argv[:4] == ["sudo", "systemctl", "enable", "--now"], ln
        units += argv[4:]
    return install, units


@pytest.mark.slow
def test_the_installed_units_run_a_farm_under_a_real_systemd(tmp_path: Path) -> None:
    from gearfarm.s3.minio import find_binary

    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (make setup installs podman and runc)")
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    if _podman("image", "exists", unitlab.BASE_IMAGE, check=False).returncode != 0:
        made = subprocess.run(["make", "-s", "images"], cwd=ROOT, env=PODMAN_ENV, capture_output=True, text=True)
        assert made.returncode == 0, made.stderr[-3000:]
    _podman("build", "-q", "--format", "docker", "--network", "host", "-t", unitlab.IMAGE,
            str(unitlab.build_context(tmp_path / "image")), timeout=900)
    timings["image"] = time.monotonic() - t0
    share = tmp_path / "share"
    rev = unitlab.make_repo(share / "hello")
    install, units = _install_steps()
    services = [u for u in units if not u.endswith(".timer")]  # the timers would start the nightly at 02:00
    workers = [u for u in services if u.startswith("gearfarm-worker@")]
    assert {"gearfarm-gearmand", "gearfarm-stunnel", "gearfarm-collector", "gearfarm-web"} <= set(services)
    assert len(workers) == 2

    name = f"gearfarm-systemd-{os.getpid()}-{secrets.token_hex(3)}"
    # systemd as PID 1, its own network namespace (loopback only: no port of this machine is
    # used), and what a worker container needs for bubblewrap (docs/lab.md, "Images").
    _podman("run", "-d", "--name", name, "--systemd=always", "--network", "none", "--no-healthcheck",
            "--cap-add", "SYS_ADMIN", "--security-opt", "unmask=ALL",
            "-v", f"{ROOT}:/src:ro", "-v", f"{share}:/test:ro",
            "-v", f"{Path(find_binary('minio')).resolve()}:/usr/local/bin/minio:ro", unitlab.IMAGE)

    def sh(command: str, timeout: float = 120, check: bool = True, user: str = "root") -> str:
        got = _podman("exec", "-u", user, "-w", "/src", name, "sh", "-c", command, timeout=timeout, check=False)
        assert got.returncode == 0 or not check, f"{command}: exit {got.returncode}\n{got.stdout}{got.stderr}"
        return got.stdout

    def py(code: str) -> str:
        return sh(f"/opt/gearfarm/.venv/bin/python -c {shlex.quote(code)}")

    try:
        deadline = time.monotonic() + 120
        # Before systemd listens systemctl prints nothing, and before it has made
        # /run/systemd/system it prints "offline" (sd_booted() is false): both mean "not yet".
        while (state := sh("systemctl is-system-running --wait", check=False).strip()) in ("", "offline"):
            assert time.monotonic() < deadline, f"systemd did not come up in the container ({state!r})"
            time.sleep(0.5)
        assert state in ("running", "degraded"), state + sh("systemctl --failed --no-pager", check=False)
        timings["systemd up"] = time.monotonic() - t0
        for step in install:
            sh(step)
        sh("/opt/gearfarm/.venv/bin/python -m tests.farm.unitlab setup /test/hello", timeout=300)
        t1 = time.monotonic()
        sh("systemctl enable --now " + " ".join(services), timeout=300)

        # Two worker slots register every function of the three targets with the job server
        # (through stunnel, with the host's certificate); the collector its own.
        wanted = {f"{role}:{target}" for role in ("build", "test") for target in unitlab.TARGETS}
        # gearmand's unit is Type=simple: started is not yet listening (refused: none registered).
        status = "from gearfarm.gearman import admin; import json\ntry: s = {k: v.workers for k, v in " \
                 "admin.status('127.0.0.1', 4730).items()}\nexcept OSError: s = {}\nprint(json.dumps(s))"
        deadline = time.monotonic() + 300
        while True:
            registered = json.loads(py(status))
            if all(registered.get(f, 0) == len(workers) for f in wanted) and registered.get("collect", 0) >= 1:
                break
            assert time.monotonic() < deadline, (registered, sh("journalctl --no-pager -n 80", check=False))
            time.sleep(2)
        timings["workers registered"] = time.monotonic() - t1
        healthz = "import urllib.request\ntry: print(urllib.request.urlopen('http://127.0.0.1:8631/healthz')" \
                  ".status)\nexcept OSError as e: print(e)"
        while (answer := py(healthz).strip()) != "200":
            assert time.monotonic() < deadline, answer + sh("journalctl -u gearfarm-web --no-pager", check=False)
            time.sleep(1)
        timings["dashboard answers"] = time.monotonic() - t1

        # Each runs confined as its unit says: no new privileges, a system call filter, and the
        # capabilities of its bounding set (none but the workers' seven: CHOWN 0, DAC_OVERRIDE 1,
        # FOWNER 3, KILL 5, SETGID 6, SETUID 7, SYS_ADMIN 21).
        worker_caps = sum(1 << n for n in (0, 1, 3, 5, 6, 7, 21))
        for unit in services:
            pid = sh(f"systemctl show -p MainPID --value {unit}").strip()
            fields = dict(ln.split(":", 1) for ln in sh(f"cat /proc/{pid}/status").splitlines() if ":" in ln)
            assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2", unit
            assert int(fields["CapBnd"], 16) == (worker_caps if unit in workers else 0), unit

        # A nightly of the project on its three targets: built and tested by the confined workers
        # (bubblewrap inside them; linux-i686 natively, linux-aarch64 under qemu), its results
        # through the collector, its run on the dashboard.
        t2 = time.monotonic()
        out = sh("HOME=/var/lib/gearfarm /opt/gearfarm/.venv/bin/gearfarm nightly --config /etc/gearfarm/farm.toml "
                 "--run-id systemd-1", timeout=900, user="gearfarm")
        timings["nightly"] = time.monotonic() - t2
        (tmp_path / "nightly.txt").write_text(out)
        for target in unitlab.TARGETS:
            assert re.search(rf"^{target} +[0-9.]+s build=passed test-hello=passed$", out, re.M), out
        page = py("import urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8631/run/systemd-1'); "
                  "print(r.status, 'linux-aarch64' in r.read().decode())")
        assert page.split() == ["200", "True"], page
        assert rev[:12] in out, out
        # Each slot ran its jobs as a uid of its own, and said at its start whether its jobs run in
        # cgroups of their own, under its unit's delegated group (docs/security.md, "Limits per
        # job"): in this container on a cgroup v1 host, podman mounts the controllers read-only,
        # so each says they do not, and why.
        said = sh("journalctl --no-pager -o cat -u 'gearfarm-worker@*'", check=False)
        (tmp_path / "workers.txt").write_text(said)
        assert len(set(re.findall(r"this slot runs its jobs as uid (\d+)", said))) == len(workers), said[-3000:]
        starts = re.findall(r"each job command runs in a cgroup \(v|jobs run without process, memory and CPU limits: "
                            r"cannot make job cgroups under /sys/fs/cgroup/\S+ \(Read-only file system\)", said)
        assert len(starts) == len(workers), said[-3000:]

        # Nothing was restarted, and every unit stops cleanly.
        for unit in services:
            assert sh(f"systemctl show -p NRestarts --value {unit}").strip() == "0", unit
        t3 = time.monotonic()
        sh("systemctl stop " + " ".join(services), timeout=120)
        timings["stop"] = time.monotonic() - t3
        states = dict(zip(services, sh("systemctl is-active " + " ".join(services), check=False).split(),
                          strict=False))
        assert list(states.values()) == ["inactive"] * len(services), str(states) + "".join(
            f"\n--- {u}\n" + sh(f"systemctl show -p Result,ExecMainCode,ExecMainStatus {u}; "
                                f"journalctl -u {u} --no-pager -n 60", check=False)
            for u, state in states.items() if state != "inactive")
    finally:
        journal = _podman("exec", name, "journalctl", "--no-pager", "-o", "short-monotonic", check=False, timeout=60)
        (tmp_path / "journal.txt").write_text(journal.stdout + journal.stderr)
        _podman("rm", "-f", "-t", "0", name, check=False, timeout=120)
    timings["total"] = time.monotonic() - t0
    print(", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
