"""The host: its fingerprint (what a result was measured on; performance figures are compared
only within one host class: same CPU model, cores and memory) and how busy it is (load, CPU
time, clock), which a perf job records beside its figures."""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import socket
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> int:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError):
        return 0


@cache
def fingerprint() -> dict[str, str]:
    fp = {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "mem_gib": str(_mem_gib()),
        "kernel": platform.release(),
        "machine": platform.machine(),
    }
    fp["class"] = host_class(fp)
    return fp


def host_class(fp: dict[str, str]) -> str:
    key = f"{fp.get('cpu')}|{fp.get('cores')}|{fp.get('mem_gib')}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def load_average() -> float:
    """The 1-minute load average (runnable and uninterruptible tasks), 0 where unreadable."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def cpu_mhz() -> float | None:
    """The mean current clock of the CPUs, where the kernel says (cpufreq, else /proc/cpuinfo);
    None where neither is readable. A benchmark on a throttled CPU is slower for that alone."""
    freqs = []
    for f in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            freqs.append(int(f.read_text()) / 1000)
        except (OSError, ValueError):
            continue
    if not freqs:
        try:
            freqs = [float(line.split(":", 1)[1]) for line in open("/proc/cpuinfo") if line.startswith("cpu MHz")]
        except (OSError, ValueError):
            return None
    return round(sum(freqs) / len(freqs), 1) if freqs else None


def _cpu_ticks() -> list[int] | None:
    """The host's CPU time by state since boot (/proc/stat's first line, in clock ticks: user,
    nice, system, idle, iowait, irq, softirq, steal, ...); None where unreadable."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole host since boot, from /proc/stat; None elsewhere.
    Busy excludes idle and iowait; steal counts as busy, since it is time this guest did not get."""
    fields = _cpu_ticks()
    if fields is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = sum(fields[:8])
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (total - idle) / tick, total / tick


def steal_seconds() -> float | None:
    """CPU seconds since boot that the hypervisor gave to others while this guest wanted them."""
    fields = _cpu_ticks()
    return fields[7] / os.sysconf("SC_CLK_TCK") if fields is not None and len(fields) > 7 else None


class Activity:
    """What else the host did while a benchmark measured, sampled from a thread once a
    ``interval``: the load average, the other farm jobs running (``others()``), the CPU time
    used by everything but this process and its children, and the CPU clock. The record keeps
    the summary, so a figure measured on a busy host can be told from one measured alone."""

    def __init__(self, others: Callable[[], list[str]], interval: float = 1.0) -> None:
        self._others = others
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loads: list[float] = []
        self._jobs: list[int] = []
        self._mhz: list[float] = []
        self._t0 = 0.0
        self._cpu0: tuple[float, float] | None = None
        self._own0 = 0.0
        self.summary: dict[str, float] = {}

    @staticmethod
    def _own() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def _sample(self) -> None:
        self._loads.append(load_average())
        self._jobs.append(len(self._others()))
        mhz = cpu_mhz()
        if mhz is not None:
            self._mhz.append(mhz)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> Activity:
        self._t0, self._cpu0, self._own0 = time.monotonic(), cpu_seconds(), self._own()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        wall = max(time.monotonic() - self._t0, 1e-6)
        s: dict[str, float] = {"seconds": round(wall, 3), "load_start": self._loads[0], "load_end": self._loads[-1],
                               "load_max": max(self._loads), "other_jobs_max": float(max(self._jobs)),
                               "samples": float(len(self._loads))}
        cpu1 = cpu_seconds()
        if self._cpu0 and cpu1:
            # Cores' worth of CPU that something other than this benchmark used meanwhile.
            others = (cpu1[0] - self._cpu0[0]) - (self._own() - self._own0)
            s["other_cpu_cores"] = round(max(others, 0.0) / wall, 3)
        if self._mhz:
            s["cpu_mhz_min"], s["cpu_mhz_max"] = min(self._mhz), max(self._mhz)
        self.summary = s
