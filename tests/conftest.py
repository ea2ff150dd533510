"""Shared pytest fixtures.  The ``gearmand`` fixture runs a real job server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.gearmand import Gearmand


@pytest.fixture
def gearmand(tmp_path: Path) -> Iterator[Gearmand]:
    """A real gearmand on a free loopback port, state in tmp_path; always stopped."""
    with Gearmand(tmp_path / "gearmand") as server:
        yield server


@pytest.fixture
def second_gearmand(tmp_path: Path) -> Iterator[Gearmand]:
    """Another real gearmand, for failover and multi-server status tests; always stopped."""
    with Gearmand(tmp_path / "second-gearmand") as server:
        yield server
