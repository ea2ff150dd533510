"""Shared pytest fixtures: a real gearmand per test (``gearmand``, ``second_gearmand``), a
real MinIO per test module (``minio``), a results database URL on SQLite and on PostgreSQL
(``db_url``, tests/pg.py), and Debian's chromium driven by Playwright (``browser``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from tests.pg import db_url, pg_server, pg_url  # noqa: F401 - fixtures


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


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO on a free loopback port, data in a tmp dir, shared by a module's tests;
    always stopped."""
    with MinioServer(tmp_path_factory.mktemp("minio")) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, driven by Playwright (no browser download); closed after the module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()
