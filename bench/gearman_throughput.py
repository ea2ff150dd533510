"""Measure gearfarm.gearman throughput against a throw-away local gearmand.

Prints jobs/s for: foreground jobs one by one (submit -> worker -> result, one in
flight), background jobs submitted one by one, and background jobs pipelined with
submit_background_many.  ``--persistent`` uses the libsqlite3 queue the farm runs with.
Usage: python bench/gearman_throughput.py [--jobs N] [--persistent]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gearfarm.gearman import BackgroundJob, Client, Worker, admin  # noqa: E402
from gearfarm.hosts.gearmand import Gearmand  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--persistent", action="store_true", help="use -q libsqlite3")
    args = parser.parse_args()
    n = args.jobs

    with tempfile.TemporaryDirectory() as tmp:
        queue_db = Path(tmp) / "queue.db" if args.persistent else None
        with Gearmand(Path(tmp), queue_db=queue_db) as server:
            fg, bg_one, bg_pipe, version = run(server, n)
    queue = "libsqlite3" if args.persistent else "builtin (memory)"
    print(f"gearmand {version} on loopback, queue {queue}, {n} jobs each")
    print(f"foreground submit+work+result, one by one: {fg:8.0f} jobs/s")
    print(f"background submit, one by one:             {bg_one:8.0f} jobs/s")
    print(f"background submit, pipelined:              {bg_pipe:8.0f} jobs/s")


def run(server: Gearmand, n: int) -> tuple[float, float, float, str]:
    """Return (foreground/s, background one-by-one/s, background pipelined/s, version)."""
    host, port = server.address
    worker = Worker([server.address], "bench", poll_interval=0.2)
    worker.register("echo", lambda job: job.data)
    stop = threading.Event()
    thread = threading.Thread(target=worker.work, args=(stop,), daemon=True)
    thread.start()
    try:
        with Client([server.address]) as client:
            client.submit("echo", b"warm-up", "warm-up", timeout=10)

            started = time.perf_counter()
            for i in range(n):
                data = b"%d" % i
                assert client.submit("echo", data, f"fg-{i}", timeout=10) == data
            fg = n / (time.perf_counter() - started)

            # Background jobs go to a function nobody serves: measures submission only.
            started = time.perf_counter()
            for i in range(n):
                client.submit_background("sink", b"x", f"bg-{i}")
            bg_one = n / (time.perf_counter() - started)

            jobs = [BackgroundJob("sink", b"x", f"pipe-{i}") for i in range(n)]
            started = time.perf_counter()
            client.submit_background_many(jobs)
            bg_pipe = n / (time.perf_counter() - started)
            queued = admin.status(host, port)["sink"].queued
            assert queued == 2 * n, f"expected {2 * n} queued jobs, gearmand has {queued}"
    finally:
        stop.set()
        thread.join()
    return fg, bg_one, bg_pipe, admin.version(host, port)


if __name__ == "__main__":
    main()
