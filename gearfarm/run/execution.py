"""One way to run plans to their end: submit → wait → close → finish. The nightly, the re-run of
new failures and every bisection probe go through `execute`, so a run is recorded, watched,
closed (later results are late) and finished the same way whoever asked for it.

Several plans run together (a nightly of several projects): all are submitted first, so their
jobs share the farm's queues, then each is watched to its end, then each is closed. What a
caller does between its plan's end and the close (the nightly's re-run of new failures) is its
`settle` hook; what it shows while waiting, its `Watcher`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from sqlalchemy.exc import SQLAlchemyError

from gearfarm.config import Config
from gearfarm.db.results import ResultsDB
from gearfarm.formats.result import ResultRecord
from gearfarm.gearman import Client, GearmanError, admin
from gearfarm.run import nightly
from gearfarm.run.ledger import Ledger
from gearfarm.run.nightly import Plan
from gearfarm.run.outbox import Outbox
from gearfarm.run.queuelimit import QueueLimits, QueueRefused
from gearfarm.s3.store import ArtifactStore


class Watcher(Protocol):
    """What the caller sees of the runs: each plan submitted, its jobs' states while it is
    watched, and its end."""

    def submitted(self, plan: Plan, created: bool) -> None: ...

    def progress(self, plan: Plan, states: dict[str, str], functions: dict[str, admin.FunctionStatus]) -> None: ...

    def waited(self, plan: Plan, records: list[ResultRecord]) -> None: ...


class Quiet:
    """A watcher that shows nothing (bisection probes, the re-run: their callers say what they do)."""

    def submitted(self, plan: Plan, created: bool) -> None:
        pass

    def progress(self, plan: Plan, states: dict[str, str], functions: dict[str, admin.FunctionStatus]) -> None:
        pass

    def waited(self, plan: Plan, records: list[ResultRecord]) -> None:
        pass


@dataclass
class Executor:
    """The farm's parts a run needs: its configuration, the results database and its ledger,
    the artifact store and a gearmand client."""

    cfg: Config
    db: ResultsDB
    ledger: Ledger
    store: ArtifactStore
    client: Client

    @cached_property
    def outbox(self) -> Outbox:
        """One for the executor's life: what gearmand did not take for one plan (or an inner
        execute's, the re-run's) goes at the next poll of any."""
        return Outbox(self.db, self.client, self.cfg.nightly_signer(), QueueLimits(self.cfg))

    def execute(self, plans: Sequence[Plan], watcher: Watcher | None = None,
                settle: Callable[[Plan, list[ResultRecord]], None] | None = None,
                unclosed: Callable[[Plan, SQLAlchemyError], None] | None = None,
                poll: float = 0.2) -> dict[str, list[ResultRecord]]:
        """Run ``plans`` to their end; returns each run's records as applied before its close.
        A database failure at the close goes to ``unclosed`` (the run then has no records
        here) or, without it, up to the caller. Gearman and run errors always go up: the
        runs stay recorded, and a nightly started again with the same run ids resubmits only
        what is not terminal."""
        watcher = watcher or Quiet()
        try:
            for p in plans:
                watcher.submitted(p, nightly.submit(self.cfg, self.db, self.outbox, p))
            for p in plans:
                records = nightly.wait(self.cfg, self.db, self.ledger, self.store, self.client, p,
                                       lambda states, fns, p=p: watcher.progress(p, states, fns),  # type: ignore[misc]
                                       poll=poll, outbox=self.outbox)
                watcher.waited(p, records)
                if settle is not None:
                    settle(p, records)
        except (GearmanError, nightly.RunError, QueueRefused) as e:
            raise Abandoned(e, self.abandon(plans, f"not run: the nightly could not go on ({e})")) from e
        out: dict[str, list[ResultRecord]] = {}
        for p in plans:
            try:
                # Closed first, then read: the records hold everything applied before the close,
                # and anything after it is recorded as late. Its jobs still in a queue are dropped
                # by the worker that finds one: the ledger refuses their claims.
                self.ledger.close(p.run_id)
                self.db.finish_run(p.run_id, "finished")
                out[p.run_id] = self.db.jobs(p.run_id)
            except SQLAlchemyError as e:
                if unclosed is None:
                    raise
                unclosed(p, e)
        return out

    def abandon(self, plans: Sequence[Plan], why: str) -> dict[str, list[ResultRecord]]:
        """Close the runs of a night that cannot go on (gearmand refused or lost, the database
        away too long): every job not ended is recorded ``infra`` with ``why``, builds first
        (their dependents end with them), and the run is closed and finished, never left
        "running" on /live; each run's records. A run the database cannot close is left out."""
        out: dict[str, list[ResultRecord]] = {}
        for p in plans:
            try:
                done = self.db.terminal_ids(p.run_id)
                for jid in sorted(p.expected, key=lambda j: j.kind != "build"):
                    if str(jid) not in done:
                        nightly.expire(self.ledger, p, [jid], "infra", why)
                        if jid.kind == "build":
                            done = self.db.terminal_ids(p.run_id)
                self.ledger.close(p.run_id)
                self.db.finish_run(p.run_id, "finished")
                out[p.run_id] = self.db.jobs(p.run_id)
            except SQLAlchemyError:
                continue
        return out


class Abandoned(nightly.RunError):
    """A night that could not go on (``cause``); its runs closed, with their records in ``runs``."""

    def __init__(self, cause: BaseException, runs: dict[str, list[ResultRecord]]) -> None:
        super().__init__(str(cause))
        self.cause, self.runs = cause, runs
