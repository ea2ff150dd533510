"""The queue is the farm's (issue #76, case 9): gearmand's text admin protocol takes `maxqueue`
from any peer that connects (no authentication in 1.1.20; the embedded gearmand has no TLS, and
in a lab every worker host holds a client certificate). Tried as that peer does, with a plain
socket (what `nc` sends) and libgearman's `gearadmin`, on a real embedded farm with two projects:
`maxqueue test:linux-x86_64 1` before a night and while its jobs are submitted. The night still
submits every job and passes, the report and the mail name the setting and who could have set
it; an attacker who keeps setting it gets a night that refuses, naming the setting, and whose runs
are closed, with the error in their reports.

Before the change (main at 8946d18): the nightly exited 2 ("cannot submit to gearmand: gearmand
127.0.0.1:P: QUEUE_ERROR Job queue is full answering submission 2 of 3 ..."), no report, and the
run stayed "running" on /live."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gearfarm import config as config_mod
from gearfarm.config import Config, ProjectConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run.farm import EmbeddedFarm
from tests.farmkit import ROOT, commit, gearfarm, wait_for
from tests.projects import _init

T = "linux-x86_64"
TEST_FN = f"test:{T}"
CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "sleep {pause}; printf '#!/bin/sh\\necho \\"ok 1 - $1\\"\\n' > check.sh && chmod 755 check.sh"]
outputs = ["check.sh"]
timeout = 60

[suites.one]
argv = ["{{root}}/check.sh", "one"]
format = "tap"
timeout = 60

[suites.two]
argv = ["{{root}}/check.sh", "two"]
format = "tap"
timeout = 60

[suites.three]
argv = ["{{root}}/check.sh", "three"]
format = "tap"
timeout = 60

[targets.linux-x86_64]
tools = ["sh"]
suites = ["one", "two", "three"]
"""
PROJECTS = {"alpha": 4, "beta": 1}  # the seconds each project's build takes


@dataclass
class Queue:
    farm: EmbeddedFarm
    cfg: Config
    db: ResultsDB
    revs: dict[str, str]

    @property
    def address(self) -> tuple[str, int]:
        return self.cfg.gearman.addresses()[0]

    def maxqueue(self, function: str, size: int) -> str:
        """What any peer can do: one line of gearmand's text protocol on a plain socket (as
        `printf 'maxqueue F 1\\n' | nc HOST PORT`); gearmand's answer."""
        with socket.create_connection(self.address, timeout=10) as s:
            s.sendall(f"maxqueue {function} {size}\n".encode())
            return s.recv(100).decode().strip()

    def nightly(self, run: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return gearfarm(*self._args(run), timeout=timeout)

    def start_nightly(self, run: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "gearfarm.cli", *self._args(run)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def _args(self, run: str) -> list[str]:
        # One nightly, both projects: their run ids are made from this prefix.
        return ["nightly", "--config", str(self.farm.config_path), "--benchmarks", "none",
                "--run-id-file", str(self.farm.state.parent / f"{run}.ids")]

    def runs(self, run: str) -> list[str]:
        """The run ids the nightly wrote, one per project (id, project, link a line)."""
        ids = self.farm.state.parent / f"{run}.ids"
        return [line.split("\t")[0] for line in ids.read_text().splitlines()] if ids.exists() else []

    def change(self, project: str) -> None:
        """A new commit of ``project``: its next night builds (a build of a known revision is reused)."""
        repo = self.farm.state.parent / project
        (repo / "notes.txt").write_text(f"change at {time.time()}\n")
        commit(repo, "a change")

    def report(self, run_id: str) -> str:
        return (self.farm.state / "runs" / run_id / "report.txt").read_text()


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queue]:
    base = tmp_path_factory.mktemp("queue")
    revs, projects, cats = {}, [], []
    for name, pause in PROJECTS.items():
        text = CATALOG.format(pause=pause)
        revs[name] = _init(base / name, {"jobs/catalog.toml": text})
        projects.append(ProjectConfig(name=name, repo=str(base / name)))
        cats.append(catalog_mod.parse(text, name))
    (base / "none").mkdir()
    farm = EmbeddedFarm(base / "state", base / "none", projects=projects, slots=2)
    farm.start(cats, [T])
    cfg = config_mod.load(farm.config_path)
    cfg.bisect.auto = False
    config_mod.dump(cfg, farm.config_path)
    try:
        yield Queue(farm, cfg, ResultsDB(cfg.database.url), revs)
    finally:
        farm.stop()


def _passed_and_closed(q: Queue, run: str, out: str) -> list[str]:
    ids = q.runs(run)
    assert len(ids) == 2, out
    for run_id in ids:
        jobs = {r.step: r.status for r in q.db.jobs(run_id)}
        assert jobs == {"build": "passed", "test-one": "passed", "test-two": "passed", "test-three": "passed"}, \
            (run_id, jobs, out)
        run = q.db.get_run(run_id)
        assert run is not None and run.state == "finished", (run_id, run and run.state)
        assert run_id not in {r.run_id for r in q.db.running_runs()}  # what /live shows
    return ids


def test_maxqueue_sent_by_a_peer_before_the_night_is_undone_and_reported(queue: Queue) -> None:
    assert queue.nightly("warm").returncode == 0  # every function known to gearmand
    assert queue.maxqueue(TEST_FN, 1) == "OK"
    p = queue.nightly("before")
    assert p.returncode == 0, p.stdout + p.stderr
    ids = _passed_and_closed(queue, "before", p.stdout + p.stderr)
    reports = "".join(queue.report(r) for r in ids)
    assert "ALARMS" in reports, reports
    assert f"maxqueue {TEST_FN}" in reports and "admin protocol" in reports, reports
    host, port = queue.address
    assert f"any process that reaches {host}:{port}" in reports, reports
    # The mail carries it too (no mail server here: the message is kept on disk).
    mails = list((queue.farm.state / "runs").rglob("*.eml"))
    assert any(f"maxqueue {TEST_FN}" in m.read_text(errors="replace") for m in mails), mails
    # gearmand's limit is gone: a second night passes with no alarm.
    p = queue.nightly("after")
    assert p.returncode == 0, p.stdout + p.stderr
    assert all("ALARMS" not in queue.report(r) for r in _passed_and_closed(queue, "after", p.stdout))


def test_maxqueue_sent_while_the_night_submits_is_undone_and_reported(queue: Queue) -> None:
    """The limit set while alpha's build runs: its three suites are submitted after it."""
    queue.change("alpha")
    nightly = queue.start_nightly("during")
    try:
        def building() -> bool:
            logs = "".join(p.read_text(errors="replace") for p in (queue.farm.state / "logs").glob("*.log"))
            return any(f"COMMAND START job={r.run_id}:{T}:build " in logs
                       for r in queue.db.running_runs() if r.project == "alpha")

        wait_for("alpha's build to start", building, 120)
        assert queue.maxqueue(TEST_FN, 1) == "OK"
        out, _ = nightly.communicate(timeout=600)
    finally:
        if nightly.poll() is None:
            nightly.kill()
    assert nightly.returncode == 0, out
    ids = _passed_and_closed(queue, "during", out)
    assert any(f"maxqueue {TEST_FN}" in queue.report(r) for r in ids), [queue.report(r) for r in ids]


def test_a_peer_that_keeps_setting_maxqueue_gets_a_refused_night_whose_runs_are_closed(queue: Queue) -> None:
    """A peer that sets the limit again as fast as it can: the night either wins (every job
    submitted, reported) or refuses, naming the setting; every run is closed either way, never
    left running on /live, its report written."""
    stop = threading.Event()

    def attack() -> None:
        while not stop.is_set():
            try:
                queue.maxqueue(TEST_FN, 1)
            except OSError:
                pass

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        p = queue.nightly("storm")
    finally:
        stop.set()
        attacker.join(30)
    out = p.stdout + p.stderr
    ids = queue.runs("storm")
    assert len(ids) == 2, out
    for run_id in ids:
        run = queue.db.get_run(run_id)
        assert run is not None and run.state == "finished", (run_id, run and run.state, out)
        assert run_id not in {r.run_id for r in queue.db.running_runs()}, out  # what /live shows
        assert f"maxqueue {TEST_FN}" in queue.report(run_id) or p.returncode == 0, out
    if p.returncode == 2:
        assert f"gearmand refuses jobs of {TEST_FN}" in out and "maxqueue" in out, out
    else:
        assert p.returncode == 0, out
        assert queue.maxqueue(TEST_FN, 0) == "OK"


def test_maxqueue_on_the_collector_function_costs_no_result(queue: Queue) -> None:
    """`maxqueue collect 1` refuses the workers' claims, beats and records that overlap, which go
    to the collector through gearmand: a worker whose claim is refused waits for its lease and
    asks again ("waits for its lease: the collector did not answer (... QUEUE_ERROR ...)", seen in
    the slots' logs when two claims meet), a record goes to S3 after 5 s, and the night passes.
    Held before this change too: the test keeps it held."""
    assert queue.maxqueue("collect", 1) == "OK"
    try:
        queue.change("beta")
        p = queue.nightly("collect")
        assert p.returncode == 0, p.stdout + p.stderr
        _passed_and_closed(queue, "collect", p.stdout + p.stderr)
    finally:
        assert queue.maxqueue("collect", 0) == "OK"
