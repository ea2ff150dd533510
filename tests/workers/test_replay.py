"""Each attempt runs once (issue #33): a payload captured from gearmand and submitted again under
its own unique id, while its run is still open, starts no second command. gearmand merges copies
of one unique id only while the first is queued or running; after that, the worker is the one
to know. The attacker is libgearman's own `gearman` CLI, against a real farm."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gearfarm.config import ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import verify
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import ROOT
from tests.projects import _init

TARGET = "linux-x86_64"
CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "echo built > built.txt"]
outputs = ["built.txt"]
timeout = 60

[suites.once]
argv = ["sh", "-c", "echo 'ok 1 - ran'"]
format = "tap"
timeout = 60

[suites.slow]
argv = ["sh", "-c", "sleep 40; echo 'ok 1 - slept'"]
format = "tap"
timeout = 120

[targets.linux-x86_64]
tools = ["sh"]
suites = ["once", "slow"]
"""


def _starts(farm: EmbeddedFarm, job: str, attempt: int) -> int:
    """COMMAND START lines of this attempt of this job in every worker's log: what ran."""
    line = f"COMMAND START job={job} attempt={attempt} "
    return sum(p.read_text(errors="replace").count(line) for p in (farm.state / "logs").glob("*.log"))


def _wait(what: str, check, timeout: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_payload_submitted_again_under_its_unique_id_runs_once(tmp_path: Path) -> None:
    repo = tmp_path / "replay"
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": CATALOG})
    (tmp_path / "no-repo").mkdir()
    farm = EmbeddedFarm(tmp_path / "state", tmp_path / "no-repo", projects=[ProjectConfig(name="replay",
                                                                                         repo=str(repo))], slots=1)
    nightly = None
    try:
        # Builds only, at first: the test jobs wait in gearmand, where the attacker takes one.
        cfg = farm.start(catalog_mod.parse(CATALOG, "replay"), roles=("build",))
        assert farm.gearmand is not None
        host, port = farm.gearmand.address
        gearman = ["gearman", "-h", host, "-p", str(port)]
        captured = tmp_path / "captured"
        nightly = subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(farm.config_path),
                                    "--benchmarks", "none"], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        # A rogue worker of test jobs: it takes one and keeps its bytes.
        subprocess.run([*gearman, "-w", "-c", "1", "-f", f"test:{TARGET}", "--", "sh", "-c", f"cat > {captured}"],
                       check=True, timeout=120)
        payload = verify(captured.read_bytes(), cfg.nightly_lookup(), cfg.farm.payload_max_age)
        # The fast suite (queued first): the slow one keeps the run open meanwhile.
        assert payload.step == "test-once", payload.step
        # The real test workers come; the attacker hands the captured job in, under its own id.
        farm.spawn("tests", ["worker", "--role", "test", "--targets", TARGET])
        farm.spawn("tests-2", ["worker", "--role", "test", "--targets", TARGET])

        def submit() -> None:
            subprocess.run([*gearman, "-b", "-u", payload.unique, "-f", f"test:{TARGET}"], input=captured.read_bytes(),
                           check=True, timeout=30)

        submit()
        _wait(f"{payload.job_id} to run", lambda: _starts(farm, payload.job_id, 1) == 1)
        # Its record delivered, while the run is open (the other suite sleeps): again.
        results = farm.state / "logs"
        _wait("its result", lambda: f"applied {payload.job_id}: passed (attempt 1)" in
              (results / "collector.log").read_text(errors="replace"))
        assert nightly.poll() is None, "the run closed before the replay: the test proves nothing"
        submit()

        def dropped() -> int:
            line = f"({payload.job_id}): attempt 1 of {payload.job_id} ran already"
            return sum(p.read_text(errors="replace").count(line) for p in results.glob("*.log"))

        _wait("the replay to be taken", lambda: dropped() or _starts(farm, payload.job_id, 1) > 1)
        assert _starts(farm, payload.job_id, 1) == 1 and dropped() == 1
        assert nightly.poll() is None
        out, _ = nightly.communicate(timeout=300)
        assert nightly.returncode in (0, 1), out
    finally:
        if nightly is not None and nightly.poll() is None:
            nightly.kill()
        farm.stop()
