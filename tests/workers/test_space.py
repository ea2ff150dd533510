"""A worker host short of space takes no job ([farm] min_free), with a real gearmand, MinIO and
test worker: the slot holds the job a while for space to come back, then hands it back with no
claim, no command and no record, saying why (the nightly submits it again for a host with room:
tests/farm/test_disk.py shows the job that wrote the most ended instead)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from gearfarm.config import Config
from gearfarm.formats.job import JobId, Source, make_payload, sign
from gearfarm.hosts.connection import gearman_client
from gearfarm.workers import base
from gearfarm.workers import test as test_worker
from tests.workers.test_admission import TARGET, Collector, farm, stored  # noqa: F401 - farm: a fixture

REV = "c" * 40


def test_a_host_below_min_free_hands_the_job_back_unrun_and_says_why(
        farm: tuple[Config, Path], caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    cfg, tmp_path = farm
    # More free space than any disk has: this host is short of it whatever it holds.
    cfg.farm.min_free = 1 << 60
    cfg.farm.lease_timeout = 4.0  # the slot waits half of it for space
    cat_sha, art = stored(cfg, tmp_path)
    collector = Collector(cfg, tmp_path / "state" / "work", cfg.host_signer())
    collector.thread.start()
    stop = threading.Event()
    slot = threading.Thread(target=base.serve, args=(cfg, [("test", f"test:{TARGET}", test_worker.handle)], stop),
                            daemon=True)
    slot.start()
    client = gearman_client(cfg)
    caplog.set_level(logging.INFO, logger="gearfarm")
    try:
        jid = JobId("short", TARGET, "test-unit")
        collector.answers[str(jid)] = "granted "
        p = make_payload(jid, source=Source("space", REV, "5" * 64, cat_sha), deadline=time.time() + 600,
                         artifact=art)
        t0 = time.monotonic()
        got = client.submit(f"test:{TARGET}", sign(p, cfg.nightly_signer()), unique=p.unique, timeout=60)
        waited = time.monotonic() - t0
        assert got.startswith(b"dropped: the disk holding the farm's state"), got
        assert b"below [farm] min_free" in got
        assert 2.0 <= waited < 30, waited
        # Neither claimed nor run nor recorded.
        assert collector.unpacked_when_asked == {} and collector.records == []
        assert "COMMAND START" not in caplog.text
        assert "DROPPED job" in caplog.text and "takes no job until there is room" in caplog.text
    finally:
        stop.set()
        collector.stop.set()
        client.close()
        slot.join(30)
        collector.worker.wake()
        collector.thread.join(10)
