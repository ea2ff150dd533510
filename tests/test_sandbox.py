"""Least privilege for jobs (issue #15): a build or a suite is the project's code, and a commit
can be hostile. A project whose build and suite go looking for the farm's secrets runs on a
real embedded farm (gearmand, MinIO, workers): every attempt fails, and none of the secrets
shows up in what the job could print. The same project on a farm with ``sandbox = "none"`` does
find them, so the test can fail."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm import catalog as catalog_mod
from gearfarm import config as config_mod
from gearfarm import process
from gearfarm.config import ProjectConfig
from gearfarm.farm import EmbeddedFarm
from gearfarm.sandbox import Sandbox, SandboxError
from tests.farmkit import gearfarm
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
        secrets = [*loaded.farm.secrets, loaded.s3.secret_key, PLANTED]
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
    argv, env = box.command(cmd, box.environment(), work, [work])
    rc, _ = process.run_logged(argv, log, 30, cwd=work, env=env, shown=cmd)
    assert rc == 0, log.read_text()
    text = log.read_text()
    assert "a toolchain file" in text and "secret" not in text.split("\n", 1)[1], text
    assert (work / "out").read_text() == "made\n" and not (tools / "planted").exists()
    assert text.rstrip().endswith("65534"), text  # nobody, with no capabilities
    assert "Read-only file system" in text, text


def test_a_sandbox_that_cannot_start_stops_the_worker_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("gearfarm.sandbox.os.access", lambda path, mode: False)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        Sandbox("bwrap").check()
    Sandbox("none").check()  # unconfined on purpose needs nothing
