"""A hostile project stays in its box (issue #32). Real gearmand, MinIO, workers, dashboard and a
PostgreSQL beside them: one nightly of projects whose build and suites try what an attacker who
can push a commit would try. Each attack is its own test:

* the catalog names host paths for the sandbox to open (WINEPREFIX, HOME, an absolute results
  file): refused, naming the key;
* the suites read the farm's config, database, other jobs' directories, /proc of every process,
  connect to gearmand, MinIO, PostgreSQL, the dashboard and a listener of the test's own on
  loopback, write everywhere they can name, and leave a daemon behind;
* a suite makes its JUnit file a link to the farm's config; a build's output is a link to it;
* the job's processes are another uid than the worker's, seen from the host.

After the run, every secret value of the farm's config is searched for in every S3 object
(archives unpacked), every log and JUnit file on disk and every dashboard page and API answer,
and the whole file system is searched for what the jobs tried to write outside their
directories: nothing of either is found."""

from __future__ import annotations

import io
import os
import re
import shlex
import socket
import subprocess
import tarfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zstandard

from gearfarm import config as config_mod
from gearfarm.config import Config, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.catalog import CatalogError
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import carried_files, commit, gearfarm, key_secrets, keyed, start_web
from tests.pg import PostgresServer
from tests.projects import _init

PLANTED = "planted-worker-env-secret-7c41"
# In every name the jobs try to write and in their daemons' names: this run's own, so the file
# system scan finds what this run's jobs wrote, never what another run (or other work) left.
MARKER = f"gfhostile{uuid.uuid4().hex[:12]}"
TARGET = "linux-x86_64"

HOSTILE = """schema = 2

[build]
argv = ["sh", "attack.sh", "build"]
outputs = ["attack.sh", "built.txt"]
timeout = 120

[suites.escape]
argv = ["sh", "{root}/attack.sh", "suite"]
format = "tap"
timeout = 120

[suites.junit-link]
argv = ["sh", "{root}/attack.sh", "junit", "{junit}"]
timeout = 60

[targets.linux-x86_64]
tools = ["sh"]
suites = ["escape", "junit-link"]
"""

LEAKY = """schema = 2

[build]
argv = ["sh", "-c", "mkdir -p out && ln -sf CONFIG out/leak && ln -sf /etc/shadow out/shadow && echo x > out/ok"]
outputs = ["out"]
timeout = 60

[targets.linux-x86_64]
tools = ["sh"]
suites = []
"""


# The same attacks from a program of the project's own, on every kind of target: natively, under
# qemu and under wine (whose Z: drive is the sandbox's /). Its arguments: files it must not read,
# then files it must not write (for wine also a file of the prefix every job's is linked from).
CROSS_C = r"""#include <stdio.h>
static int can_read(const char *p) { FILE *f = fopen(p, "rb"); char b[64]; size_t k = 0;
    if (f) { k = fread(b, 1, sizeof b, f); fclose(f); } if (k) fwrite(b, 1, k, stdout); return k > 0; }
static int can_write(const char *p) { FILE *f = fopen(p, "ab"); if (!f) return 0;
    int ok = fputs("x", f) >= 0; return fclose(f) == 0 && ok; }
int main(int argc, char **argv) {
    /* Reads are judged here; writes by the test on the host (a path can exist on the sandbox's
       own /tmp, where a write harms nothing), so they are only reported. */
    printf("1..2\n");
    for (int i = 1; i < argc; i++) {
        if (i <= 2) printf("%sok %d - %s %s\n", can_read(argv[i]) ? "not " : "", i, "read", argv[i]);
        else printf("# write %s: %s\n", argv[i], can_write(argv[i]) ? "done" : "refused");
    }
    return 0;
}
"""

CROSS = """schema = 2

[build]
argv = ["{cc}", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-static", "-o", "atk{exe}", "atk.c"]
outputs = ["atk{exe}"]
timeout = 120

[suites.cross]
argv = ["{root}/atk{exe}", "{z}CONFIG", "{z}/etc/shadow", "{z}STATE/MARKER-cross-{target}", "{z}/var/tmp/MARKER-cross",
        "{sys}"]
format = "tap"
timeout = 120

[targets.linux-x86_64]
tools = ["gcc"]
vars = { cc = "gcc", z = "", sys = "/etc/MARKER-cross" }
suites = ["cross"]

[targets.linux-aarch64]
tools = ["aarch64-linux-gnu-gcc"]
vars = { cc = "aarch64-linux-gnu-gcc", z = "", sys = "/etc/MARKER-cross" }
runner = ["qemu-aarch64"]
suites = ["cross"]

[targets.windows-x86_64]
exe = ".exe"
tools = ["x86_64-w64-mingw32-gcc"]
vars = { cc = "x86_64-w64-mingw32-gcc", z = "Z:", sys = "C:/windows/system32/kernel32.dll" }
runner = ["wine"]
runner_env = { WINEDEBUG = "-all" }
suites = ["cross"]
"""
CROSS_TARGETS = ("linux-x86_64", "linux-aarch64", "windows-x86_64")


def attack_script(state: Path, config: Path, ports: dict[str, int]) -> str:
    """Each read or connect prints what it got and a TAP line that passes only when it failed."""
    q = shlex.quote
    attempts = {
        "read the farm config": f"cat {q(str(config))}",
        "read the results database": f"head -c 100 {q(str(state / 'results.db'))}",
        # The job's own directories are mounted at their paths, so their parents exist in the
        # sandbox as empty mount points; what lies beside them on the host must not.
        "list the state directory": f"ls {q(str(state / 'minio'))} {q(str(state / 'logs'))}",
        "read the worker's log beside the job": 'cat "$HOME/../test.log"',
        # Other jobs run beside this one (two slots); their directories hold logs on the host.
        "see other jobs' files": f'find {q(str(state / "work"))} -type f -not -path "$(dirname "$HOME")/*" | grep .',
        "read the environ of every process": f"cat /proc/[0-9]*/environ | tr '\\0' '\\n' | grep -a {PLANTED[:12]}",
        # Bracketed patterns: the pipeline's own command lines, which /proc lists too, hold the
        # patterns' text but do not match them.
        "read the cmdline of the farm's processes":
            "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -a -e 'gearfarm[.]cli' -e 'gearman[d]' -e 'minio[ ]server'",
        "read root's home": "ls /root",
        "read /etc/shadow": "cat /etc/shadow",
        **{f"reach {name} on loopback": f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'"
           for name, port in ports.items()},
    }
    writes = [state / f"{MARKER}-state", state / "work" / f"{MARKER}-work", Path("/var/tmp") / f"{MARKER}-vartmp",
              Path("/root") / f"{MARKER}-root", Path("/etc") / f"{MARKER}-etc", config.parent / f"{MARKER}-cfgdir"]
    lines = ["#!/bin/sh", f"echo 1..{len(attempts)}", "n=0"]
    for name, cmd in attempts.items():
        lines += ["n=$((n+1))", f'echo "== {name}"',
                  f'if ( {cmd} ) 2>&1; then echo "not ok $n - could {name}"; '
                  f'else echo "ok $n - cannot {name}"; fi']
    lines += ['echo "== writes"', *(f"touch {q(str(w))} 2>&1" for w in writes),
              f'touch "$HOME/../{MARKER}-homeparent" "$PWD/../{MARKER}-cwdparent" 2>&1',
              # A daemon, and a process the test looks at from the host while it runs.
              f'cp /bin/sleep "$HOME/{MARKER}-daemon" && setsid "$HOME/{MARKER}-daemon" 600 >/dev/null 2>&1 &',
              f'cp /bin/sleep "$HOME/{MARKER}-uid" && "$HOME/{MARKER}-uid" 3',
              "exit 0"]
    body = "\n".join(lines)
    return f"""#!/bin/sh
case "$1" in
  build) echo built > built.txt; exit 0 ;;
  junit) ln -s {q(str(config))} "$2"; exit 0 ;;
esac
{body}
"""


@dataclass
class Hostile:
    state: Path
    config: Path
    cfg: Config
    secrets: list[str]
    code: int
    output: str
    widen_code: int
    widen_output: str
    web: str
    uids: set[int] = field(default_factory=set)
    accepted: list[int] = field(default_factory=list)


def _listener(accepted: list[int], stop: threading.Event) -> int:
    """A loopback service of the test's own: every connection it accepts is counted."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(1)
            conn.close()
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def _watch_uids(uids: set[int], stop: threading.Event) -> None:
    """The real uid of the job's probe process, seen from the host while it runs."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f"{MARKER}-uid".encode() not in f.read():
                        continue
                with open(f"/proc/{pid}/status") as f:
                    uids.add(int(next(line for line in f if line.startswith("Uid:")).split()[1]))
            except (OSError, StopIteration):
                pass
        time.sleep(0.05)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    base = tmp_path_factory.mktemp("hostile")
    state = base / "state"
    repos = {name: base / name for name in ("hostile", "leaky", "widen", "cross")}
    (base / "no-repo").mkdir()
    farm = EmbeddedFarm(state, base / "no-repo", worker_env={"AWS_SECRET_ACCESS_KEY": PLANTED}, slots=2,
                        projects=[ProjectConfig(name=n, repo=str(r)) for n, r in repos.items()])
    for repo in repos.values():
        repo.mkdir()
        _init(repo, {"jobs/catalog.toml": HOSTILE, "attack.sh": "exit 0\n"})
    pg = PostgresServer().start()
    stop = threading.Event()
    accepted: list[int] = []
    uids: set[int] = set()
    web = None
    try:
        cross = CROSS.replace("CONFIG", str(farm.config_path)).replace("STATE", str(state)).replace("MARKER", MARKER)
        cfg = farm.start([catalog_mod.parse(HOSTILE, "hostile"), catalog_mod.parse(cross, "cross")])
        assert farm.gearmand is not None
        web, url = start_web(farm.config_path, base / "web.log")
        ports = {"gearmand": farm.gearmand.address[1], "MinIO": int(cfg.s3.endpoint.rsplit(":", 1)[1]),
                 "PostgreSQL": int(pg.port or 0), "the dashboard": int(url.rsplit(":", 1)[1]),
                 "a listener": _listener(accepted, stop)}
        (repos["hostile"] / "attack.sh").write_text(attack_script(state, farm.config_path, ports))
        commit(repos["hostile"], "attack")
        (repos["leaky"] / "jobs/catalog.toml").write_text(LEAKY.replace("CONFIG", str(farm.config_path)))
        commit(repos["leaky"], "leak")
        # The same attacks, with the state directory as the wine prefix: before the catalog rule,
        # the sandbox mounted it writable and the suite read the config from it.
        (repos["widen"] / "attack.sh").write_text(attack_script(state, farm.config_path, ports))
        (repos["widen"] / "jobs/catalog.toml").write_text(HOSTILE.replace(
            'format = "tap"', f'format = "tap"\nenv = {{ WINEPREFIX = "{state}" }}'))
        commit(repos["widen"], "widen")
        _init_files(repos["cross"], {"jobs/catalog.toml": cross, "atk.c": CROSS_C})
        commit(repos["cross"], "attack from a program of its own, on every target")
        watcher = threading.Thread(target=_watch_uids, args=(uids, stop), daemon=True)
        watcher.start()
        p = gearfarm("nightly", "--config", str(farm.config_path), "--project", "hostile,leaky,cross",
                     "--benchmarks", "none", timeout=600)
        w = gearfarm("nightly", "--config", str(farm.config_path), "--project", "widen", "--benchmarks", "none",
                     timeout=300)
        loaded = config_mod.load(farm.config_path)
        secrets = [*key_secrets(loaded), loaded.s3.secret_key, PLANTED,
                   *(k.secret_key for k in loaded.s3.roles.values())]
        yield Hostile(state, farm.config_path, loaded, secrets, p.returncode, p.stdout + p.stderr, w.returncode,
                      w.stdout + w.stderr, url, uids, accepted)
    finally:
        stop.set()
        if web is not None:
            from gearfarm.hosts import process

            process.stop(web, timeout=5)
        farm.stop()
        pg.stop()
        subprocess.run(["pkill", "-KILL", "-f", f"{MARKER}-daemon"], check=False)


def _init_files(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).write_text(text)


def _run_dir(h: Hostile, project: str) -> Path:
    return next(d for d in (h.state / "runs").iterdir()
                if d.is_dir() and f"-{project}-" in d.name and not d.name.endswith(".rerun"))


def _log(h: Hostile, project: str, step: str) -> str:
    return (_run_dir(h, project) / "logs" / TARGET / step / "log.txt").read_text()


# -------------------------------------------------------------------- the catalog cannot widen it

@pytest.mark.parametrize("where", ["build", "suites.escape", "targets.linux-x86_64", "runner_env"])
@pytest.mark.parametrize("name", ["WINEPREFIX", "HOME", "TMPDIR", "GEARFARM_RUNNER"])
def test_a_catalog_naming_what_the_worker_sets_is_refused(where: str, name: str) -> None:
    text = HOSTILE.replace("timeout = 120\n", f'timeout = 120\nenv = {{ {name} = "/etc/gearfarm" }}\n', 1) \
        if where == "build" else HOSTILE
    if where == "suites.escape":
        text = HOSTILE.replace('format = "tap"', f'format = "tap"\nenv = {{ {name} = "/etc/gearfarm" }}')
    elif where.startswith("targets"):
        text = HOSTILE.replace('tools = ["sh"]', f'tools = ["sh"]\nenv = {{ {name} = "/etc/gearfarm" }}')
    elif where == "runner_env":
        text = HOSTILE.replace('tools = ["sh"]', f'tools = ["sh"]\nrunner_env = {{ {name} = "/etc/gearfarm" }}')
    with pytest.raises(CatalogError, match=rf"{name} is set by the worker.*remove it"):
        catalog_mod.parse(text, "hostile")


def test_an_absolute_results_or_metrics_file_is_refused() -> None:
    with pytest.raises(CatalogError, match=r"\[suites.escape\] results '/etc/gearfarm/farm.toml' names a path outside"):
        catalog_mod.parse(HOSTILE.replace('format = "tap"', 'format = "junit"\nresults = "/etc/gearfarm/farm.toml"'),
                          "hostile")


def test_the_nightly_refuses_a_catalog_that_opens_the_state_directory(hostile: Hostile) -> None:
    # A bad catalog fails its project's night, the nightly's exit status 1 (docs/projects.md).
    assert hostile.widen_code == 1, hostile.widen_output
    assert "env.WINEPREFIX: WINEPREFIX is set by the worker" in hostile.widen_output


# ------------------------------------------------------------------------- what the jobs tried

def test_every_read_and_connection_of_the_suite_failed(hostile: Hostile) -> None:
    log = _log(hostile, "hostile", "test-escape")
    assert "not ok" not in log, log
    assert log.count("\nok ") == 14, log  # every attempt was made, and failed


@pytest.mark.parametrize("target", CROSS_TARGETS)
def test_the_same_attacks_fail_natively_under_qemu_and_under_wine(hostile: Hostile, target: str) -> None:
    log = (_run_dir(hostile, "cross") / "logs" / target / "test-cross" / "log.txt").read_text()
    assert "not ok" not in log, log
    assert log.count("\nok ") == 2 and log.count("# write ") == 3, log


def test_a_wine_job_cannot_change_the_prefix_later_jobs_are_made_from(hostile: Hostile) -> None:
    """The wine job appended to C:/windows/system32/kernel32.dll, a hard link to the template's:
    the template's file is still wine's own, byte for byte."""
    (template,) = (hostile.state / "wine").glob("template-*")
    dll = template / "drive_c/windows/system32/kernel32.dll"
    assert dll.stat().st_uid == os.getuid() and dll.stat().st_mode & 0o022 == 0
    assert dll.read_bytes() == Path("/usr/lib/x86_64-linux-gnu/wine/x86_64-windows/kernel32.dll").read_bytes()


def test_no_loopback_service_saw_a_connection(hostile: Hostile) -> None:
    assert hostile.accepted == []


def test_the_jobs_run_as_another_uid_than_the_worker(hostile: Hostile) -> None:
    assert hostile.uids, "the job's probe process was never seen"
    # Each slot's own uid, of the farm's range (tests/farm/test_job_limits.py: never two slots' one).
    first, count = hostile.cfg.farm.job_uid, hostile.cfg.farm.job_uids
    assert all(first <= uid < first + count for uid in hostile.uids) and 0 not in hostile.uids, hostile.uids


def test_the_worker_config_is_readable_by_the_worker_alone(hostile: Hostile) -> None:
    st = hostile.config.stat()
    assert st.st_mode & 0o077 == 0 and st.st_uid == os.getuid()
    assert hostile.state.stat().st_mode & 0o077 == 0
    # What an escaped job's uid gets: nothing.
    p = subprocess.run(["setpriv", f"--reuid={hostile.cfg.farm.job_uid}", f"--regid={hostile.cfg.farm.job_uid}",
                        "--clear-groups", "cat", str(hostile.config)], capture_output=True, text=True)
    assert p.returncode != 0 and "Permission denied" in p.stderr


def test_no_daemon_outlives_its_job(hostile: Hostile) -> None:
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f"{MARKER}-daemon".encode() in f.read():
                    left.append(pid)
        except OSError:
            pass
    assert left == []


def test_nothing_was_written_outside_the_jobs_directories(hostile: Hostile) -> None:
    """The sentinel scan: every name the jobs tried to write holds MARKER; the job directories are
    gone after their jobs, so whatever the file system still holds by that name got out."""
    found = subprocess.run(["find", "/", "-xdev", "-name", f"*{MARKER}*", "-not", "-path", "/proc/*"],
                           capture_output=True, text=True).stdout.split()
    assert found == []
    assert "== writes" in _log(hostile, "hostile", "test-escape")


def test_a_junit_file_linked_to_the_config_is_not_read_or_uploaded(hostile: Hostile) -> None:
    run = _run_dir(hostile, "hostile")
    assert not (run / "logs" / TARGET / "test-junit-link" / "junit.xml").exists()
    store = ArtifactStore(hostile.cfg.s3, retry_for=0)
    assert not [k for k in store.list(f"runs/{run.name}/") if k.endswith("test-junit-link/junit.xml")]
    assert not [k for k in carried_files(hostile.cfg.database.url) if k.endswith("test-junit-link/junit.xml")]
    log = _log(hostile, "hostile", "test-junit-link")
    assert "link leading outside the job's directories" in (run / "report.txt").read_text() + log


def test_a_build_output_linked_to_the_config_fails_the_build(hostile: Hostile) -> None:
    """The artifacts themselves are in the secret scan below; here: the build says why it failed."""
    text = (_run_dir(hostile, "leaky") / "report.txt").read_text()
    assert "out/leak" in text and "build" in text, text


# ---------------------------------------------------------------------------- no secret anywhere

def _unpacked_holds(blob: bytes, secrets: list[str]) -> bool:
    return any(s.encode() in b for b in _contents(blob) for s in secrets)


def _contents(blob: bytes) -> list[bytes]:
    """The object, and when it is an archive, every file in it."""
    out = [blob]
    raw = blob
    if blob[:4] == b"\x28\xb5\x2f\xfd":
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read()
        out.append(raw)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for m in tar:
                f = tar.extractfile(m) if m.isfile() else None
                if f is not None:
                    out.append(f.read())
    except tarfile.TarError:
        pass
    return out


def test_no_secret_reaches_the_store_the_disk_or_the_dashboard(hostile: Hostile) -> None:
    assert hostile.code in (0, 1), hostile.output
    secrets = hostile.secrets
    store = ArtifactStore(hostile.cfg.s3, retry_for=0)
    keys = list(store.list(""))
    carried = carried_files(hostile.cfg.database.url)  # the job files the records carried
    assert any(k.endswith(".tar.zst") for k in keys) and any("log.txt" in k for k in [*keys, *carried])
    for key in keys:
        assert not _unpacked_holds(store.get_bytes(key), secrets), key
    for name, data in carried.items():
        assert not any(s.encode() in data for s in secrets), name
    files = [p for p in (hostile.state / "runs").rglob("*") if p.is_file()]
    assert any(p.name == "log.txt" for p in files)
    for path in files:
        assert not any(s.encode() in path.read_bytes() for s in secrets), path
    pages = ["/", "/runs", "/live", "/regressions", "/perf", "/api/status", "/api/runs", "/api/live"]
    for run in (hostile.state / "runs").iterdir():
        if run.is_dir():
            pages += [f"/run/{run.name}", f"/api/run/{run.name}"]
            for log in run.glob("logs/*/*/*"):
                target, step = log.parent.parent.name, log.parent.name
                pages.append(f"/run/{run.name}/log/{target}/{step}?file={log.name}")
    for page in pages:
        try:
            body = urllib.request.urlopen(hostile.web + page, timeout=30).read()
        except urllib.error.HTTPError as e:
            body = e.read()
        assert not any(s.encode() in body for s in secrets), page
    assert re.search(r"secrets|secret_key", "\n".join(secrets)) is None  # the scan looked for values, not names


def test_a_worker_whose_config_every_user_can_read_refuses_to_start(tmp_path: Path) -> None:
    from gearfarm.step import sandbox
    from gearfarm.step.sandbox import SandboxError

    path = tmp_path / "farm.toml"
    config_mod.dump(Config(), path)
    path.chmod(0o644)
    with pytest.raises(SandboxError, match=rf"{path}: readable by every user.*chmod o-r {path}"):
        sandbox.for_config(config_mod.load(path))
    # The command says so in one line and exits 2: no traceback (a config with keys, so the
    # sandbox check is the one that speaks).
    keys = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'results.db'}")
    config_mod.dump(Config(farm=config_mod.FarmConfig(**keys)), path)  # type: ignore[arg-type]
    path.chmod(0o644)
    started = gearfarm("worker", "--role", "build", "--targets", "linux-x86_64", "--config", str(path), timeout=120)
    assert started.returncode == 2, started.stdout + started.stderr
    assert f"chmod o-r {path}" in started.stdout + started.stderr
    assert "Traceback" not in started.stdout + started.stderr
    path.chmod(0o640)  # a group of the farm's own users may read it; the job uid is in none
    assert sandbox.for_config(config_mod.load(path)).mode == "bwrap"
