"""The night's submissions to gearmand: each payload's attempt recorded, then the payload signed
with the nightly's key and sent; what no gearmand took (every server away: a restart, a cut) is
kept and sent again at the next poll a server answers (Outbox.flush, from the watchdog's look).

A gearmand restart used to end the night when it fell between the poll's read of a passed build
and the release of its target's suites: "cannot submit to gearmand", and the suites recorded
lost (the chaos case tests/farm/test_chaos.py::test_gearmand_killed_and_restarted_loses_no_job).
One outbox serves every plan of a night, so the builds of a night's second project, made while
gearmand was away, go while the first project's jobs are watched."""

from __future__ import annotations

import logging

from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import Payload, sign
from gearfarm.formats.seal import Signer
from gearfarm.gearman import BackgroundJob, Client, ServerError, ServerUnavailable
from gearfarm.run.queuelimit import QueueLimits, refused_by_limit

log = logging.getLogger(__name__)


class Outbox:
    """Sends a run's payloads to gearmand; keeps, by job, the latest attempt no server took."""

    def __init__(self, db: ResultsDB, client: Client, signer: Signer, limits: QueueLimits | None = None) -> None:
        self.db, self.client, self.signer, self.limits = db, client, signer, limits
        self._kept: dict[str, Payload] = {}

    @property
    def waiting(self) -> int:
        """How many jobs wait for a gearmand to take them."""
        return len(self._kept)

    def send(self, payloads: list[Payload]) -> None:
        """Record the payloads' attempts (one transaction: the ledger grants a claim only for an
        attempt the farm submitted) and submit them, pipelined, each signed as the client takes it
        (Client.submit_background_many's growing chunks: the first are out while the rest are
        signed). One at a time, each waiting for its JOB_CREATED, a 5,000-job night's nightly
        spent 230 of its 520 s submitting while every target's suites waited to be released.

        When no server takes them, all are kept, those some server took before it went too: sent
        again, a job still queued coalesces under its unique id, and one that ran already is
        refused its claim ("ran already"). A server that answers with an error (a full queue)
        still raises: it is up and said no, except for a queue limit (QUEUE_ERROR), which the
        farm never sets: with ``limits`` it is lifted, reported in the run's alarms, and the
        payloads submitted again (gearfarm.run.queuelimit)."""
        if not payloads:
            return
        self.db.set_live(payloads[0].run_id, {p.job_id: ("queued", p.attempt) for p in payloads})
        while True:
            try:
                self.client.submit_background_many(BackgroundJob(p.function, sign(p, self.signer), p.unique)
                                                   for p in payloads)
                break
            except ServerError as e:
                if self.limits is None or not refused_by_limit(e) or e.index is None:
                    raise
                refused = payloads[e.index]
                alarm = self.limits.lift(e, refused.function, {p.function for p in payloads})
                self.db.add_alarm(refused.run_id, alarm)
            except ServerUnavailable as e:
                log.warning("gearmand took none of %d jobs of run %s (%s); they are sent when it answers",
                            len(payloads), payloads[0].run_id, e)
                for p in payloads:
                    kept = self._kept.get(p.job_id)
                    if kept is None or kept.attempt <= p.attempt:
                        self._kept[p.job_id] = p
                return
        for p in payloads:
            kept = self._kept.get(p.job_id)
            if kept is not None and kept.attempt <= p.attempt:
                del self._kept[p.job_id]

    def flush(self) -> None:
        """Send again what no server took, but a job ended meanwhile (its run's deadline, a
        cancel): a worker would be granted its claim and run it for nothing."""
        if not self._kept:
            return
        kept, self._kept = self._kept, {}
        by_run: dict[str, list[Payload]] = {}
        for p in kept.values():
            by_run.setdefault(p.run_id, []).append(p)
        runs = list(by_run.items())
        for n, (run_id, payloads) in enumerate(runs):
            try:
                ended = self.db.terminal_ids(run_id)
                self.send([p for p in payloads if p.job_id not in ended])
            except BaseException:
                # Nothing is dropped on the way out: a later flush (or the caller) has the rest.
                for _, rest in runs[n:]:
                    for p in rest:
                        self._kept.setdefault(p.job_id, p)
                raise
