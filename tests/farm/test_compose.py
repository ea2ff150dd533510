"""docker/compose.yaml (issue #36, part 7) read as its two readers read it: health checks and
restart policies on every service, depends_on that waits for health, no podman-only option, and
no variable that can go missing unsaid. Debian 12's podman-compose (1.0.3, which docker/lab.py
drives) has no `config` command, so its own code parses the file here and turns each service
into its `podman run` arguments, without running anything; Docker Compose's `config` runs too
where its CLI is (docker/install-compose.bash builds one). tests/farm/test_lab.py brings the lab
up for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.farmkit import ROOT

sys.path.insert(0, str(ROOT / "docker"))
import lab  # noqa: E402  (docker/lab.py: the lab's own tool, not a package module)

COMPOSE = ROOT / "docker" / "compose.yaml"
SERVERS = set(lab.SERVERS)
HOSTS = {h for h, _ in lab.HOSTS}
# What compose-spec allows in a service (compose-go v2.9.1's schema/compose-spec.json, which
# Docker Compose v2.40.3 validates with), besides "x-" extensions.
SPEC_SERVICE_KEYS = frozenset((
    "annotations attach blkio_config build cap_add cap_drop cgroup cgroup_parent command configs container_name "
    "cpu_count cpu_percent cpu_period cpu_quota cpu_rt_period cpu_rt_runtime cpu_shares cpus cpuset credential_spec "
    "depends_on deploy develop device_cgroup_rules devices dns dns_opt dns_search domainname entrypoint env_file "
    "environment expose extends external_links extra_hosts gpus group_add healthcheck hostname image init ipc "
    "isolation label_file labels links logging mac_address mem_limit mem_reservation mem_swappiness memswap_limit "
    "models network_mode networks oom_kill_disable oom_score_adj pid pids_limit platform ports post_start pre_stop "
    "privileged profiles provider pull_policy pull_refresh_after read_only restart runtime scale secrets "
    "security_opt shm_size stdin_open stop_grace_period stop_signal storage_opt sysctls tmpfs tty ulimits "
    "use_api_socket user userns_mode uts volumes volumes_from working_dir").split())
# security_opt values both Docker (docker run --security-opt) and podman take. podman's own
# unmask=, mask=, proc-opts= and label=nested are not among them.
PORTABLE_SECURITY_OPT = re.compile(r"(apparmor|seccomp)=\S+|label=(user|role|type|level):\S+|label=disable"
                                   r"|no-new-privileges(=true|:true)?|systempaths=unconfined")
# Debian 12's podman-compose runs on Debian's Python, with Debian's PyYAML.
PODMAN_COMPOSE_PYTHON = "/usr/bin/python3"


def _podman_compose() -> str:
    exe = shutil.which("podman-compose")
    if exe is None:
        pytest.fail("podman-compose is not installed: run 'make setup' (Debian package podman-compose)")
    return exe


def load() -> dict[str, Any]:
    """The file as YAML with its anchors and merge keys resolved (not its variables), by the
    PyYAML podman-compose itself uses."""
    _podman_compose()
    p = subprocess.run([PODMAN_COMPOSE_PYTHON, "-c", "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), "
                        "sys.stdout)"], input=COMPOSE.read_text(), capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def lab_env(lab_dir: Path) -> dict[str, str]:
    """The variables `lab.py init` writes to lab.env (their values made up)."""
    env = {"GEARFARM_LAB": str(lab_dir), "GF_PROJECT": "gfcheck", "GF_BUILD_TARGETS": "linux-x86_64",
           "GF_TEST_TARGETS": "linux-x86_64", "GF_PERF_TARGETS": "linux-x86_64"}
    env.update({f"GF_{name.upper()}_PORT": str(20000 + i) for i, name in enumerate(lab.SERVERS)})
    return env


def test_every_service_has_a_restart_policy() -> None:
    services = load()["services"]
    assert set(services) == SERVERS | HOSTS
    for name, svc in services.items():
        want = r"on-failure:\d+" if name.endswith("-1") else "unless-stopped"
        assert re.fullmatch(want, str(svc.get("restart"))), (name, svc.get("restart"))


def test_every_service_has_a_health_check_that_podman_compose_can_run() -> None:
    for name, svc in load()["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        # CMD-SHELL with one string: podman-compose 1.0.3 joins a ["CMD", ...] list into one word.
        assert isinstance(test, list) and test[0] == "CMD-SHELL" and len(test) == 2, (name, test)
        assert {"interval", "timeout", "start_period", "retries"} <= set(svc["healthcheck"]), name


def test_depends_on_waits_for_health() -> None:
    services = load()["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on as a list waits for nothing"
        for dep, how in deps.items():
            want = "service_healthy" if "healthcheck" in services[dep] else "service_started"
            assert how == {"condition": want}, (name, dep, how)
    # The servers need nothing; every farm host waits for both job servers and every MinIO node,
    # the collector for the results database too; a worker needs no database.
    assert all(not services[s].get("depends_on") for s in SERVERS)
    farm_servers = {s for s in SERVERS if s != "postgres"}
    assert set(services["collector"]["depends_on"]) == farm_servers | {"postgres"}
    for host in HOSTS - {"collector"}:
        assert set(services[host]["depends_on"]) == farm_servers, host


def test_no_podman_only_option() -> None:
    data = load()
    assert set(data) <= {"services", "volumes", "networks", "configs", "secrets", "name"} | {
        k for k in data if k.startswith("x-") and "podman" not in k}, set(data)
    for name, svc in data["services"].items():
        unknown = {k for k in svc if k not in SPEC_SERVICE_KEYS and not k.startswith("x-")}
        assert not unknown and not any("podman" in k for k in svc), (name, unknown)
        for opt in svc.get("security_opt", []):
            assert PORTABLE_SECURITY_OPT.fullmatch(opt), f"{name}: security_opt {opt!r} is not Docker's as well"
    # The workers still get what bubblewrap needs: their own /proc, and SYS_ADMIN.
    for host in HOSTS - {"collector"}:
        assert data["services"][host]["security_opt"] == ["systempaths=unconfined"]
        assert data["services"][host]["cap_add"] == ["SYS_ADMIN"]


def test_every_variable_is_required_or_has_a_default() -> None:
    # The file without its comments (which quote variables to explain them).
    text = "\n".join(line.split(" #")[0] for line in COMPOSE.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    uses = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:\?|:-)?([^}]*)\}", text)
    assert uses
    for var, how, rest in uses:
        assert how and rest.strip(), f"${{{var}}} has neither a :? message nor a :- default"
        if how == ":?" and var == "GEARFARM_LAB":
            assert "docker/lab.py init" in rest, "the message does not say how to make the lab"
    assert not re.search(r"\$(?![{$])", text), "a bare $VAR has no guard"
    # Exactly what lab.py writes to lab.env (GF_PROJECT is the project name, not in the file).
    assert {v for v, _, _ in uses} == set(lab_env(Path("/lab"))) - {"GF_PROJECT"}


CHECK = """
import json, sys
import podman_compose as pc


class NoPodman:  # answers what the parse asks podman, runs nothing
    def output(self, podman_args, cmd="", cmd_args=None):
        if cmd == "volume" and cmd_args and cmd_args[0] == "inspect":
            return json.dumps([{"Name": cmd_args[1], "Mountpoint": "/nonexistent"}]).encode()
        return b""

    def run(self, *args, **kwargs):
        return None


# It would make each bind mount's source directory (at / when a variable is empty) and each volume.
pc.assert_volume = lambda compose, mount: None
out, compose = sys.argv[2], pc.podman_compose
sys.argv = ["podman-compose", "-f", sys.argv[1], "-p", "gfcheck", "up", "-d", "--no-build"]
compose._parse_args()
compose.podman = NoPodman()
compose._parse_compose_file()
with open(out, "w") as f:
    json.dump([{"service": c["_service"], "deps": sorted(c["_deps"]),
                "args": pc.container_to_args(compose, c, detached=True)} for c in compose.containers], f)
"""


def podman_compose_parse(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    _podman_compose()
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    return subprocess.run([PODMAN_COMPOSE_PYTHON, str(script), str(COMPOSE), str(tmp_path / "out.json")],
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, cwd=tmp_path)


def test_podman_compose_reads_it_into_podman_run_arguments(tmp_path: Path) -> None:
    p = podman_compose_parse(tmp_path, lab_env(tmp_path / "lab"))
    assert p.returncode == 0, p.stderr[-3000:]
    containers = json.loads((tmp_path / "out.json").read_text())
    order = [c["service"] for c in containers]
    # Started servers first: every host after every server it depends on.
    assert set(order[:len(SERVERS)]) == SERVERS, order
    for c in containers:
        args = " ".join(c["args"])
        assert re.search(r"--restart (unless-stopped|on-failure:\d+)\b", args), c["service"]
        # podman reads a command that is not JSON as CMD-SHELL: /bin/sh -c '<the check>'.
        assert re.search(r"--healthcheck-command /bin/sh -c '[^ ]", args), (c["service"], args)
        if c["service"] in HOSTS - {"collector"}:
            assert "--security-opt systempaths=unconfined" in args and "--cap-add SYS_ADMIN" in args
        assert "unmask" not in args


def test_a_missing_variable_stops_podman_compose_with_the_fix(tmp_path: Path) -> None:
    env = lab_env(tmp_path / "lab")
    del env["GEARFARM_LAB"]
    p = podman_compose_parse(tmp_path, env)
    assert p.returncode != 0
    assert "set GEARFARM_LAB to the lab directory (docker/lab.py init LAB makes it)" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "out.json").exists()


def docker_compose() -> list[str] | None:
    """A Docker Compose CLI: the docker plugin, a docker-compose on PATH, or the one
    docker/install-compose.bash built into the cache."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    cache = Path(os.environ.get("GEARFARM_CACHE", Path.home() / ".cache" / "gearfarm"))
    built = sorted(cache.glob("tools/docker-compose-*/bin/docker-compose"))
    return [str(built[-1])] if built else None


def test_docker_compose_accepts_it(tmp_path: Path) -> None:
    cli = docker_compose()
    if cli is None:
        pytest.skip("no Docker Compose CLI here (no registry serves Docker): docker/install-compose.bash builds one "
                    "from the Go module proxy, about 10 minutes")
    env = lab_env(tmp_path / "lab")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "minio.env").write_text("MINIO_ROOT_USER=x\n")  # env_file must exist
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    p = subprocess.run([*cli, "-p", "gfcheck", "-f", str(COMPOSE), "config", "--format", "json"],
                       env={**base, **env}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    resolved = json.loads(p.stdout)["services"]
    assert resolved["build-1"]["depends_on"]["minio3"]["condition"] == "service_healthy"
    assert resolved["build-1"]["security_opt"] == ["systempaths=unconfined"]
    # The control: the same CLI refuses what the schema does not allow, and a missing variable.
    bad = tmp_path / "bad.yaml"
    bad.write_text(COMPOSE.read_text().replace("condition: service_healthy}", "condition: service_hearty}"))
    p = subprocess.run([*cli, "-p", "gfcheck", "-f", str(bad), "config", "-q"], env={**base, **env},
                       capture_output=True, text=True)
    assert p.returncode != 0 and "service_hearty" not in p.stdout and "condition" in p.stderr, p.stderr
    del env["GEARFARM_LAB"]
    p = subprocess.run([*cli, "-p", "gfcheck", "-f", str(COMPOSE), "config", "-q"], env={**base, **env},
                       capture_output=True, text=True)
    assert p.returncode != 0 and "docker/lab.py init LAB makes it" in p.stderr, p.stderr
