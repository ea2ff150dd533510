"""gearmand's queue limits, kept the farm's. gearmand 1.1.20's text admin protocol has no
authentication: any peer that connects (any local process on the embedded farm, any host with a
client certificate in a lab) can send ``maxqueue FUNCTION 1``, after which gearmand refuses that
function's submissions with QUEUE_ERROR. The farm never sets a limit, so a refusal means someone
else did: the nightly lifts it (``maxqueue FUNCTION``, gearmand's default: none) on every server,
submits again, and says in the run's report and mail what it found and who could have done it.

It is the one setting of that protocol that can stop the farm: ``shutdown`` is unknown to 1.1.20,
``verbose`` only reads, and ``cancel job`` and ``drop function`` drop queued jobs, which the
nightly's watchdog finds gone and submits again (gearfarm.run.nightly.Watchdog)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable

from gearfarm.config import Config
from gearfarm.formats.words import counted
from gearfarm.gearman import GearmanError, ServerError, admin
from gearfarm.gearman.protocol import format_address
from gearfarm.hosts.connection import ssl_context

log = logging.getLogger(__name__)

# How often one submission's limit is lifted before the nightly gives up on it: a peer that sets
# it again each time is at work while the night runs, and the night says so rather than race it.
LIFTS = 5
# gearmand's collector function: a limit on it starves every worker's claims and records.
COLLECT = "collect"


class QueueRefused(RuntimeError):
    """gearmand kept refusing a function's jobs after its limit was lifted LIFTS times."""


def refused_by_limit(e: BaseException) -> bool:
    """gearmand said no to a submission because of a queue limit (``maxqueue``)."""
    return isinstance(e, ServerError) and e.code == "QUEUE_ERROR"


class QueueLimits:
    """Lifts the queue limits a peer set and says who could have set them."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lifted: Counter[str] = Counter()

    def lift(self, error: ServerError, refused: str, functions: Iterable[str]) -> str:
        """Lift the limit of ``refused`` (the function gearmand refused a job of), ``functions``
        and the collector's on every server that answers; the alarm to report. QueueRefused
        once a function's limit was lifted LIFTS times."""
        self.lifted[refused] += 1
        if self.lifted[refused] > LIFTS:
            raise QueueRefused(
                f"gearmand refuses jobs of {refused} ({error.code}: {error.text}) although the nightly lifted its "
                f"queue limit {counted(LIFTS, 'time')}: a peer keeps setting it (maxqueue {refused} N over "
                f"gearmand's text admin protocol). {self.who()}. Find that process or host and stop it; then run the "
                "night again")
        names = sorted({*functions, refused, COLLECT})
        ctx = ssl_context(self.cfg)
        failed = []
        for host, port in self.cfg.gearman.addresses():
            for fn in names:
                try:
                    admin.maxqueue(host, port, fn, None, ctx)
                except (OSError, GearmanError) as e:
                    failed.append(f"{format_address(host, port)} ({e})")
                    break
        log.error("gearmand %s refused jobs of %s (QUEUE_ERROR): a queue limit set by a peer; lifted on %s",
                  error.address, refused, ", ".join(names))
        return (f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: gearmand at {error.address} refused jobs "
                f"of {refused} (QUEUE_ERROR: {error.text}): a queue limit was set on it (maxqueue {refused} N over "
                "gearmand's text admin protocol), which the farm never sets. The nightly lifted it (maxqueue, no "
                f"limit) on {', '.join(names)} and submitted again"
                + (f"; not lifted at {', '.join(failed)}" if failed else "") + f". {self.who()}")

    def who(self) -> str:
        """Who could have set a limit: whoever reaches gearmand's port, and the connections it
        has now that are not a farm worker's (no client id, no function)."""
        addresses = ", ".join(format_address(h, p) for h, p in self.cfg.gearman.addresses())
        if self.cfg.gearman.tls_ca:
            reach = (f"gearmand's admin protocol has no authentication: any host holding a client certificate of "
                     f"the farm's CA (every worker host, through stunnel at {addresses}) and any process on "
                     "gearmand's own host could have done it")
        else:
            reach = (f"gearmand's admin protocol has no authentication: any process that reaches {addresses} "
                     "could have done it (no TLS in front of it)")
        strangers: Counter[str] = Counter()
        for host, port in self.cfg.gearman.addresses():
            try:
                for w in admin.workers(host, port, ssl_context(self.cfg)):
                    if w.client_id == "-" and not w.functions:
                        strangers[w.ip] += 1
            except (OSError, GearmanError):
                continue
        seen = ", ".join(f"{n} from {ip}" for ip, n in sorted(strangers.items()))
        return (f"{reach}; connections to gearmand that are no worker's when it was found (the nightly's own "
                f"among them): {seen or 'none'}")

