"""Least privilege (issue #15): a build or a suite is the project's code, and a commit
can be hostile. A project whose build and suite go looking for the farm's secrets runs on a
real embedded farm (gearmand, MinIO, workers): every attempt fails, and none of the secrets
shows up in what the job could print. The same project on a farm with ``sandbox = "none"`` does
find them, so the test can fail. And each worker role's MinIO user can do only what the role
does: with the test role's keys no artifact can be written."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import ProjectConfig, S3Keys
from gearfarm.formats import catalog as catalog_mod
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3 import keys
from gearfarm.s3.minio import make_role_users
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.step.sandbox import Sandbox, SandboxError
from tests.farmkit import ROOT, gearfarm, key_secrets
from tests.projects import _init

PLANTED = "planted-env-secret-5d1e"

CATALOG = """schema = 2

[build]
argv = ["sh", "probe.sh", "build"]
outputs = ["probe.sh", "built.txt"]
timeout = 120

[suites.probe]
description = "what a hostile commit tries"
argv = ["sh", "{root}/probe.sh", "suite"]
format = "tap"
timeout = 120

[targets.linux-x86_64]
tools = ["sh"]
suites = ["probe"]
"""


def probe_script(state: Path, config: Path, ports: dict[str, int]) -> str:
    """Each attempt prints what it got (the test looks for secrets in the log) and a TAP line
    that passes only when the attempt failed."""
    q = shlex.quote
    attempts = {
        "read the farm config": f"cat {q(str(config))}",
        "read the results database": f"cat {q(str(state / 'results.db'))}",
        "list the state directory": f"ls -la {q(str(state))} && ls {q(str(state / 'minio'))}",
        # By name: the script must not carry the secret it looks for.
        "read the worker's environment": "cat /proc/[0-9]*/environ | tr '\\0' '\\n' | grep -a AWS_SECRET",
        "see the farm's processes": "ps -eo args= | grep -e gearfarm.cli -e gearmand -e 'minio server' | grep -v grep",
        "read root's home": "ls /root",
        "reach gearmand": f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{ports['gearmand']}'",
        "reach MinIO": f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{ports['minio']}'",
    }
    # Writes are judged on the host by the test: inside, the paths may exist on the sandbox's
    # own tmpfs (its /tmp, or the mount points bwrap made), where a write harms nothing.
    writes = [f"touch {q(str(state / 'written-by-a-job'))}", f"touch {q(str(config))}"]
    lines = ["#!/bin/sh", 'echo "== $1: environment"', "env", f"echo 1..{len(attempts)}", "n=0"]
    for name, cmd in attempts.items():
        lines += ["n=$((n+1))", f'echo "== {name}"',
                  f'if ( {cmd} ) 2>&1; then echo "not ok $n - could {name}"; '
                  f'else echo "ok $n - cannot {name}"; fi']
    lines += ['echo "== writes"', *(f"{w} 2>&1" for w in writes),
              '[ "$1" = build ] && echo built > built.txt', "exit 0", ""]
    return "\n".join(lines)


def run_hostile(base: Path, mode: str) -> tuple[str, str, list[str], Path]:
    """A nightly of the hostile project on a farm with ``mode``: (build log, suite log, the
    secrets, the state directory)."""
    repo = base / "hostile"
    state = base / "state"
    farm = EmbeddedFarm(state, base / "no-repo", projects=[ProjectConfig(name="hostile", repo=str(repo))],
                        worker_env={"AWS_SECRET_ACCESS_KEY": PLANTED}, slots=1, sandbox=mode)
    (base / "no-repo").mkdir()
    # The repository needs the ports, which exist once the farm runs: start it on a
    # placeholder catalog of the same shape, then commit the real probe.
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": CATALOG, "probe.sh": "exit 0\n"})
    try:
        cfg = farm.start(catalog_mod.parse(CATALOG, "hostile"))
        assert farm.gearmand is not None and farm.minio is not None
        ports = {"gearmand": farm.gearmand.address[1], "minio": int(cfg.s3.endpoint.rsplit(":", 1)[1])}
        (repo / "probe.sh").write_text(probe_script(state, farm.config_path, ports))
        from tests.farmkit import commit

        commit(repo, "probe")
        p = gearfarm("nightly", "--config", str(farm.config_path), "--benchmarks", "none", timeout=300)
        assert p.returncode in (0, 1), p.stdout + p.stderr
        run_dir = next(d for d in (state / "runs").iterdir() if d.is_dir() and not d.name.endswith(".rerun"))
        build = (run_dir / "logs/linux-x86_64/build/log.txt").read_text()
        suite = (run_dir / "logs/linux-x86_64/test-probe/log.txt").read_text()
        loaded = config_mod.load(farm.config_path)
        secrets = [*key_secrets(loaded), loaded.s3.secret_key, PLANTED]
        return build, suite, secrets, state
    finally:
        farm.stop()


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str], Path]]:
    yield run_hostile(tmp_path_factory.mktemp("confined"), "bwrap")


def test_a_hostile_build_and_suite_reach_no_secret(confined: tuple[str, str, list[str], Path]) -> None:
    build, suite, secrets, state = confined
    # What the jobs tried to write outside their directories: nothing arrived on the host.
    assert not (state / "written-by-a-job").exists()
    assert (state / "farm.toml").stat().st_mtime < (state / "results.db").stat().st_mtime
    for name, text in (("build", build), ("suite", suite)):
        assert "not ok" not in text, f"the {name} got through:\n{text}"
        assert text.count("\nok ") == 8, f"the {name} did not make every attempt:\n{text}"
        for secret in secrets:
            assert secret not in text, f"a secret reached the {name}'s output"
        # Its environment is the catalog's and a few locale/path variables, nothing of the worker's.
        env_block = text.split("== ", 2)[1]
        assert "GEARFARM_CONFIG" not in env_block and "AWS_" not in env_block, env_block


def test_without_the_sandbox_the_same_commit_finds_the_secrets(tmp_path: Path) -> None:
    """The control: what the confined run did not find is there to be found."""
    build, suite, secrets, state = run_hostile(tmp_path, "none")
    assert (state / "written-by-a-job").exists()
    assert "not ok" in suite and "could read the farm config" in suite
    assert "could read the results database" in suite and "could reach MinIO" in suite
    assert any(s in suite for s in secrets) and any(s in build for s in secrets)
    # The environment is clean even unconfined: the planted variable is only in /proc.
    env_block = suite.split("== ", 2)[1]
    assert PLANTED not in env_block


def test_files_the_config_names_are_masked_inside_visible_trees(tmp_path: Path) -> None:
    tools = tmp_path / "opt-tools"
    tools.mkdir()
    (tools / "cc-wrapper").write_text("a toolchain file\n")
    key = tools / "host.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nsecret\n")
    secret_dir = tools / "keys"
    secret_dir.mkdir()
    (secret_dir / "hmac").write_text("secret too\n")
    box = Sandbox("bwrap", hidden=(key, secret_dir), readonly=(tools,))
    work = tmp_path / "job"
    work.mkdir()
    log = tmp_path / "out.log"
    cmd = ["sh", "-c", f"cat {tools}/cc-wrapper; cat {key}; ls {secret_dir}; echo made > {work}/out; "
                       f"echo no > {tools}/planted; id -u"]
    rc = box.run(cmd, log, 30, work, box.environment(), [work]).rc
    assert rc == 0, log.read_text()
    text = log.read_text()
    assert "a toolchain file" in text and "secret" not in text.split("\n", 1)[1], text
    assert (work / "out").read_text() == "made\n" and not (tools / "planted").exists()
    assert text.splitlines()[-2] == "65534", text  # nobody, with no capabilities (then how it ended)
    assert "Read-only file system" in text, text


def test_a_sandbox_that_cannot_start_stops_the_worker_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("gearfarm.step.sandbox.os.access", lambda path, mode: False)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        Sandbox("bwrap").check()
    Sandbox("none").check()  # unconfined on purpose needs nothing


def test_a_worker_that_cannot_stage_its_jobs_for_the_job_uid_names_the_capability(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A root worker in a container without SYS_ADMIN cannot make the job's mount namespace: as
    if its staging directory could not be mounted, it refuses to start and says what to add."""
    monkeypatch.setattr("gearfarm.step.sandbox.STAGE", "/nonexistent-gearfarm-stage/mnt")
    with pytest.raises(SandboxError, match=r"--cap-add SYS_ADMIN"):
        Sandbox("bwrap", uid=2_000_000_000).check()


STAGED = """
import sys
from pathlib import Path
from gearfarm.step.sandbox import Sandbox
box = Sandbox("bwrap", uid=2_000_000_000)
work = Path(sys.argv[1])
box.give([work])
before = Path("/proc/self/mountinfo").read_text()
rc = box.run(["sh", "-c", "id -u > out"], Path(sys.argv[2]), 30, work, box.environment(), [work]).rc
after = Path("/proc/self/mountinfo").read_text()
print(rc, "gearfarm-stage" in after, len(after.splitlines()) - len(before.splitlines()))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker switches jobs to the job uid only as root")
def test_a_root_workers_staging_stays_in_the_commands_own_mount_namespace(tmp_path: Path) -> None:
    """A root worker's supervisor binds the job's directories where the job uid finds them,
    in a mount namespace of the command's own: on a host whose mounts are shared (systemd's
    default; made so here in a namespace of the test's own) none of it may appear in the
    worker's, where it would outlive the job and pile up, one tmpfs and its binds a command."""
    work = tmp_path / "private" / "job"
    work.mkdir(parents=True)
    (tmp_path / "private").chmod(0o700)  # as a worker's state directory: the job uid cannot reach it
    log = tmp_path / "log.txt"
    p = subprocess.run(["unshare", "--mount", "--propagation", "shared", "--", sys.executable, "-c", STAGED,
                        str(work), str(log)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "False", "0"], (p.stdout, log.read_text())
    assert (work / "out").read_text() == "65534\n", log.read_text()  # it ran, in its sandbox


def test_each_role_s3_user_can_do_only_what_its_role_does(tmp_path: Path) -> None:
    """Per-role MinIO users with the policies of gearfarm.s3.keys, on a real MinIO: with the
    test role's keys no artifact (or source, catalog, build log) can be written, while the test
    role reads artifacts and writes its own step's files; a user made for some targets writes
    only theirs."""
    roles = {r: S3Keys(access_key=f"t-{r}", secret_key=f"{r}-secret-0123456789") for r in keys.ROLE_WRITES}
    with MinioServer(tmp_path / "minio") as minio:
        minio.add_role_users(roles)
        base = minio.s3_config().model_copy(update={"roles": roles})
        farm_store = ArtifactStore(base, retry_for=0)
        art = keys.artifact("a" * 40, "linux-x86_64", "tc1")
        farm_store.put_bytes(art, b"the real artifact")
        store = {r: ArtifactStore(base.for_role(r), retry_for=0, attempts=1) for r in roles}
        run = "20261123-engine-aaaa"
        writes = {  # key: roles that may write it
            keys.artifact("b" * 40, "linux-x86_64", "tc1"): {"build"},
            keys.manifest("b" * 40, "linux-x86_64", "tc1"): {"build"},
            keys.source("c" * 40): set(),
            keys.catalog("d" * 64): set(),
            keys.project_latest("engine"): set(),
            keys.job_file(run, "linux-x86_64", "build", "log.txt", "f" * 64): {"build"},
            keys.job_file(run, "linux-x86_64", "test-unit", "log.txt", "f" * 64): {"test"},
            keys.result(run, "linux-x86_64", "test-unit", 1, "e" * 64): {"test"},
            keys.job_file(run, "linux-x86_64", "perf-oltp", "log.txt", "f" * 64): {"perf"},
            keys.report(run, "html"): set(),
            keys.cancel(run): set(),
            # A job's marker too: under the job's prefix, its role could cancel any such job.
            keys.cancel(run, "linux-x86_64", "test-unit"): set(),
            keys.cancel(run, "linux-x86_64", "build"): set(),
        }
        for key, allowed in writes.items():
            for role, s in store.items():
                if role in allowed:
                    s.put_bytes(key, b"ok")
                else:
                    with pytest.raises(StoreError, match="AccessDenied"):
                        s.put_bytes(key, b"forged")
        assert farm_store.get_bytes(art) == b"the real artifact"
        assert not farm_store.exists(keys.source("c" * 40)) and not farm_store.exists(keys.report(run, "html"))
        # Reading: workers read everything they need; the collector only the runs' files.
        for role in ("build", "test", "perf"):
            assert store[role].get_bytes(art) == b"the real artifact"
            assert not store[role].exists(keys.source("f" * 40))  # a missing key is a 404, not a 403
        with pytest.raises(StoreError, match="AccessDenied"):
            store["collector"].get_bytes(art)
        test_log = keys.job_file(run, "linux-x86_64", "test-unit", "log.txt", "f" * 64)
        assert store["collector"].get_bytes(test_log) == b"ok"
        # A host's users for its own targets only: another target's files and artifacts are refused.
        mine = {r: S3Keys(access_key=f"t-{r}-x86", secret_key=f"{r}-x86-secret-0123456789") for r in ("build", "test")}
        make_role_users(minio.s3_config(), mine, {r: ("linux-x86_64",) for r in mine})
        scoped = {r: ArtifactStore(base.model_copy(update={"roles": mine}).for_role(r), retry_for=0, attempts=1)
                  for r in mine}
        for role, own, other in (
                ("test", keys.job_file(run, "linux-x86_64", "test-unit", "log.txt", "f" * 64),
                 keys.job_file(run, "linux-aarch64", "test-unit", "log.txt", "f" * 64)),
                ("test", keys.result(run, "linux-x86_64", "test-unit", 1, "e" * 64),
                 keys.result(run, "windows-x86_64", "test-unit", 1, "e" * 64)),
                ("build", keys.artifact("b" * 40, "linux-x86_64", "tc1"),
                 keys.artifact("b" * 40, "linux-aarch64", "tc1")),
                ("build", keys.job_file(run, "linux-x86_64", "build", "log.txt", "f" * 64),
                 keys.job_file(run, "linux-aarch64", "build", "log.txt", "f" * 64))):
            scoped[role].put_bytes(own, b"mine")
            with pytest.raises(StoreError, match="AccessDenied"):
                scoped[role].put_bytes(other, b"forged")
        # Wrong keys are refused outright.
        bogus = ArtifactStore(base.model_copy(update={"secret_key": "wrong-secret-123"}), retry_for=0, attempts=1)
        with pytest.raises(StoreError):
            bogus.put_bytes(keys.artifact("9" * 40, "linux-x86_64", "tc1"), b"forged")


def test_store_roles_makes_the_users_and_prints_their_config(tmp_path: Path) -> None:
    with MinioServer(tmp_path / "minio") as minio:
        admin = tmp_path / "admin.toml"
        config_mod.dump(config_mod.Config(s3=minio.s3_config()), admin)
        p = gearfarm("store", "roles", "--config", str(admin), "--roles", "test", "--targets", "linux-x86_64",
                     timeout=120)
        assert p.returncode == 0, p.stderr
        section = config_mod.tomllib.loads(p.stdout)["s3"]["roles"]
        assert set(section) == {"test"}
        cfg = config_mod.Config(s3=minio.s3_config().model_copy(update={"roles": {
            "test": S3Keys(**section["test"])}}))
        test_store = ArtifactStore(cfg.s3.for_role("test"), retry_for=0, attempts=1)
        test_store.put_bytes(keys.job_file("r1", "linux-x86_64", "test-unit", "log.txt", "f" * 64), b"mine")
        for forged in (keys.artifact("a" * 40, "linux-x86_64", "tc"),
                       keys.job_file("r1", "linux-aarch64", "test-unit", "log.txt", "f" * 64)):
            with pytest.raises(StoreError, match="AccessDenied"):
                test_store.put_bytes(forged, b"forged")
        bad = gearfarm("store", "roles", "--config", str(admin), "--roles", "janitor", timeout=60)
        assert bad.returncode != 0 and "give some of build, test, perf, collector" in bad.stderr
        bad = gearfarm("store", "roles", "--config", str(admin), "--targets", "../x", timeout=60)
        assert bad.returncode != 0 and "--targets '../x': a target is a name like linux-x86_64" in bad.stderr
