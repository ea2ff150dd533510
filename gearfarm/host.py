"""The host fingerprint: what a result was measured on. Performance figures are compared only
within one host class (same CPU model, cores and memory)."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from functools import cache


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
