"""gearfarm's own synchronous Gearman client, worker and admin library.

Written in-house because the PyPI clients failed our measurements (see
docs/gearman-client.md).  Import from here rather than from the submodules.
"""

from __future__ import annotations

from . import admin
from .admin import FunctionStatus, WorkerInfo
from .client import BackgroundJob, Client, JobStatus
from .errors import (
    ConnectionClosed,
    GearmanError,
    JobFailed,
    JobLost,
    ProtocolError,
    ServerError,
    ServerUnavailable,
    StatusUnknown,
)
from .protocol import Command, Connection, Packet
from .worker import Handler, Job, Worker

__all__ = [
    "BackgroundJob",
    "Client",
    "Command",
    "Connection",
    "ConnectionClosed",
    "FunctionStatus",
    "GearmanError",
    "Handler",
    "Job",
    "JobFailed",
    "JobLost",
    "JobStatus",
    "Packet",
    "ProtocolError",
    "ServerError",
    "ServerUnavailable",
    "StatusUnknown",
    "Worker",
    "WorkerInfo",
    "admin",
]
