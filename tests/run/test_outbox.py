"""A gearmand restart while the nightly submits (a night's builds, a target's released suites, a
lost job's next attempt) loses no job and does not end the night: what no server took is sent
again at the next poll a server answers (gearfarm.run.outbox). Real gearmand, killed -9 and
started again on its port, as the chaos case that found it (tests/farm/test_chaos.py)."""

from __future__ import annotations

import time
from pathlib import Path

from gearfarm.formats.job import JobId
from gearfarm.gearman import Client, admin
from gearfarm.gearman.admin import FunctionStatus
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.run import nightly
from gearfarm.run.ledger import Ledger
from gearfarm.run.outbox import Outbox
from tests.run.test_growth import REV, planned, record

# The collector keeps up: what the poll read from gearmand before the watchdog's look.
ANSWERED = {"collect": FunctionStatus(0, 0, 1)}


def queued(server: Gearmand) -> dict[str, int]:
    """gearmand's own count of queued jobs by function (its admin `status`)."""
    return {fn: st.queued for fn, st in admin.status(*server.address).items() if st.queued}


def test_jobs_no_gearmand_took_are_sent_when_it_answers_again(tmp_path: Path, gearmand: Gearmand) -> None:
    db, cfg, p = planned(tmp_path, "ob", targets=2, suites=5)
    ledger = Ledger(db)
    first = p.targets[0]
    with Client([gearmand.address]) as client:
        outbox = Outbox(db, client, cfg.nightly_signer())
        gearmand.kill9()
        # The night's builds, made while gearmand is away: kept, not an error that ends the night.
        nightly.submit(cfg, db, outbox, p)
        assert outbox.waiting == 2
        gearmand.start()
        dog = nightly.Watchdog(cfg, db, ledger, None, client, p, set(), outbox=outbox)  # type: ignore[arg-type]
        dog.check(list(p.expected), {}, time.time(), ANSWERED)
        assert queued(gearmand) == {JobId("ob", t, "build").function: 1 for t in p.targets}
        # A build passes; gearmand dies between the poll's read of it and the release of the
        # target's suites (the chaos case: "cannot submit to gearmand", the night ended, two
        # suites recorded lost).
        done = record(JobId("ob", first, "build")).model_copy(
            update={"artifact_key": f"artifacts/{REV}/{first}/x/a.tar.zst", "artifact_sha256": "7" * 64})
        assert ledger.apply(done, "nightly") == "applied"
        states = db.job_states("ob")
        pending = [j for j in p.expected if str(j) not in states]
        gearmand.kill9()
        dog.check(pending, states, time.time(), ANSWERED)
        suites = [j for j in pending if j.target == first]
        assert outbox.waiting == len(suites) and {lj.attempt for lj in db.live(["ob"]).values()} == {1}
        gearmand.start()  # no persistent queue: the builds it held are gone with it
        dog.check(pending, states, time.time(), ANSWERED)
        assert outbox.waiting == 0 and queued(gearmand) == {suites[0].function: len(suites)}
        # A lost job's next attempt, made while gearmand is away, goes when it is back.
        gearmand.kill9()
        dog.resubmit(suites[0], "lease lost (a test)")
        assert outbox.waiting == 1 and db.live(["ob"])[str(suites[0])].attempt == 2
        gearmand.start()
        dog.check(pending, states, time.time(), ANSWERED)
        assert outbox.waiting == 0 and queued(gearmand) == {suites[0].function: 1}
