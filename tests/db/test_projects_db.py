"""Projects in the results database, on SQLite and on PostgreSQL: a database from before projects
upgrades with every run marked "engine" and stays the engine's history; classification, "last
good build" and performance series never cross projects, even for tests, targets and
benchmarks of the same names; each run's job catalog is stored once by content and gives the
directions of its metrics; a re-run is of its parent's project and catalog."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, func, select, text

from gearfarm.db import history
from gearfarm.db.results import Base, CatalogRow, ResultsDB, alembic_config, current_revision
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.result import ResultRecord, Sample
from gearfarm.perf import analysis as perf
from gearfarm.run.ledger import Ledger
from tests.db.test_history import T, add_run, rev_of, verdicts

CATALOG = """
schema = 2

[build]
argv = ["make"]
outputs = ["out/**"]

[targets.linux-x86_64]
perf = true

[benchmarks.iibench]
argv = ["bench"]
metrics_file = "{scratch}/metrics.json"
metrics = { rate = "higher", latency = "lower" }
"""


def catalog(body: str = CATALOG) -> tuple[str, str]:
    return catalog_mod.digest(body), body


# ------------------------------------------------------------------------------- migration

def test_a_0004_database_upgrades_with_every_run_the_engines_and_its_history_kept(db_url: str) -> None:
    engine = create_engine(db_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        for rid, parent, at in (("old", None, 1.0), ("old.rerun", "old", 2.0)):
            conn.execute(text("INSERT INTO runs (run_id, rev, created_at, expected, targets, state, notes, "
                              "parent_run_id, reported_at) VALUES (:rid, :rev, :at, :exp, :targets, 'finished', "
                              "'{}', :parent, :at)"),
                         {"rid": rid, "rev": rev_of("old"), "at": at, "exp": json.dumps([f"{rid}:{T}:test-unit"]),
                          "targets": json.dumps([T]), "parent": parent})
        rec = {"job_id": f"old:{T}:test-unit", "run_id": "old", "target": T, "kind": "test", "step": "test-unit",
               "name": "unit", "rev": rev_of("old"), "status": "failed"}
        conn.execute(text("INSERT INTO jobs (job_id, run_id, target, kind, step, status, attempt, worker, record, "
                          "prio, digest) VALUES (:jid, 'old', :t, 'test', 'test-unit', 'failed', 1, 'w', :rec, 1, "
                          "'d')"), {"jid": rec["job_id"], "t": T, "rec": json.dumps(rec)})
        conn.execute(text("INSERT INTO cases (job_id, run_id, target, suite, classname, name, status, time, message) "
                          "VALUES (:jid, 'old', :t, 'unit', '', 'lim', 'failed', 0, '')"),
                     {"jid": rec["job_id"], "t": T})
    engine.dispose()

    db = ResultsDB(db_url)
    assert current_revision(db.engine) == "0014"
    for rid in ("old", "old.rerun"):
        run = db.get_run(rid)
        assert run is not None and run.project == "engine" and run.catalog_sha256 is None
    assert db.projects() == ["engine"] and db.catalog_of(db.get_run("old")) is None  # type: ignore[arg-type]
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    # The old runs are the engine's history: a failure that was there before is known, not new.
    add_run(db, "new", 5.0, {T: {"lim": "failed"}}, catalog=catalog())
    v = verdicts(db, "new")[(T, "lim")]
    assert (v.kind, v.since_run) == ("known", "old")
    db.engine.dispose()


def test_downgrade_from_0005_and_up_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = ResultsDB(url)
    add_run(db, "z1", 1.0, {T: {"a": "passed"}}, project="zlibish", catalog=catalog())
    with db.engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0004")
    db.engine.dispose()
    db = ResultsDB(url)  # up again: the run is kept, now as the engine's (0004 knew no projects)
    run = db.get_run("z1")
    assert run is not None and run.project == "engine" and run.catalog_sha256 is None
    db.engine.dispose()


# --------------------------------------------------------------------------------- history

def test_history_never_crosses_projects(db_url: str) -> None:
    db = ResultsDB(db_url)
    # zlibish has had unit/lim failing on T for five runs (its re-runs confirm it).
    for i in range(1, 6):
        add_run(db, f"z{i}", float(i), {T: {"lim": "failed", "ok": "passed"}}, project="zlibish",
                reruns={T: {"lim": "failed"}} if i == 1 else None)
    assert db.get_run("z1.rerun").project == "zlibish"  # type: ignore[union-attr]
    # The engine's test of the same name on the same target fails for the first time.
    add_run(db, "e1", 6.0, {T: {"lim": "failed", "ok": "passed"}})
    v = verdicts(db, "e1")[(T, "lim")]
    assert v.kind == "new" and v.reason == "no earlier result on this target" and v.history == ["failed"]
    add_run(db, "e2", 7.0, {T: {"lim": "passed", "ok": "passed"}})
    add_run(db, "z6", 8.0, {T: {"lim": "failed", "ok": "passed"}}, project="zlibish")
    add_run(db, "e3", 9.0, {T: {"lim": "failed", "ok": "passed"}})
    assert verdicts(db, "e2")[(T, "lim")].kind == "fixed"
    z6 = verdicts(db, "z6")[(T, "lim")]
    assert (z6.kind, z6.since_run) == ("known", "z1")  # the engine's pass in between is not zlibish's
    e3 = verdicts(db, "e3")[(T, "lim")]
    assert e3.kind == "new" and "passed in run e2" in e3.reason

    assert [r.run_id for r in db.runs_before(9.5, "engine", T)] == ["e3", "e2", "e1"]
    assert [r.run_id for r in db.runs(project="zlibish")] == ["z6", "z5", "z4", "z3", "z2", "z1"]
    assert len(db.runs()) == 9 and db.projects() == ["engine", "zlibish"]

    rows = history.history_of(db, "unit/lim", project="engine")
    assert [(r.run_id, label.split()[0]) for r, *_, label in rows] == [("e1", "new"), ("e2", "fixed"),
                                                                      ("e3", "new")]
    both = history.history_of(db, "unit/lim")
    labels = {r.run_id: label for r, *_, label in both}
    assert len(both) == 9 and labels["e1"].split()[0] == "new" and labels["z6"].startswith("known (since z1")
    db.engine.dispose()


def test_a_rerun_is_of_its_parents_project_and_catalog(db_url: str) -> None:
    db = ResultsDB(db_url)
    sha, body = catalog()
    assert db.create_run("z1", rev_of("z1"), [T], [], project="zlibish", catalog=(sha, body))
    assert db.create_run("z1.rerun", rev_of("z1"), [T], [], parent_run_id="z1")
    child = db.get_run("z1.rerun")
    assert child is not None and (child.project, child.catalog_sha256) == ("zlibish", sha)
    with pytest.raises(ValueError, match="project"):
        db.create_run("z1.rerun2", rev_of("z1"), [T], [], parent_run_id="z1", project="engine")
    with pytest.raises(ValueError, match="digest"):
        db.create_run("bad", rev_of("z1"), [T], [], catalog=("0" * 64, body))
    assert db.get_run("z1.rerun2") is None and db.get_run("bad") is None
    db.engine.dispose()


def test_the_last_good_build_is_the_projects_own(db_url: str) -> None:
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    for rid, at, project in (("e1", 1.0, "engine"), ("z1", 2.0, "zlibish")):
        jid = f"{rid}:{T}:build"
        db.create_run(rid, rev_of(rid), [T], [jid], created_at=at, project=project)
        assert ledger.apply(ResultRecord(job_id=jid, run_id=rid, target=T, kind="build", step="build",
                                         rev=rev_of(rid), status="passed", artifact_key=f"artifacts/{rid}",
                                         artifact_sha256="a" * 64), "collect") == "applied"
    build = db.last_good_build("engine", T, exclude_rev="f" * 40)
    assert build is not None and build.run_id == "e1"
    build = db.last_good_build("zlibish", T, exclude_rev="f" * 40)
    assert build is not None and build.run_id == "z1"
    assert db.last_good_build("zlibish", T, exclude_rev=rev_of("z1")) is None
    db.engine.dispose()


def test_the_reference_build_stays_pinned_for_its_nights_then_is_replaced(db_url: str) -> None:
    # issue #12: the perf jobs' third side. The nightly pins the last good build when there is no
    # reference yet; the next nights keep it until `nights` nights have used it; a night whose
    # build failed (no perf record) neither uses nor ends it; then it is time to pin anew.
    db = ResultsDB(db_url)
    ledger = Ledger(db)

    def night(rid: str, at: float, reference: str | None, build_ok: bool = True) -> None:
        jids = [f"{rid}:{T}:build"] + ([f"{rid}:{T}:perf-iibench"] if reference else [])
        db.create_run(rid, rev_of(rid), [T], jids, created_at=at)
        assert ledger.apply(ResultRecord(job_id=jids[0], run_id=rid, target=T, kind="build", step="build",
                                         rev=rev_of(rid), status="passed" if build_ok else "failed",
                                         artifact_key=f"artifacts/{rid}" if build_ok else None,
                                         artifact_sha256="a" * 64 if build_ok else None), "collect") == "applied"
        if reference:
            assert ledger.apply(ResultRecord(job_id=jids[1], run_id=rid, target=T, kind="perf", step="perf-iibench",
                                             name="iibench", rev=rev_of(rid), status="passed",
                                             reference_rev=rev_of(reference)), "collect") == "applied"

    assert db.reference_build("engine", T, 3) is None  # nothing pinned yet
    night("r1", 1.0, None)
    night("r2", 2.0, "r1")  # pinned tonight: r1's build
    ref = db.reference_build("engine", T, 3)
    assert ref is not None and (ref.rev, ref.key) == (rev_of("r1"), "artifacts/r1")
    night("r3", 3.0, None, build_ok=False)
    night("r4", 4.0, "r1")
    assert db.reference_build("engine", T, 3) == ref
    assert db.reference_build("engine", T, 0) is None  # no reference at all
    night("r5", 5.0, "r1")  # the third night on r1
    assert db.reference_build("engine", T, 3) is None
    assert db.reference_build("engine", T, 4) == ref
    night("r6", 6.0, "r5")
    ref6 = db.reference_build("engine", T, 3)
    assert ref6 is not None and ref6.rev == rev_of("r5")
    db.engine.dispose()


# ----------------------------------------------------------------------------- performance

def _perf_run(db: ResultsDB, rid: str, at: float, project: str, value: float,
              cat: tuple[str, str] | None) -> None:
    jid = f"{rid}:{T}:perf-iibench"
    db.create_run(rid, rev_of(rid), [T], [jid], created_at=at, project=project, catalog=cat)
    samples = [Sample(benchmark="iibench", metric="rate", value=value * (1 + 0.002 * (k - 1)), repetition=k)
               for k in range(3)]
    rec = ResultRecord(job_id=jid, run_id=rid, target=T, kind="perf", step="perf-iibench", name="iibench",
                       rev=rev_of(rid), status="passed", samples=samples,
                       host={"hostname": "h1", "cpu": "cpu", "cores": "4", "mem_gib": "8", "class": "c"})
    assert Ledger(db).apply(rec, "collect") == "applied"


def test_performance_series_never_cross_projects(db_url: str) -> None:
    db = ResultsDB(db_url)
    # zlibish declares rate lower-is-better in its catalog; the engine stored none (higher is
    # the default). Its rate drops 20 % on night 7; the engine's stays flat around 1000, and
    # mixed into one series the two would be one long run of steps.
    zcat = catalog(CATALOG.replace('rate = "higher"', 'rate = "lower"'))
    for night in range(10):
        wobble = 1 + 0.01 * math.sin(night * 2.1)
        _perf_run(db, f"e{night}", night * 10 + 1.0, "engine", 1000 * wobble, None)
        _perf_run(db, f"z{night}", night * 10 + 2.0, "zlibish", (100 if night < 7 else 80) * wobble, zcat)
    series = db.perf_series("engine", T, "c", "iibench", "rate", 1e9, 60)
    assert [rid for rid, _, _ in series] == [f"e{n}" for n in range(10)]
    assert all(900 < v for _, _, vals in series for v in vals["new"])
    assert [rid for rid, _, _ in db.perf_series("zlibish", T, "c", "iibench", "rate", 1e9, 60)] == \
        [f"z{n}" for n in range(10)]
    assert db.perf_keys("z9") == [(T, "c", "iibench", "rate")]

    assert perf.analyze(db, db.get_run("e9")) == []  # type: ignore[arg-type]
    (change,) = perf.analyze(db, db.get_run("z9"))  # type: ignore[arg-type]
    assert change["first_bad_run"] == "z7" and change["first_bad_rev"] == rev_of("z7")
    assert change["direction"] == "improvement" and change["higher_is_better"] is False
    db.engine.dispose()


# -------------------------------------------------------------------------------- catalogs

def test_the_catalog_is_stored_once_and_gives_the_metric_directions(db_url: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    db = ResultsDB(db_url)
    sha, body = catalog()
    add_run(db, "e1", 1.0, {T: {"a": "passed"}}, catalog=(sha, body))
    add_run(db, "z1", 2.0, {T: {"a": "passed"}}, catalog=(sha, body), project="zlibish")
    run = db.get_run("e1")
    assert run is not None and run.catalog_sha256 == sha and db.catalog_text(sha) == body
    with db.session() as s:
        assert s.scalar(select(func.count()).select_from(CatalogRow)) == 1
    assert perf.directions(db, run) == {("iibench", "rate"): True, ("iibench", "latency"): False}
    cat = db.catalog_of(run)
    assert cat is not None and cat.benchmarks["iibench"].metrics == {"rate": "higher", "latency": "lower"}

    caplog.set_level(logging.WARNING, logger="gearfarm.db.results")
    add_run(db, "e2", 3.0, {T: {"a": "passed"}})
    assert perf.directions(db, db.get_run("e2")) == {}  # type: ignore[arg-type]
    assert "run e2 has no stored job catalog" in caplog.text
    broken = catalog("schema = 2\n[build]\n")
    add_run(db, "e3", 4.0, {T: {"a": "passed"}}, catalog=broken)
    assert db.catalog_of(db.get_run("e3")) is None  # type: ignore[arg-type]
    assert "the stored catalog of run e3 does not parse" in caplog.text
    assert db.catalog_text("0" * 64) is None
    db.engine.dispose()
