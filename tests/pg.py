"""A real PostgreSQL for tests: Debian's PostgreSQL 15 started in a temporary directory on a
free loopback port (initdb + pg_ctl), as the ``postgres`` user when the tests run as root
(PostgreSQL refuses to run as root), and always stopped. $GEARFARM_TEST_POSTGRES_URL points the
tests at a server that is already running instead (a database per test is created in it).

tests/conftest.py offers its fixtures (``pg_server``, ``pg_url``, ``db_url``) to every test module.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gearfarm.hosts.net import free_port

BINDIR = Path(os.environ.get("GEARFARM_TEST_PG_BINDIR", "/usr/lib/postgresql/15/bin"))
SUPERUSER = "gearfarm"
_counter = itertools.count(1)


class PostgresError(RuntimeError):
    pass


class PostgresServer:
    """One throw-away cluster. start() returns self; stop() kills it and removes its files.

    With ``tls`` (server certificate, key, and the CA that client certificates must come
    from) it is a lab's server: TCP clients must use TLS and present a certificate from that
    CA (``hostssl ... clientcert=verify-ca``, no plain ``host`` line); the superuser still
    reaches it over its Unix socket, which is how databases get created."""

    def __init__(self, tls: tuple[Path, Path, Path] | None = None) -> None:
        self.tls = tls
        self.dir: Path | None = None
        self.port: int | None = None
        self.user: str | None = None  # the OS user the server runs as (None: ourselves)
        self._opts = ""  # the postmaster options, so restart() comes back the same

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def start(self) -> PostgresServer:
        if not (BINDIR / "initdb").exists():
            raise PostgresError(f"no PostgreSQL at {BINDIR} (apt-get install postgresql-15)")
        if os.geteuid() == 0:
            # PostgreSQL will not run as root; Debian's package creates this user.
            try:
                pwd.getpwnam("postgres")
            except KeyError as e:
                raise PostgresError("running as root and there is no 'postgres' user to run PostgreSQL as") from e
            self.user = "postgres"
        # Not pytest's tmp_path: it is private to root, and the server runs as another user.
        self.dir = Path(tempfile.mkdtemp(prefix="gearfarm-pg-"))
        if self.user:
            shutil.chown(self.dir, self.user)
        data = self.dir / "data"
        p = self._run([str(BINDIR / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                       "--no-sync", "--no-instructions"])
        if p.returncode != 0:
            self.stop()
            raise PostgresError(f"initdb failed: {p.stderr.strip() or p.stdout.strip()}")
        if self.tls:
            self._require_tls(data)
        for _ in range(3):  # a free port can be taken between probing and binding
            self.port = free_port()
            self._opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                          "-c synchronous_commit=off -c full_page_writes=off")
            p = self._pg_ctl_start()
            if p.returncode == 0:
                return self
        server_log = self.dir / "server.log"
        log = server_log.read_text(errors="replace")[-2000:] if server_log.exists() else ""
        self.stop()
        raise PostgresError(f"PostgreSQL did not start: {p.stderr.strip()}\n{log}")

    def _require_tls(self, data: Path) -> None:
        assert self.tls is not None
        for src, name in zip(self.tls, ("server.crt", "server.key", "ca.crt"), strict=True):
            shutil.copyfile(src, data / name)
            os.chmod(data / name, 0o600)  # PostgreSQL refuses a key others can read
            if self.user:
                shutil.chown(data / name, self.user)
        with open(data / "postgresql.conf", "a") as f:
            f.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                    "ssl_ca_file = 'ca.crt'\n")
        (data / "pg_hba.conf").write_text("local all all trust\n"
                                          "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n")

    def _pg_ctl_start(self) -> subprocess.CompletedProcess[str]:
        assert self.dir is not None
        return self._run([str(BINDIR / "pg_ctl"), "-D", str(self.dir / "data"), "-o", self._opts, "-l",
                          str(self.dir / "server.log"), "-w", "-t", "60", "start"], timeout=90)

    def restart(self, while_down: Callable[[], object] | None = None) -> None:
        """Stop the server (fast shutdown: every client connection is cut, as a service
        restart does), call ``while_down`` if given, and start it again on the same port and
        data directory, so clients holding the URL must reconnect to the same server."""
        assert self.dir is not None, "start() first"
        data = self.dir / "data"
        p = self._run([str(BINDIR / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"], timeout=90)
        if p.returncode != 0:
            raise PostgresError(f"PostgreSQL did not stop: {p.stderr.strip() or p.stdout.strip()}")
        try:
            if while_down is not None:
                while_down()
        finally:
            # Up again even when the caller's wait failed: the server is shared by the session.
            p = self._pg_ctl_start()
        if p.returncode != 0:
            log = (self.dir / "server.log").read_text(errors="replace")[-2000:]
            raise PostgresError(f"PostgreSQL did not start again on port {self.port}: {p.stderr.strip()}\n{log}")

    def create_database(self, name: str) -> str:
        import psycopg

        # Over the Unix socket: a TLS-only server admits no TCP client without a certificate.
        with psycopg.connect(f"host={self.dir} port={self.port} user={SUPERUSER} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.dir is None:
            return
        if (self.dir / "data" / "postmaster.pid").exists():
            self._run([str(BINDIR / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


class _External:
    """A server somebody else runs: only databases are created (and left) in it."""

    def __init__(self, url: str) -> None:
        self.url = url

    def create_database(self, name: str) -> str:
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(self.url)
        with psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password,
                             dbname=u.database or "postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return u.set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer | _External]:
    external = os.environ.get("GEARFARM_TEST_POSTGRES_URL")
    if external:
        yield _External(external)
        return
    server = PostgresServer()
    try:
        server.start()
    except PostgresError as e:
        pytest.skip(f"PostgreSQL unavailable: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PostgresServer | _External) -> str:
    """A new, empty database for this test."""
    return pg_server.create_database(f"gearfarm_test_{os.getpid()}_{next(_counter)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test twice: on SQLite, and on a new database of the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("pg_url")
