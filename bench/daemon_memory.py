"""The resident memory of gearmand and MinIO over a long life (issue #38's soak): the soak
restarts them as faults every 10 to 40 nights, and each lifetime grew in the soak (gearmand
12.2 -> 13.5 MiB over 44 nights, MinIO +10 to +23 % in lifetimes of 8 to 22 nights), too short
to tell a warm-up from a leak. Here each lives through far more than a soak gives it, on its
own, and its VmRSS is printed as it goes: growth that stops is a cache filling, growth that
goes on is a leak.

* gearmand: batches of background jobs (each written to its sqlite queue on submit and deleted
  when done, as the farm's records and heartbeats are) through a throw-away gearmand with the
  farm's libsqlite3 queue in WAL mode; also the WAL file's size, which grows until sqlite's
  automatic checkpoint (1,000 pages) and is reused from then on.
* MinIO: "nights" of the farm's S3 traffic on a throw-away MinIO: a build's archive, 60 jobs'
  log, JUnit and record PUTs and a log's GET, the night's LIST, and the night --keep back
  deleted, as the retention prune does.

    .venv/bin/python bench/daemon_memory.py [--batches 100] [--jobs 1000] [--nights 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gearfarm.gearman import BackgroundJob, Client, Job, Worker, admin  # noqa: E402
from gearfarm.hosts.gearmand import Gearmand  # noqa: E402
from gearfarm.hosts.minio_server import MinioServer  # noqa: E402
from gearfarm.s3.store import ArtifactStore  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def gearmand(batches: int, jobs: int, every: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        queue = Path(tmp) / "queue.db"
        wal = queue.with_name(queue.name + "-wal")
        with Gearmand(Path(tmp), queue_db=queue) as server:
            host, port = server.address
            pid = admin.getpid(host, port)
            done = 0
            finished = threading.Condition()

            def handle(_job: Job) -> bytes:
                nonlocal done
                with finished:
                    done += 1
                    finished.notify()
                return b""

            worker = Worker([server.address], "bench", poll_interval=0.2)
            worker.register("sink", handle)
            stop = threading.Event()
            thread = threading.Thread(target=worker.work, args=(stop,), daemon=True)
            thread.start()
            print(f"\n## gearmand {admin.version(host, port)}, libsqlite3 queue in WAL mode, {jobs} jobs a batch\n")
            print("| jobs | VmRSS KiB | WAL bytes | s |\n|---:|---:|---:|---:|")
            print(f"| 0 | {rss_kib(pid)} | {wal.stat().st_size if wal.exists() else 0} | 0 |")
            t0 = time.monotonic()
            try:
                with Client([server.address]) as client:
                    for b in range(1, batches + 1):
                        # A record's size, as the farm's background jobs have.
                        client.submit_background_many(
                            [BackgroundJob("sink", b"x" * 300, f"j-{b}-{i}") for i in range(jobs)])
                        with finished:
                            if not finished.wait_for(lambda b=b: done >= b * jobs, timeout=120):
                                sys.exit(f"batch {b}: {done} of {b * jobs} jobs done after 120 s")
                        if b % every == 0 or b in (1, batches):
                            print(f"| {b * jobs} | {rss_kib(pid)} | {wal.stat().st_size} | "
                                  f"{time.monotonic() - t0:.0f} |", flush=True)
            finally:
                stop.set()
                thread.join()


def minio(nights: int, keep: int, every: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = MinioServer(Path(tmp)).start()
        try:
            store = ArtifactStore(server.s3_config())
            pid = server.pid
            assert pid is not None
            archive, small = os.urandom(150_000), b"r" * 3_000
            print(f"\n## MinIO, a night: an archive, 60 jobs' three PUTs and a GET, a LIST; {keep} nights kept\n")
            print("| nights | requests | VmRSS KiB | s |\n|---:|---:|---:|---:|")
            print(f"| 0 | 0 | {rss_kib(pid)} | 0 |")
            t0, requests = time.monotonic(), 0
            for n in range(1, nights + 1):
                run = f"runs/night-{n:04d}"
                store.put_bytes(f"{run}/build/artifact.tar.zst", archive)
                for j in range(60):
                    for name in ("log.txt", "junit.xml", "results/1-record.json"):
                        store.put_bytes(f"{run}/test-{j}/{name}", small)
                    store.get_bytes(f"{run}/test-{j}/log.txt")
                requests += 1 + 60 * 4
                list(store.list(run + "/"))
                requests += 1
                if n > keep:
                    store.delete(list(store.list(f"runs/night-{n - keep:04d}/")))
                    requests += 2  # the LIST and one DELETE (a night is fewer than its 1,000 keys)
                if n % every == 0 or n in (1, nights):
                    print(f"| {n} | {requests} | {rss_kib(pid)} | {time.monotonic() - t0:.0f} |", flush=True)
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100, help="gearmand: batches of jobs (0: skip gearmand)")
    ap.add_argument("--jobs", type=int, default=1000, help="gearmand: background jobs a batch")
    ap.add_argument("--nights", type=int, default=200, help="MinIO: nights of S3 traffic (0: skip MinIO)")
    ap.add_argument("--keep", type=int, default=10, help="MinIO: nights kept, the older deleted")
    ap.add_argument("--every", type=int, default=10, help="print after this many batches or nights")
    args = ap.parse_args()
    if args.batches:
        gearmand(args.batches, args.jobs, args.every)
    if args.nights:
        minio(args.nights, args.keep, args.every)


if __name__ == "__main__":
    main()
