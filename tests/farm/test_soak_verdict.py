"""The soak's verdict (bench/soak.py) on made-up nights: a daemon that warms up after each
start and then holds steady passes, with its pooled sockets coming and going; a leak of
memory, of a file descriptor or of a socket is named, in the lifetime it happened in and, when
it outlives restarts, across them."""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.farmkit import bench_module

soak = bench_module("soak")
Sample = Callable[[int, int], tuple[int, int, int, int]]  # (night, night in lifetime) -> rss, files, sockets, threads


def _nights(count: int, restarts: tuple[int, ...], sample: Sample) -> list[Any]:
    """A daemon named d over ``count`` nights, started again (a new pid) at each night of
    ``restarts``."""
    out, pid, born = [], 100, 1
    for n in range(1, count + 1):
        if n in restarts:
            pid, born = pid + 1, n
        rss, files, sockets, threads = sample(n, n - born + 1)
        out.append(types.SimpleNamespace(
            number=n, procs={"d": soak.ProcSample(pid, rss, threads, files + sockets, sockets)}))
    return out


def _steady(n: int, age: int) -> tuple[int, int, int, int]:
    """Warms up for 15 nights (+30 % RSS, a pool's sockets opening), then holds; its sockets
    are 2 to 5 at any one look."""
    return 100_000 + 2_000 * min(age, 15), 20, 2 + (n * 7) % 4, 8


def _verdicts(nights: list[Any]) -> tuple[list[str], list[str]]:
    daemons, _ = soak.daemon_table(nights, 20)
    lifetimes, _ = soak.growth_table(nights, 20)
    return daemons[2:], lifetimes[2:]


def test_a_daemon_that_warms_up_after_each_start_and_then_holds_passes() -> None:
    nights = _nights(200, (60, 130), _steady)
    daemons, lifetimes = _verdicts(nights)
    assert soak.daemon_table(nights, 20)[1] == 0 and soak.growth_table(nights, 20)[1] == 0
    assert all(r.endswith("| ok |") for r in daemons + lifetimes), daemons + lifetimes
    # Each lifetime is judged from its own 20th night: the one started at night 60 from night 79.
    assert any("| 60–129 (79) |" in r for r in lifetimes), lifetimes


def test_a_pools_sockets_a_little_above_its_baseline_are_not_a_leak() -> None:
    def pool(n: int, age: int) -> tuple[int, int, int, int]:
        rss, files, _, threads = _steady(n, age)
        return rss, files, 4 + (age > 25) + (age > 28), threads  # two more opened once, then kept

    nights = _nights(60, (), pool)
    assert soak.growth_table(nights, 20)[1] == 0 and soak.daemon_table(nights, 20)[1] == 0


def test_a_lifetime_that_warms_up_too_briefly_to_judge_says_so() -> None:
    nights = _nights(200, (60, 190), _steady)
    _, lifetimes = _verdicts(nights)
    assert "too short to judge" in lifetimes[-1]


def test_memory_a_file_and_a_socket_leak_are_each_named() -> None:
    def rss_leak(n: int, age: int) -> tuple[int, int, int, int]:
        rss, files, sockets, threads = _steady(n, age)
        return rss + 300 * age, files, sockets, threads  # +0.3 % a night, never levelling

    def file_leak(n: int, age: int) -> tuple[int, int, int, int]:
        rss, files, sockets, threads = _steady(n, age)
        return rss, files + age // 30, sockets, threads  # one more every 30 nights

    def socket_leak(n: int, age: int) -> tuple[int, int, int, int]:
        rss, files, sockets, threads = _steady(n, age)
        return rss, files, sockets + age // 20, threads

    for sample, word in ((rss_leak, "RSS"), (file_leak, "other fds"), (socket_leak, "sockets")):
        nights = _nights(200, (), sample)  # one lifetime: its growth is the daemon's too
        daemons, lifetimes = _verdicts(nights)
        assert f"grew: {word}" in lifetimes[0], (word, lifetimes)
        if word != "sockets":  # across restarts sockets are shown, not judged (a pool's size moves)
            assert f"grew: {word}" in daemons[0], (word, daemons)


def test_a_soaks_csv_reads_back_as_its_nights_to_be_judged_again(tmp_path: Path) -> None:
    nights = [soak.Night(n, f"soak{n:03d}", 12.5, 0, "worker-kill" if n == 2 else "", "between" if n == 2 else "",
                         "killed slot-1" if n == 2 else "", "", {
                             "gearmand": soak.ProcSample(7, 12_000 + n, 7, 66, 27),
                             **({"slot-1": soak.ProcSample(9 + (n > 2), 85_000, 8, 17, 12)} if n != 2 else {})},
                         1000 * n, soak.StoreSize(500 * n, n, 1, 1), 2000 * n, {"minio": 300 * n, "files": 1000 * n},
                         0, 0, 0)
              for n in range(1, 4)]
    path = tmp_path / "soak.csv"
    soak.write_csv(path, nights)
    assert soak.read_csv(path) == nights
