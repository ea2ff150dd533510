"""Connections to the farm's job servers as the config says (TLS through stunnel when it names
a CA), shared by the nightly, the CLI, the collector and the worker roles."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping

from gearfarm.config import Config
from gearfarm.gearman import Client, Worker
from gearfarm.hosts.tls import client_context

# How often an idle worker slot or collector thread asks gearmand for a job unwoken. gearmand
# wakes a sleeping worker for each job it queues (PRE_SLEEP, then NOOP, which it sends at once
# to one that goes to sleep with jobs queued), so this is only a net. At the library's 1 s, the
# collector's 16 threads asked both gearmand 32 times a second for nothing (most of an idle
# collector's CPU, a third of its grabs in a 500-job night), and 64 hosts' 128 slots 256 times
# (docs/speed.md).
IDLE_POLL = 5.0


def ssl_context(cfg: Config) -> ssl.SSLContext | None:
    """TLS to the job servers (stunnel in front of gearmand) when the config names a CA, with
    this host's client certificate when it names one."""
    g = cfg.gearman
    if not g.tls_ca:
        return None
    return client_context(cfg.path(g.tls_ca), cfg.path(g.tls_cert) if g.tls_cert else None,
                          cfg.path(g.tls_key) if g.tls_key else None)


def gearman_client(cfg: Config) -> Client:
    return Client(cfg.gearman.addresses(), ssl_context=ssl_context(cfg), server_hostname=cfg.gearman.tls_server_name)


def gearman_worker(cfg: Config, client_id: str,
                   prefer: Callable[[Mapping[str, int]], str | None] | None = None) -> Worker:
    worker = Worker(cfg.gearman.addresses(), client_id=client_id, ssl_context=ssl_context(cfg),
                    server_hostname=cfg.gearman.tls_server_name, prefer=prefer, poll_interval=IDLE_POLL)
    worker.give_up = orphaned(cfg.farm.orphan_wait)
    return worker


def orphaned(wait: float) -> Callable[[float], bool] | None:
    """When a worker's job servers are gone for good ([farm] orphan_wait): the process that
    started it is gone (it was re-parented) and no gearmand has answered for ``wait`` seconds.
    An embedded farm's gearmand goes only with its farm, so a slot its farm's stop missed (or
    whose farm was killed) would otherwise log "reconnecting" for ever; while its farm lives, a
    gearmand restart is waited out whatever it takes. None (never): a lab's daemons."""
    if wait <= 0:
        return None
    parent = os.getppid()
    return lambda silent: silent >= wait and os.getppid() != parent
