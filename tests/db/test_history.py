"""The results database and classification against history, on SQLite and on PostgreSQL:
migrations that match the models and upgrade an old database, verdicts (new, known, fixed,
flaky) from scripted result sequences, the report built from them, and the real thing: a
sequence of nightlies over a temporary engine repository in which one commit breaks a test, a
later one fixes it, and another test fails at random (see test_nightly_sequence_*)."""

from __future__ import annotations

import email
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from email import policy
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from gearfarm.db import history
from gearfarm.db.results import Base, ResultsDB, alembic_config, current_revision, head_revision
from gearfarm.formats.result import CaseResult, ResultRecord
from gearfarm.report import document as report
from gearfarm.run.ledger import Ledger

T, U = "linux-x86_64", "linux-aarch64"


def rev_of(run_id: str) -> str:
    return (run_id.encode().hex() * 40)[:40]


def add_run(db: ResultsDB, run_id: str, at: float, results: dict[str, dict[str, str]],
            reruns: dict[str, dict[str, str]] | None = None, build: dict[str, str] | None = None,
            project: str | None = None, catalog: tuple[str, str] | None = None) -> list[ResultRecord]:
    """A run (of ``project``, default the engine) with the unit suite on each target in
    ``results`` ({target: {case: status}}), and a re-run run of the same shape when ``reruns``
    is given (of the run's project, which it inherits)."""
    targets = sorted(set(results) | set(build or {}))
    recs = []
    for t in targets:
        bstatus = (build or {}).get(t, "passed")
        recs.append(ResultRecord(job_id=f"{run_id}:{t}:build", run_id=run_id, target=t, kind="build", step="build",
                                 rev=rev_of(run_id), status=bstatus, worker="b1",  # type: ignore[arg-type]
                                 log_tail="error: gfe.c:1: broken" if bstatus != "passed" else "",
                                 host={"hostname": "h1", "cpu": "cpu", "cores": "4", "mem_gib": "8", "class": "c"}))
        if t in results:
            recs.append(_suite(run_id, run_id, t, results[t], "w1"))
    ledger = Ledger(db)
    db.create_run(run_id, rev_of(run_id), targets, [r.job_id for r in recs], notes={"seed": 7}, created_at=at,
                  project=project, catalog=catalog)
    if reruns:
        rid = run_id + ".rerun"
        again = [_suite(rid, run_id, t, cases, "w2") for t, cases in reruns.items()]
        db.create_run(rid, rev_of(run_id), sorted(reruns), [r.job_id for r in again], parent_run_id=run_id,
                      created_at=at + 1)
        for r in again:
            assert ledger.apply(r, "collect") == "applied"
    for r in recs:
        assert ledger.apply(r, "collect") == "applied"
    return recs


def _suite(run_id: str, base: str, t: str, cases: dict[str, str], worker: str) -> ResultRecord:
    status = "failed" if "failed" in cases.values() else "passed"
    return ResultRecord(job_id=f"{run_id}:{t}:test-unit", run_id=run_id, target=t, kind="test", step="test-unit",
                        name="unit", rev=rev_of(base), status=status, worker=worker,  # type: ignore[arg-type]
                        artifact_key=f"artifacts/{rev_of(base)}/{t}/tc/artifact.tar.zst", artifact_sha256="a" * 64,
                        log_key=f"runs/{run_id}/{t}/test-unit/log.txt", log_tail="FAIL limits: empty index name",
                        cases=[CaseResult(name=n, status=s, message="check failed" if s == "failed" else "")  # type: ignore[arg-type]
                               for n, s in cases.items()])


def verdicts(db: ResultsDB, run_id: str) -> dict[tuple[str, str], history.CaseVerdict]:
    run = db.get_run(run_id)
    assert run is not None
    return {(v.target, v.name): v for v in history.classify_run(db, run, db.jobs(run_id))}


# ------------------------------------------------------------------------------- migrations

def test_migrations_create_the_models_schema_and_upgrade_a_database_made_before_them(db_url: str) -> None:
    # A database as create_all made it before migrations: revision 0001's tables, no version.
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0001")
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(text("INSERT INTO runs (run_id, rev, created_at, expected, targets, state, notes) "
                          "VALUES ('old', :rev, 1.0, '[]', '[\"linux-x86_64\"]', 'finished', '{}')"),
                     {"rev": "f" * 40})
    engine.dispose()

    db = ResultsDB(db_url)
    assert current_revision(db.engine) == head_revision() == "0014"
    old = db.get_run("old")
    assert old is not None and old.targets == [T] and old.parent_run_id is None and old.project == "engine"
    with db.engine.connect() as conn:
        # The migrated schema is exactly what the models say (no drift either way).
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    ResultsDB(db_url)  # opening again is a no-op at head
    db.engine.dispose()


def test_processes_opening_a_new_database_at_once_all_get_the_schema(db_url: str) -> None:
    # The collector, the nightly and the CLI open the database at the same moment.
    code = ("import sys; from gearfarm.db.results import ResultsDB, current_revision; "
            "print(current_revision(ResultsDB(sys.argv[1]).engine))")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[2]) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e for _, e in outs]
    assert {o.strip() for o, _ in outs} == {head_revision()}


def test_hosts_are_recorded_once_per_fingerprint(db_url: str) -> None:
    db = ResultsDB(db_url)
    add_run(db, "r1", 1.0, {T: {"a": "passed"}})
    add_run(db, "r2", 2.0, {T: {"a": "passed"}})
    hosts = db.hosts()
    assert len(hosts) == 1 and hosts[0].cpu_model == "cpu" and hosts[0].cores == 4 and hosts[0].memory_gib == 8
    db.engine.dispose()


# --------------------------------------------------------------------------- classification

def test_break_known_fix_per_target_and_flaky_by_rerun_and_by_flips(db_url: str) -> None:
    db = ResultsDB(db_url)
    add_run(db, "r1", 1.0, {T: {"lim": "passed", "crud": "passed", "flip": "passed"}, U: {"lim": "passed"}})
    add_run(db, "r2", 2.0, {T: {"lim": "failed", "crud": "passed", "flip": "failed"}, U: {"lim": "passed"}},
            reruns={T: {"lim": "failed", "crud": "passed", "flip": "failed"}})
    add_run(db, "r3", 3.0, {T: {"lim": "failed", "crud": "failed", "flip": "passed"}, U: {"lim": "failed"}},
            reruns={T: {"lim": "failed", "crud": "passed", "flip": "passed"}})
    add_run(db, "r4", 4.0, {T: {"lim": "passed", "crud": "passed", "flip": "failed"}, U: {"lim": "failed"}})
    add_run(db, "r5", 5.0, {T: {"lim": "passed", "crud": "failed", "flip": "failed"}, U: {"lim": "passed"}})

    v = verdicts(db, "r1")
    assert {k: x.kind for k, x in v.items() if x.kind != "passed"} == {}
    v = verdicts(db, "r2")
    assert v[(T, "lim")].kind == "new" and v[(T, "lim")].rerun == "failed"
    assert "confirmed by its re-run" in v[(T, "lim")].reason
    assert (U, "lim") not in v  # per target: U's own history, clean: "passed", left out unread
    v = verdicts(db, "r3")
    assert (v[(T, "lim")].kind, v[(T, "lim")].since_run, v[(T, "lim")].since_rev) == ("known", "r2", rev_of("r2"))
    assert v[(T, "crud")].kind == "flaky" and "re-run" in v[(T, "crud")].reason
    assert v[(U, "lim")].kind == "new" and v[(U, "lim")].rerun is None
    assert v[(T, "flip")].kind == "fixed"  # P F P so far: a break and its fix
    v = verdicts(db, "r4")
    assert (v[(T, "lim")].kind, v[(T, "lim")].since_run) == ("fixed", "r2")
    assert v[(T, "crud")].kind == "passed"  # it was flaky, passing is not "fixed"
    assert v[(T, "flip")].kind == "flaky" and "3 times" in v[(T, "flip")].reason  # P F P F
    assert (v[(U, "lim")].kind, v[(U, "lim")].since_run) == ("known", "r3")
    v = verdicts(db, "r5")
    # A failure after a flaky re-run within the window is flaky at once, not new.
    assert v[(T, "crud")].kind == "flaky" and "r3" in v[(T, "crud")].reason
    assert v[(U, "lim")].kind == "fixed" and v[(T, "lim")].kind == "passed"
    db.engine.dispose()


def test_the_flaky_window_forgets_old_flips() -> None:
    o = history.CaseRun
    old_flips = [o(f"r{i}", "x", "failed" if i % 2 else "passed") for i in range(6)]
    steady = [o(f"s{i}", "x", "passed") for i in range(12)]
    kind, _, _ = history.classify(old_flips + steady, o("now", "x", "failed"), window=10)
    assert kind == "new"
    kind, reason, _ = history.classify(old_flips, o("now", "x", "failed"), window=10)
    assert kind == "flaky" and "times" in reason


def test_a_build_that_breaks_is_a_new_then_known_job_level_failure_and_infra_is_not_classified(db_url: str) -> None:
    db = ResultsDB(db_url)
    add_run(db, "r1", 1.0, {T: {"a": "passed"}})
    add_run(db, "r2", 2.0, {}, build={T: "failed", U: "infra"})
    add_run(db, "r3", 3.0, {}, build={T: "failed"})
    v = verdicts(db, "r2")
    assert v[(T, "[build]")].kind == "new" and (U, "[build]") not in v
    v = verdicts(db, "r3")
    assert v[(T, "[build]")].kind == "known" and v[(T, "[build]")].since_run == "r2"
    db.engine.dispose()


def test_report_orders_headline_matrix_new_fixed_flaky_known(db_url: str) -> None:
    db = ResultsDB(db_url)
    add_run(db, "r1", 1.0, {T: {"lim": "passed", "crud": "passed", "old": "failed", "fix": "failed"}})
    recs = add_run(db, "r2", 2.0, {T: {"lim": "failed", "crud": "failed", "old": "failed", "fix": "passed"}},
                   reruns={T: {"lim": "failed", "crud": "passed", "old": "failed", "fix": "passed"}})
    run = db.get_run("r2")
    assert run is not None
    reruns = db.jobs("r2.rerun")
    rep = report.build(run, db.jobs("r2"), None, history.classify_run(db, run, recs), reruns)
    assert rep.headline == "1 new failure, 1 still failing, 1 flaky, 1 fixed"
    assert [x["name"] for x in rep.new] == ["lim"] and [x["name"] for x in rep.known] == ["old"]
    assert [x["name"] for x in rep.flaky] == ["crud"] and [x["name"] for x in rep.fixed] == ["fix"]
    new = rep.new[0]
    assert new["reproducer"] == (f"target={T} artifact=artifacts/{rev_of('r2')}/{T}/tc/artifact.tar.zst "
                                 f"sha256={'a' * 64} suite=unit test=lim seed=7")
    assert new["rerun_record"]["worker"] == "w2" and new["rerun_record"]["other_worker"] is True
    assert "FAIL limits" in new["log_tail"]
    txt = report.render_text(rep)
    order = [txt.index(s) for s in (rep.headline, "MATRIX", "NEW FAILURES (1)", "FIXED (1)", "FLAKY (1)",
                                    "KNOWN FAILURES (1)")]
    assert order == sorted(order), txt
    assert "failing since run r1" in txt
    html = report.render_html(rep)
    order = [html.index(s) for s in ('id="headline"', 'id="matrix"', 'id="new"', 'id="fixed"', 'id="flaky"',
                                     'id="known"')]
    assert order == sorted(order)
    db.engine.dispose()


def test_history_of_labels_each_result_with_its_verdict(db_url: str) -> None:
    db = ResultsDB(db_url)
    add_run(db, "r1", 1.0, {T: {"lim": "passed"}})
    add_run(db, "r2", 2.0, {T: {"lim": "failed"}}, reruns={T: {"lim": "failed"}})
    add_run(db, "r3", 3.0, {T: {"lim": "failed"}})
    add_run(db, "r4", 4.0, {T: {"lim": "passed"}})
    rows = history.history_of(db, "unit/lim")
    assert [r[0].run_id for r in rows] == ["r1", "r2", "r3", "r4"]  # the re-run is not a run of its own
    labels = [r[4] for r in rows]
    assert labels[0] == "passed" and labels[1].startswith("new")
    assert labels[2].startswith("known (since r2") and labels[3].startswith("fixed (since r2")
    db.engine.dispose()


# ------------------------------------------------------------------------ nightly sequence

BREAK_OLD = 'CHECK(mkidx(db, "", GFE_BTREE, 0, 0, 0) == GFE_EINVAL, "empty index name accepted");'
BREAK_NEW = 'CHECK(mkidx(db, "", GFE_BTREE, 0, 0, 0) == GFE_OK, "empty index name accepted");'
FLAKY_OLD = "static const char *t_crud_btree(void) { return t_crud(GFE_BTREE); }"
# "Fails at random", made deterministic for the test: it fails when the token file exists and
# consumes it, so exactly one attempt fails and the next passes, as an intermittent failure does.
FLAKY_NEW = """static const char *t_crud_btree(void)
{
    const char *token = getenv("GFE_FLAKY_TOKEN");
    if (token && *token && remove(token) == 0) return "failed at random";
    return t_crud(GFE_BTREE);
}"""


class SMTPSink:
    """A real SMTP server on loopback (aiosmtpd) that keeps every message it receives."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        from gearfarm.hosts.net import free_port

        self.messages: list[email.message.EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self._lock = threading.Lock()
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]  # noqa: N802
        with self._lock:
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
            self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))  # type: ignore[arg-type]
        return "250 OK"

    def for_run(self, run_id: str) -> list[email.message.EmailMessage]:
        """The messages covering ``run_id`` (a nightly's one message lists all its runs)."""
        with self._lock:
            return [m for m in self.messages if run_id in str(m["X-Gearfarm-Run"]).split(", ")]


class LabFarm:
    """gearmand, MinIO, the collector, a build worker and two test workers for one target, all
    from a lab config (so the results database can be PostgreSQL), with mail to an SMTP sink."""

    def __init__(self, base: Path, repo: Path, db_url: str, smtp_port: int) -> None:
        from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig, MailConfig, dump
        from gearfarm.hosts.gearmand import Gearmand
        from gearfarm.hosts.minio_server import MinioServer
        from tests.farmkit import keyed

        self.base, self.procs = base, []  # type: ignore[var-annotated]
        # Jobs run confined: the token's directory and variable are shared with them on purpose.
        (base / "flaky").mkdir()
        self.token = base / "flaky" / "flaky.token"
        self.gearmand = Gearmand(base / "gearmand").start()
        self.minio = MinioServer(base / "minio").start()
        host, port = self.gearmand.address
        self.cfg = Config(gearman=GearmanConfig(servers=[f"{host}:{port}"]), s3=self.minio.s3_config(),
                          database=DatabaseConfig(url=db_url),
                          mail=MailConfig(host="127.0.0.1", port=smtp_port, sender="farm@example.org",
                                          recipients=["dev@example.org", "qa@example.org"], retries=1),
                          farm=FarmConfig(repo=str(repo), state_dir=str(base / "state"), **keyed(base, db_url),
                                          no_worker_wait=30.0, sandbox_shared=[str(base / "flaky")],
                                          sandbox_env=["GFE_FLAKY_TOKEN"]))
        self.config = base / "lab.toml"
        dump(self.cfg, self.config)

    def start(self) -> LabFarm:
        from gearfarm.gearman import admin
        from gearfarm.hosts import process

        env = dict(os.environ, PYTHONUNBUFFERED="1", GFE_FLAKY_TOKEN=str(self.token))
        for name, args in (("collector", ["collector"]),
                           ("build", ["worker", "--role", "build", "--targets", T]),
                           ("test-a", ["worker", "--role", "test", "--targets", T]),
                           ("test-b", ["worker", "--role", "test", "--targets", T])):
            argv = [sys.executable, "-m", "gearfarm.cli", *args, "--config", str(self.config)]
            self.procs.append(process.spawn(argv, self.base / "logs" / f"{name}.log", env=env,
                                            cwd=Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + 60
        while True:
            fns = admin.status(*self.gearmand.address)
            if all(fn in fns and fns[fn].workers >= n for fn, n in
                   (("collect", 1), (f"build:{T}", 1), (f"test:{T}", 2))):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"lab workers did not register: {fns}")
            time.sleep(0.3)

    def stop(self) -> None:
        from gearfarm.hosts import process

        for p in self.procs:
            process.stop(p, timeout=10)
        self.minio.stop()
        self.gearmand.stop()


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LabFarm, SMTPSink, Path]]:
    from tests.farmkit import commit, make_repo

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'results.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    repo = make_repo(tmp_path / "repo")
    suite = repo / "engine" / "tools" / "suite.c"
    src = suite.read_text()
    assert FLAKY_OLD in src and BREAK_OLD in src, "engine/tools/suite.c changed: update the test's edits"
    suite.write_text(src.replace(FLAKY_OLD, FLAKY_NEW))
    commit(repo, "crud_btree can fail at random")
    sink = SMTPSink()
    sink.controller.start()
    farm = LabFarm(tmp_path, repo, url, sink.port)
    try:
        farm.start()
        yield farm, sink, repo
    finally:
        farm.stop()
        sink.controller.stop()


def _nightly(farm: LabFarm, run_id: str) -> tuple[int, str, dict]:  # type: ignore[type-arg]
    from tests.farmkit import gearfarm

    p = gearfarm("nightly", "--config", str(farm.config), "--targets", T, "--suites", "unit",
                 "--benchmarks", "none", "--run-id", run_id,
                 timeout=600)
    rep_path = farm.base / "state" / "runs" / run_id / "report.json"
    rep = json.loads(rep_path.read_text()) if rep_path.exists() else {}
    return p.returncode, p.stdout + p.stderr, rep


def _names(rep: dict, kind: str) -> list[str]:  # type: ignore[type-arg]
    return sorted(x["test"] for x in rep[kind])


@pytest.mark.slow
@pytest.mark.parametrize("lab", ["sqlite", "postgresql"], indirect=True)
def test_nightly_sequence_names_new_known_fixed_and_flaky(lab: tuple[LabFarm, SMTPSink, Path]) -> None:
    from tests.farmkit import commit, gearfarm

    farm, sink, repo = lab
    suite = repo / "engine" / "tools" / "suite.c"

    code, out, rep = _nightly(farm, "s1")
    assert code == 0, out
    assert rep["headline"].startswith("all green"), rep["headline"]

    suite.write_text(suite.read_text().replace(BREAK_OLD, BREAK_NEW))
    broken = commit(repo, "break limits_and_bad_arguments")
    code, out, rep = _nightly(farm, "s2")
    assert code == 1, out
    assert _names(rep, "new") == ["unit/limits_and_bad_arguments"]
    assert rep["known"] == [] and rep["flaky"] == [] and rep["fixed"] == []
    new = rep["new"][0]
    assert new["rerun"] == "failed" and new["rerun_record"]["status"] == "failed"  # confirmed on its re-run
    assert new["rerun_record"]["worker"]  # which worker ran the re-run is on record
    assert "test=limits_and_bad_arguments" in new["reproducer"] and "sha256=" in new["reproducer"]
    assert rep["headline"] == "1 new failure" and rep["rev"] == broken

    farm.token.write_text("fail once")
    commit(repo, "an unrelated change")
    code, out, rep = _nightly(farm, "s3")
    assert code == 1, out
    assert not farm.token.exists(), "the random failure did not happen"
    assert rep["new"] == [], rep["new"]
    assert _names(rep, "known") == ["unit/limits_and_bad_arguments"]
    assert rep["known"][0]["since_run"] == "s2" and rep["known"][0]["since_rev"] == broken
    assert _names(rep, "flaky") == ["unit/crud_btree"]
    flaky = rep["flaky"][0]
    # The test passed on the re-run, though the re-run of its suite failed (the known failure).
    assert flaky["rerun"] == "passed" and flaky["rerun_record"]["status"] == "passed"
    assert flaky["rerun_record"]["job_status"] == "failed"
    assert rep["headline"] == "1 still failing, 1 flaky"

    suite.write_text(suite.read_text().replace(BREAK_NEW, BREAK_OLD))
    commit(repo, "fix limits_and_bad_arguments")
    code, out, rep = _nightly(farm, "s4")
    assert code == 0, out
    assert _names(rep, "fixed") == ["unit/limits_and_bad_arguments"]  # not crud_btree: it was flaky
    assert rep["fixed"][0]["since_run"] == "s2"
    assert rep["new"] == rep["known"] == rep["flaky"] == []
    assert rep["headline"].startswith("all green") and rep["headline"].endswith("1 fixed")

    # One aggregated mail per run, reached the SMTP server, with the same content as the report.
    for run_id, headline in (("s2", "1 new failure"), ("s3", "1 still failing, 1 flaky")):
        msgs = sink.for_run(run_id)
        assert len(msgs) == 1
        assert headline in msgs[0]["Subject"]
    assert sorted(sink.envelopes[0][1]) == ["dev@example.org", "qa@example.org"]
    body = sink.for_run("s2")[0].get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "NEW FAILURES (1)" in body and "limits_and_bad_arguments" in body

    p = gearfarm("history", "unit/limits_and_bad_arguments", "--config", str(farm.config))
    assert p.returncode == 0, p.stderr
    lines = {ln.split()[1]: ln for ln in p.stdout.splitlines() if ln.strip().startswith("│ s")}
    assert "passed" in lines["s1"] and " new " in lines["s2"]
    assert "known (since s2" in lines["s3"] and "fixed (since s2" in lines["s4"]
    assert set(lines) == {"s1", "s2", "s3", "s4"}  # re-runs are not listed as runs

    db = ResultsDB(farm.cfg.database.url)
    child = db.get_run("s3.rerun")
    assert child is not None and child.parent_run_id == "s3"
    assert set(child.notes["workers"]) == {f"s3.rerun:{T}:test-unit"}
    assert db.get_run("s4.rerun") is None  # nothing new, nothing re-run
    db.engine.dispose()
