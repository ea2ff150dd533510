"""The run ledger's rules (gearfarm.run.ledger), on SQLite and on a real PostgreSQL: the final state
does not depend on the order records arrive in, a product result is never replaced by a
farm-made status, an older attempt never wins, a re-delivery changes nothing, results after
the report are late, unknown jobs and forged records are rejected, a failed build ends its
dependents, and concurrent writers on PostgreSQL neither lose nor duplicate a row."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import update

from gearfarm.db.results import LeaseRow, ResultsDB
from gearfarm.formats.job import JobId
from gearfarm.formats.lease import TAKEOVER, Lease, seal_lease
from gearfarm.formats.result import CaseResult, ResultRecord, Sample, pack_file, seal_record
from gearfarm.formats.seal import Signer, seal
from gearfarm.run.ledger import Ledger, farm_record
from tests.farmkit import claim

REV = "a" * 40
T = "linux-x86_64"
T_ = TypeVar("T_")


def rec(jid: JobId, status: str, attempt: int = 1, finished: float = 1000.0, case: str = "c1") -> ResultRecord:
    return ResultRecord(job_id=str(jid), run_id=jid.run_id, target=jid.target, kind=jid.kind, step=jid.step,
                        name=jid.name, rev=REV, status=status, attempt=attempt, worker=f"w{attempt}",  # type: ignore[arg-type]
                        started_at=finished - 1, finished_at=finished,
                        host={"hostname": "h", "cpu": "c", "cores": "2", "mem_gib": "8", "class": "x"},
                        cases=[CaseResult(name=case, status="passed" if status == "passed" else "failed")])


def new_run(db: ResultsDB, run_id: str, steps: list[str]) -> list[JobId]:
    jids = [JobId(run_id, T, s) for s in steps]
    assert db.create_run(run_id, REV, [T], [str(j) for j in jids])
    return jids


def row(db: ResultsDB, jid: JobId) -> ResultRecord:
    return next(r for r in db.jobs(jid.run_id) if r.job_id == str(jid))


def test_every_arrival_order_gives_the_same_final_state(db_url: str) -> None:
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    jid_of = {}
    records = {
        "a1 passed": ("test-unit", "passed", 1, 1000.0),
        "a2 failed": ("test-unit", "failed", 2, 900.0),  # newer attempt, earlier clock: attempt wins
        "deadline infra": ("test-unit", "infra", 3, 2000.0),  # farm-made, even of a later attempt: loses
        "no worker": ("test-unit", "no_worker", 1, 500.0),
    }
    finals = set()
    for n, order in enumerate(itertools.permutations(records)):
        (jid,) = new_run(db, f"p{n}", ["test-unit"])
        jid_of[n] = jid
        for name in order:
            step, status, attempt, fin = records[name]
            r = rec(jid, status, attempt, fin) if status in ("passed", "failed") else \
                farm_record(jid, REV, status, name, attempt)
            ledger.apply(r, "collect")
        got = row(db, jid)
        finals.add((got.status, got.attempt))
    assert finals == {("failed", 2)}


def test_rules_outcomes_and_what_they_leave(db_url: str) -> None:
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    build, unit, perf = new_run(db, "r1", ["build", "test-unit", "perf-oltp"])
    a2 = rec(unit, "passed", 2, case="second")
    assert ledger.apply(a2, "collect") == "applied"
    assert ledger.apply(a2, "reconcile") == "duplicate"  # the very same record again
    old = rec(unit, "failed", 1, 5000.0, case="first")
    assert ledger.apply(old, "reconcile") == "superseded"
    assert ledger.apply(farm_record(unit, REV, "infra", "deadline", 2), "nightly") == "superseded"
    got = row(db, unit)
    assert (got.status, got.attempt, [c.name for c in got.cases]) == ("passed", 2, ["second"])
    assert [c[3] for c in db.cases_in(["r1"])] == ["second"]  # the cases follow the row
    # A build that fails ends its dependents, but a product result already there stays.
    assert ledger.apply(rec(build, "infra"), "collect") == "applied"
    assert row(db, perf).status == "skipped" and "build ended infra" in row(db, perf).message
    assert row(db, unit).status == "passed"
    # A job the run does not expect, and a record whose fields contradict its id.
    other = JobId("r1", T, "test-recovery")
    assert ledger.apply(rec(other, "passed"), "collect") == "rejected"
    lying = rec(unit, "passed", 3).model_copy(update={"target": "linux-i686"})
    assert ledger.apply(lying, "collect") == "rejected"
    assert ledger.apply(rec(JobId("nope", T, "build"), "passed"), "collect") == "rejected"
    # After the report: late, never changing the row; the same late record twice is one.
    ledger.close("r1")
    # Re-deliveries after the report of records ranked before it are no news: duplicates.
    assert ledger.apply(a2, "reconcile") == "duplicate"
    assert ledger.apply(old, "collect") == "duplicate"
    late = rec(unit, "failed", 7)
    assert ledger.apply(late, "collect") == "late"
    assert ledger.apply(late, "reconcile") == "duplicate"
    assert row(db, unit).status == "passed"
    assert [(r.status, r.attempt) for _, r in db.late_results("r1")] == [("failed", 7)]
    counts = db.delivery_counts()
    assert counts["rejected"] == 3 and counts["late"] == 1 and counts["superseded"] >= 2


def test_the_first_run_of_an_attempt_to_finish_is_its_result(db_url: str) -> None:
    """gearmand replays a job after a restart: the replay (later, maybe only reusing the
    artifact) never replaces the run that finished first, whichever record arrives first."""
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    first, replay = None, None
    for n, order in enumerate(((0, 1), (1, 0))):
        (jid,) = new_run(db, f"same{n}", ["build"])
        first = rec(jid, "passed", 1, 1000.0, case="did-the-work")
        replay = rec(jid, "passed", 1, 1060.0, case="reused")
        for i in order:
            ledger.apply((first, replay)[i], "collect")
        assert [c.name for c in row(db, jid).cases] == ["did-the-work"]
        assert [c[3] for c in db.cases_in([jid.run_id])] == ["did-the-work"]  # the replaced one's cases went


def test_only_a_registered_host_signs_and_only_what_it_does(tmp_path: Path) -> None:
    """A record is applied only when the key that signed it is registered (not revoked) for the
    record's role and target, the record names that host, the attempt was submitted and that
    host holds its lease: what any other holder of a worker host's files could forge is
    rejected and counted."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    ledger = Ledger(db)
    unit, build = JobId("r1", T, "test-unit"), JobId("r1", T, "build")
    other = JobId("r1", "linux-aarch64", "test-unit")
    assert db.create_run("r1", REV, [T, other.target], [str(unit), str(build), str(other)])
    db.set_live("r1", {str(j): ("queued", 1) for j in (unit, build, other)})
    host, peer, stranger = Signer.generate(), Signer.generate(), Signer.generate()
    ledger.registry.add("h", host.public_text, ["test"], [T])
    ledger.registry.add("h2", peer.public_text, ["test"], [T])

    # The lease: the first registered host to claim an attempt holds it.
    assert claim(ledger, host, str(unit), 1, "h") == "granted"
    assert claim(ledger, peer, str(unit), 1, "h2", worker="w2") == "held"
    assert claim(ledger, stranger, str(unit), 1, "h", worker="w3") == "refused"
    assert claim(ledger, host, str(unit), 100, "h") == "refused"
    assert claim(ledger, host, str(build), 1, "h") == "refused"

    good = rec(unit, "passed")
    assert ledger.accept(seal_record(good, host), "collect")[0] == "applied"
    # Delivered: no copy of the attempt runs after it.
    assert claim(ledger, host, str(unit), 1, "h", worker="w4") == "done"
    refused = {
        "an unregistered key": seal_record(rec(unit, "failed"), stranger),
        "an edited record": seal_record(good, host).replace(b'"passed"', b'"failed"'),
        "no envelope": good.model_copy(update={"status": "failed"}).model_dump_json().encode(),
        "garbage": b"\x00garbage",
        "a build record of a test host": seal_record(rec(build, "failed"), host),
        "another target's record": seal_record(rec(other, "passed"), host),
        "another host named": seal_record(rec(unit, "failed").model_copy(update={"host": {"hostname": "h2"}}), host),
        "an attempt never submitted": seal_record(rec(unit, "failed", attempt=100), host),
        "a status only the farm decides": seal_record(rec(unit, "skipped"), host),
        "a registered host that does not hold the lease": seal_record(
            rec(unit, "failed", finished=10.0).model_copy(update={"host": {"hostname": "h2"}}), peer),
    }
    for what, data in refused.items():
        assert ledger.accept(data, "collect")[0] == "rejected", what
    assert row(db, unit).status == "passed" and [r.job_id for r in db.jobs("r1")] == [str(unit)]
    assert db.delivery_counts()["rejected"] == len(refused)
    reasons = [d.reason for d in db.deliveries("r1")]
    assert any("registered for test on linux-x86_64, not build on linux-x86_64" in r for r in reasons)
    assert any("attempt 100 of r1:linux-x86_64:test-unit was never submitted" in r for r in reasons)
    assert any("attempt 1 of r1:linux-x86_64:test-unit is leased to host h, not h2" in r for r in reasons)

    # Rotation without downtime: the host's new key is added, both sign, the old one is revoked.
    new = Signer.generate()
    ledger.registry.add("h", new.public_text, ["test"], [T])
    db.set_live("r1", {str(unit): ("queued", 3)})
    assert claim(ledger, host, str(unit), 2, "h") == claim(ledger, new, str(unit), 3, "h") == "granted"
    assert ledger.accept(seal_record(rec(unit, "passed", 2), host), "collect")[0] == "applied"
    ledger.registry.revoke(host.kid)
    assert ledger.accept(seal_record(rec(unit, "failed", 3), host), "collect")[0] == "rejected"
    assert ledger.accept(seal_record(rec(unit, "passed", 3), new), "collect")[0] == "applied"
    assert any(f"signed by key {host.kid} of host h, revoked" in d.reason for d in db.deliveries("r1"))


def test_a_dead_holders_lease_is_taken_over_and_a_live_ones_is_not(db_url: str) -> None:
    """Each attempt runs once: a second worker's claim waits while the holder beats, takes over
    when the holder has been silent for the takeover time, and the old holder's beats then no
    longer count."""
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    (unit,) = new_run(db, "r2", ["test-unit"])
    db.set_live("r2", {str(unit): ("queued", 1)})
    a, b = Signer.generate(), Signer.generate()
    ledger.registry.add("ha", a.public_text, ["test"], [T])
    ledger.registry.add("hb", b.public_text, ["test"], [T])
    assert claim(ledger, a, str(unit), 1, "ha", "wa") == "granted"
    assert claim(ledger, b, str(unit), 1, "hb", "wb") == "held"
    with db.writing() as conn:  # the holder's last beat, TAKEOVER seconds ago
        conn.execute(update(LeaseRow).values(beat_at=time.time() - TAKEOVER - 1))
    assert claim(ledger, b, str(unit), 1, "hb", "wb") == "granted"
    assert db.leases("r2")[(str(unit), 1)][0] == "hb"
    beat = Lease(job_id=str(unit), attempt=1, host="ha", worker="wa", beat=7)
    assert ledger.lease(seal_lease(beat, a))[0] == "held"  # the old holder's beat is not the lease's
    assert ledger.accept(seal_record(rec(unit, "passed").model_copy(update={"host": {"hostname": "ha"}}), a),
                         "collect")[0] == "rejected"


def race(writers: int, offered: list[T_], offer: Callable[[Ledger, T_], object], url: str) -> None:
    """``writers`` threads, each with its own ledger and pool (like collectors and nightlies),
    offer every one of ``offered`` in an order of their own, all starting at once; what any
    of them raised is raised here."""
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def writer(seed: int) -> None:
        try:
            ledger = Ledger(ResultsDB(url))
            mine = offered[:]
            random.Random(seed).shuffle(mine)
            start.wait()
            for each in mine:
                offer(ledger, each)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_concurrent_writers_on_postgresql_lose_and_duplicate_nothing(pg_url: str) -> None:
    """Eight writers (each its own connection pool, like collectors and nightlies) offer
    the same shuffled records at once: every job ends with its newest attempt, once."""
    setup = ResultsDB(pg_url)
    jobs = new_run(setup, "conc", [f"test-s{i}" for i in range(12)])
    offered = [rec(j, random.Random(a).choice(["passed", "failed"]), a, 1000.0 + a) for j in jobs for a in (1, 2, 3)]
    t0 = time.monotonic()
    race(8, offered, lambda ledger, r: ledger.apply(r, "collect"), pg_url)
    rows = setup.jobs("conc")
    assert len(rows) == len({r.job_id for r in rows}) == len(jobs)
    assert all(r.attempt == 3 for r in rows)
    with setup.session() as s:
        from sqlalchemy import func, select

        from gearfarm.db.results import Case, DeliveryRow

        n_deliveries = s.scalar(select(func.count()).select_from(DeliveryRow).where(DeliveryRow.run_id == "conc"))
        applied_per_job = dict(s.execute(select(DeliveryRow.job_id, func.count()).where(
            DeliveryRow.run_id == "conc", DeliveryRow.outcome == "applied").group_by(DeliveryRow.job_id)).all())
        n_cases = s.scalar(select(func.count()).select_from(Case).where(Case.run_id == "conc"))
    assert n_deliveries == 8 * len(offered)  # every offer is accounted for
    assert all(1 <= n <= 3 for n in applied_per_job.values()) and len(applied_per_job) == len(jobs)
    assert n_cases == len(jobs)  # one case per job: replaced, never doubled
    print(f"\n8 writers x {len(offered)} records on PostgreSQL in {time.monotonic() - t0:.1f}s")


def test_a_workers_records_through_accept_end_as_the_rules_say(db_url: str) -> None:
    """What the collector does with a worker's records (``accept``: on PostgreSQL most of them
    in one statement, the rest in the ledger's transaction) ends as the rules say, whichever
    way each went: applied, the same again a duplicate, a newer attempt replacing the row and
    its cases, the older one then superseded, a host without the lease rejected, a failed build
    ending its dependents, after the report late; and the lease of a delivered attempt done."""
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    build, unit, model = new_run(db, "ra", ["build", "test-unit", "test-model"])
    db.set_live("ra", {str(j): ("queued", 3) for j in (build, unit, model)})
    host, peer = Signer.generate(), Signer.generate()
    ledger.registry.add("h", host.public_text, ["test", "build"], [T])
    ledger.registry.add("h2", peer.public_text, ["test"], [T])
    for attempt in (1, 2, 3):
        assert claim(ledger, host, str(unit), attempt, "h") == "granted"
    assert claim(ledger, host, str(build), 1, "h") == "granted"
    assert claim(ledger, host, str(model), 1, "h") == "granted"

    def offer(r: ResultRecord, signer: Signer = host) -> str:
        return ledger.accept(seal_record(r, signer), "collect")[0]

    first = rec(unit, "passed", 1, case="first")
    assert offer(first) == "applied"
    assert claim(ledger, host, str(unit), 1, "h", worker="w9") == "done"
    assert offer(first) == "duplicate"
    second = rec(unit, "failed", 2, 900.0, case="second")
    assert offer(second) == "applied"
    assert [c.name for c in row(db, unit).cases] == ["second"]
    assert [c[3] for c in db.cases_in(["ra"])] == ["second"]  # the first record's case went with it
    assert offer(first) == "superseded"
    assert offer(rec(unit, "passed", 3).model_copy(update={"host": {"hostname": "h2"}}), peer) == "rejected"
    assert offer(rec(build, "failed")) == "applied"
    assert row(db, model).status == "skipped" and "build ended failed" in row(db, model).message
    ledger.close("ra")
    assert offer(rec(unit, "passed", 3, case="third")) == "late"
    got = row(db, unit)
    assert (got.status, got.attempt, [c.name for c in got.cases]) == ("failed", 2, ["second"])
    assert [(d.outcome, d.attempt) for d in db.deliveries("ra") if d.job_id == str(unit)] == [
        ("applied", 1), ("duplicate", 1), ("applied", 2), ("superseded", 1), ("rejected", 3),
        ("superseded", 1),  # the failed build's `skipped` for it: a product result stays
        ("late", 3)]
    assert not [k for k in db.leases("ra") if k[0] == str(unit)]  # every attempt delivered


def test_concurrent_accepts_on_postgresql_lose_duplicate_and_deadlock_nothing(pg_url: str) -> None:
    """Eight collectors (each its own ledger and pool) offer the same shuffled signed records at
    once: the records that are news go in one statement, the others (duplicates, superseded)
    through the ledger's transaction, and both take their locks in one order, so none waits
    for the other forever (PostgreSQL would end one with "deadlock detected"). Every job ends
    with its newest attempt, its cases once, every offer in the deliveries."""
    setup = ResultsDB(pg_url)
    jobs = new_run(setup, "cacc", [f"test-s{i}" for i in range(12)])
    setup.set_live("cacc", {str(j): ("queued", 3) for j in jobs})
    host = Signer.generate()
    first = Ledger(setup)
    first.registry.add("h", host.public_text, ["test"], [T])
    for j in jobs:
        for a in (1, 2, 3):
            assert claim(first, host, str(j), a, "h") == "granted"
    offered = [seal_record(rec(j, random.Random(a).choice(["passed", "failed"]), a, 1000.0 + a), host)
               for j in jobs for a in (1, 2, 3)]
    race(8, offered, lambda ledger, data: ledger.accept(data, "collect"), pg_url)
    rows = setup.jobs("cacc")
    assert len(rows) == len({r.job_id for r in rows}) == len(jobs)
    assert all(r.attempt == 3 for r in rows)
    outcomes = [d.outcome for d in setup.deliveries("cacc")]
    assert len(outcomes) == 8 * len(offered) and "rejected" not in outcomes
    assert len(setup.cases_in(["cacc"])) == len(jobs)  # one case per job: replaced, never doubled


def test_the_ledger_refuses_the_claims_of_a_closed_runs_and_a_cancelled_jobs_attempts(db_url: str) -> None:
    """Who a worker asks whether a job may run: the ledger. A job left in a queue after its run's
    report, and one the nightly recorded cancelled, are refused (the worker then drops them,
    asking S3 nothing), and a running attempt's beat after its cancel is answered `cancelled`
    (its worker stops it); the cancelled job's next attempt (a re-run) may run, one never
    submitted may not. On PostgreSQL each is asked in one statement (_Sql._claim_at_once)."""
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    unit, model = new_run(db, "r3", ["test-unit", "test-model"])
    db.set_live("r3", {str(unit): ("queued", 1), str(model): ("queued", 1)})
    host = Signer.generate()
    ledger.registry.add("h", host.public_text, ["test"], [T])
    assert ledger.apply(farm_record(unit, REV, "cancelled", "the job was cancelled by carol"), "nightly") == "applied"
    lease = Lease(job_id=str(unit), attempt=1, host="h", worker="w", beat=0)
    assert ledger.lease(seal_lease(lease, host)) == ("cancelled", "it was cancelled")
    db.set_live("r3", {str(unit): ("queued", 2)})
    assert claim(ledger, host, str(unit), 3, "h") == "refused"  # never submitted
    assert claim(ledger, host, str(unit), 2, "h") == "granted"
    assert claim(ledger, host, str(unit), 2, "h", worker="w2") == "held"
    # Cancelled while it runs: the holder's next signed beat is answered so (how it learns).
    beat = Lease(job_id=str(unit), attempt=2, host="h", worker="w", beat=1)
    assert ledger.lease(seal_lease(beat, host)) == ("granted", "")
    cancel = farm_record(unit, REV, "cancelled", "the job was cancelled by carol", 2)
    assert ledger.apply(cancel, "nightly") == "applied"
    assert ledger.lease(seal_lease(beat.model_copy(update={"beat": 2}), host)) == ("cancelled", "it was cancelled")
    ledger.close("r3")
    # A cancel that ended the run: the run is closed, and the beat still says why to stop.
    assert ledger.lease(seal_lease(beat.model_copy(update={"beat": 3}), host)) == ("cancelled", "it was cancelled")
    late = Lease(job_id=str(model), attempt=1, host="h", worker="w", beat=0)
    assert ledger.lease(seal_lease(late, host)) == ("refused", "run r3 was reported and closed")
    assert not [k for k in db.leases("r3") if k[0] == str(model)]


def test_a_claim_and_a_record_compile_no_statement_afresh(db_url: str) -> None:
    """The collector's Python cost per job: SQLAlchemy never caches the dialects' INSERT ... ON
    CONFLICT, so each claim and record compiled the ledger's upserts (the lease, the job's row,
    its host) again, a millisecond each. After the first job, every statement of a claim, a
    heartbeat and a record is served from the compiled cache (or was made once as text)."""
    from sqlalchemy import event

    db = ResultsDB(db_url)
    ledger = Ledger(db)
    jids = new_run(db, "rc", [f"test-s{i}" for i in range(3)])
    db.set_live("rc", {str(j): ("queued", 1) for j in jids})
    host = Signer.generate()
    ledger.registry.add("h", host.public_text, ["test"], [T])
    seen: list[tuple[str, str]] = []

    def note(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        if context.compiled is not None:  # not the driver's own SQL (SQLite's BEGIN IMMEDIATE)
            seen.append((str(context.cache_hit), statement.split("\n")[0][:80]))

    for n, jid in enumerate(jids):
        if n == 1:
            event.listen(db.engine, "after_cursor_execute", note)
        assert claim(ledger, host, str(jid), 1, "h", "w1") == "granted"
        beat = Lease(job_id=str(jid), attempt=1, host="h", worker="w1", beat=1)
        assert ledger.lease(seal_lease(beat, host)) == ("granted", "")
        r = rec(jid, "passed").model_copy(update={"host": {"hostname": "h", "cpu": "c", "cores": "2"}})
        assert ledger.accept(seal_record(r, host), "collect")[0] == "applied"
    assert len(seen) >= 2 * (5 if db.engine.dialect.name == "postgresql" else 10)
    afresh = [s for hit, s in seen if not hit.endswith("CACHE_HIT")]
    assert not afresh, f"compiled again at a later job: {afresh}"


def test_a_records_cases_are_stored_in_their_order_and_cut_to_their_columns(db_url: str) -> None:
    """A suite's cases as the record has them, in its order (a report lists them so), names and
    messages cut to their columns (a longer one would fail the insert, which the collector takes
    for an outage); on PostgreSQL they go in as one statement, on SQLite a row each."""
    from sqlalchemy import select

    from gearfarm.db.results import Case

    db = ResultsDB(db_url)
    ledger = Ledger(db)
    (jid,) = new_run(db, "rk", ["test-big"])
    cases = [CaseResult(classname=f"suite.ü{i % 3}", name=f"case_{i:03d}", status="failed" if i % 7 == 0 else "passed",
                        time=i / 100, message=f"line {i}\n" * (i % 2)) for i in range(120)]
    cases[5] = cases[5].model_copy(update={"name": "n" * 400, "classname": "c" * 250, "message": "m" * 5000})
    r = rec(jid, "failed").model_copy(update={"cases": cases})
    assert ledger.apply(r, "rule") == "applied"
    with db.session() as s:
        got = [(c.classname, c.name, c.status, c.time, c.message, c.suite, c.target, c.run_id)
               for c in s.scalars(select(Case).where(Case.job_id == str(jid)).order_by(Case.id))]
    assert got == [(c.classname[:200], c.name[:300], c.status, c.time, c.message[:4000], "big", T, "rk")
                   for c in cases]
    # A record that replaces it replaces its cases.
    again = rec(jid, "passed", attempt=2).model_copy(update={"cases": cases[:2]})
    assert ledger.apply(again, "rule") == "applied"
    with db.session() as s:
        assert [c.name for c in s.scalars(select(Case).where(Case.job_id == str(jid)).order_by(Case.id))] == \
            ["case_000", "case_001"]


def test_a_claim_and_a_polls_read_on_postgresql_are_sent_outside_a_transaction(tmp_path: Path, pg_url: str) -> None:
    """Every job waits for its claim's answer before its first command, and a claim was a
    transaction: BEGIN, the facts, the lease's insert, COMMIT, four round trips to PostgreSQL
    from a collector thread on a busy machine. Its read locks nothing and its insert is the
    database's own upsert, so each statement commits on its own now (ResultsDB.committing), and
    the two are one (_Sql._claim_at_once): one round trip, as libpq's own trace of the
    connection shows. So is the nightly's read of what
    changed, five times a second, one statement without the BEGIN and ROLLBACK around it; and a
    worker's record that is news, which was seven (BEGIN, the facts, the lease, the job's row,
    its cases, the delivery, COMMIT): one statement (Ledger._apply_at_once)."""
    db = ResultsDB(pg_url, connections=1, pre_ping=False)
    ledger = Ledger(db)
    first, second = new_run(db, "rt", ["test-unit", "test-model"])
    db.set_live("rt", {str(first): ("queued", 1), str(second): ("queued", 1)})
    host = Signer.generate()
    ledger.registry.add("h", host.public_text, ["test"], [T])
    assert claim(ledger, host, str(first), 1, "h", "w") == "granted"  # the registry and the run read
    with db.writing() as conn:  # the host's row, then found there by the first record
        db.upsert_host(conn, rec(first, "passed").host)
    assert ledger.accept(seal_record(rec(first, "passed"), host), "collect")[0] == "applied"

    def traced(what: Callable[[], object]) -> list[list[str]]:
        """What the client sent PostgreSQL while doing ``what`` on the pool's one connection:
        [message, its text] from libpq's trace (lines: time, F or B, length, message, text)."""
        raw = db.engine.raw_connection()
        path = tmp_path / "libpq.trace"
        with path.open("w") as trace:
            pgconn = raw.driver_connection.pgconn  # type: ignore[union-attr]
            pgconn.trace(trace.fileno())
            raw.close()
            try:
                what()
            finally:
                pgconn.untrace()
        return [line.split("\t")[3:5] + [""] for line in path.read_text().splitlines()
                if line.split("\t")[1:2] == ["F"]]

    record = seal_record(rec(second, "passed"), host)
    for sent, statements in ((traced(lambda: claim(ledger, host, str(second), 1, "h", "w")), 1),
                             (traced(lambda: db.job_states_since("rt", 0.0)), 1),  # the nightly's poll
                             (traced(lambda: ledger.accept(record, "collect")), 1)):  # the lease then done
        queries = [text for kind, text, *_ in sent if kind == "Query"]
        assert not [q for q in queries if "BEGIN" in q or "COMMIT" in q or "ROLLBACK" in q], queries
        assert [kind for kind, *_ in sent].count("Sync") == statements, sent
    assert (str(second), 1) not in db.leases("rt")  # delivered
    assert row(db, second).status == "passed" and [c.name for c in row(db, second).cases] == ["c1"]
    assert [d.outcome for d in db.deliveries("rt")] == ["applied", "applied"]


def test_the_files_a_record_carries_are_kept_with_its_jobs_row_and_go_with_it(db_url: str) -> None:
    """A worker's record may carry its job's log and JUnit (gearfarm.formats.result.files): the
    ledger keeps them with the job's row, out of the record the dashboard reads, whichever way
    the record went (on PostgreSQL its first in one statement); a record that replaces the row
    replaces them (a record carrying none leaves none, its files being in S3), and one that does
    not (superseded, late) changes nothing."""
    db = ResultsDB(db_url)
    ledger = Ledger(db)
    (unit,) = new_run(db, "rf", ["test-unit"])
    db.set_live("rf", {str(unit): ("queued", 3)})
    host = Signer.generate()
    ledger.registry.add("h", host.public_text, ["test"], [T])
    for attempt in (1, 2, 3):
        assert claim(ledger, host, str(unit), attempt, "h") == "granted"

    def offer(r: ResultRecord) -> str:
        return ledger.accept(seal_record(r, host), "collect")[0]

    first = rec(unit, "failed", 1).model_copy(update={"files": {"log.txt": pack_file(b"attempt 1\n"),
                                                                "junit.xml": pack_file(b"<testsuite/>")}})
    assert offer(first) == "applied"
    assert (db.job_file(str(unit), "log.txt"), db.job_file(str(unit), "junit.xml")) == (b"attempt 1\n", b"<testsuite/>")
    assert row(db, unit).files == {} and db.job(str(unit)).files == {}  # type: ignore[union-attr]
    assert offer(rec(unit, "passed", 2).model_copy(update={"files": {"log.txt": pack_file(b"attempt 2\n")}})) \
        == "applied"
    assert (db.job_file(str(unit), "log.txt"), db.job_file(str(unit), "junit.xml")) == (b"attempt 2\n", None)
    assert offer(first) == "superseded"
    assert db.job_file(str(unit), "log.txt") == b"attempt 2\n"
    assert offer(rec(unit, "passed", 3)) == "applied"  # its log in S3: none here
    assert db.job_file(str(unit), "log.txt") is None
    ledger.close("rf")
    assert offer(rec(unit, "passed", 2).model_copy(update={"files": {"log.txt": pack_file(b"late\n")},
                                                           "finished_at": 2000.0})) == "late"
    assert db.job_file(str(unit), "log.txt") is None
    stored = db.job_files([str(unit)])[str(unit)]
    assert stored.made == (3, 1000.0) and stored.carried == {}


def test_a_record_the_database_cannot_store_is_answered_at_once_never_retried(db_url: str) -> None:
    """What a project prints or a worker host sends reaches the results database; the database
    refuses some of it (a NaN or infinity in a JSON column, a NUL in a text column, a value
    longer than its column). The collector takes the database's errors for an outage and holds
    the record until it answers, so before this each such record held one of the collector's
    threads for ever, and as many of them its every thread: the farm took no result again. Now
    the text a record carries is stored with its NULs replaced, a record that says a number is
    not finite is rejected as invalid, and any other value the database refuses rejects the
    record, each with its reason in the deliveries table."""
    import math

    from gearfarm.db.results import DeliveryRow

    db = ResultsDB(db_url)
    ledger = Ledger(db)
    steps = ["test-nul", "test-nan", "test-inf", "test-long", "test-lease", "test-banner", "perf-long"]
    jids = dict(zip(steps, new_run(db, "rn", steps), strict=True))
    db.set_live("rn", {str(j): ("queued", 1) for j in jids.values()})
    host = Signer.generate()
    ledger.registry.add("h", host.public_text, ["test", "perf"], [T])
    for step in steps[:4] + steps[5:]:
        assert claim(ledger, host, str(jids[step]), 1, "h", worker="w1") == "granted"

    def offered(step: str, **fields: object) -> str:
        # As a worker host sends it: the values in the sealed body, whatever this side's model
        # would make of them.
        r = rec(jids[step], "failed").model_copy(update={"worker": "w1"})
        body = r.model_copy(update={"kind": "perf", "cases": []} if step.startswith("perf") else {}) \
            .model_dump(mode="json")
        body.update({k: [c if isinstance(c, dict) else c.model_dump() for c in v]  # type: ignore[attr-defined]
                     if k in ("cases", "samples") else v for k, v in fields.items()})
        return ledger.accept(seal("result", body, host), "collect")[0]

    nul = [CaseResult(classname="s\x00", name="case\x00one", status="failed", message="got \x00 here")]
    assert offered("test-nul", cases=nul, message="m\x00", log_tail="tail \x00") == "applied"
    got = row(db, jids["test-nul"])
    assert (got.cases[0].classname, got.cases[0].name, got.cases[0].message) == \
        ("s\ufffd", "case\ufffdone", "got \ufffd here")
    assert (got.message, got.log_tail) == ("m\ufffd", "tail \ufffd")
    assert db.cases_in(["rn"])[0][3] == "case\ufffdone"

    assert offered("test-nan", cases=[CaseResult(name="c", status="passed", time=0.5)],
                   timings={"test": math.nan}) == "rejected"
    assert offered("test-inf", cases=[{"name": "c", "status": "passed", "time": math.inf}]) == "rejected"
    assert offered("test-long", worker="w" * 300) == "rejected"
    # A host's fingerprint longer than its columns is cut to them; a value no check knows the
    # database's limit of rejects the record with the database's reason on PostgreSQL (SQLite
    # keeps any length).
    banner = dict(rec(jids["test-banner"], "passed").host, compiler="gcc " + "x" * 400)
    assert offered("test-banner", host=banner) == "applied"
    long_metric = [Sample(benchmark="b", metric="m" * 100, value=1.0)]
    assert offered("perf-long", samples=long_metric) == ("rejected" if db.engine.dialect.name == "postgresql"
                                                         else "applied")
    # A claim whose worker name has a NUL is refused, not held.
    nul_lease = dict(job_id=str(jids["test-lease"]), attempt=1, host="h", worker="w\x00", beat=0)
    assert ledger.lease(seal("lease", nul_lease, host))[0] == "refused"
    with db.session() as s:
        rows = s.query(DeliveryRow).all()
    # The deliveries table says each one's fate (a record that does not open names no job).
    reasons = [d.reason for d in rows if d.outcome == "rejected"]
    assert sum("timings" in r and "finite" in r for r in reasons) == 1
    assert sum("cases" in r and "finite" in r for r in reasons) == 1
    assert sum("worker" in r and "200" in r for r in reasons) == 1
    if db.engine.dialect.name == "postgresql":
        assert [d.job_id for d in rows if "cannot store it: value too long" in d.reason] == [str(jids["perf-long"])]
    assert len(rows) == 6  # one for each record offered
