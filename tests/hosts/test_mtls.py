"""Mutual TLS in front of gearmand (issue #15): a host gets nothing from the farm without a
client certificate from the farm's CA that is not revoked.

Real gearmand on loopback, real stunnel (Debian stunnel4) with ``verifyChain``/``requireCert``
and the CA's CRL in front of it, and the farm's own client and worker configured the way a lab
host is (``[gearman] tls_ca``, ``tls_cert``, ``tls_key``).  What each host tries is what a
farm host does: submit a job, take one, read status, and deliver a result to the collector's
function.  Outcomes are read back from gearmand's own loopback port, which no TLS stands in
front of, so "nothing arrived" is observed rather than assumed.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError

from gearfarm.config import Config, GearmanConfig
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import COLLECT_FUNCTION
from gearfarm.gearman import Client, ServerUnavailable, Worker, admin
from gearfarm.hosts import tls
from gearfarm.hosts.connection import ssl_context
from gearfarm.hosts.gearmand import Gearmand
from tests.pg import PostgresError, PostgresServer

SERVER_NAME = "gearman.farm.test"
FAST = {"poll_interval": 0.1, "max_backoff": 0.3}
# Why stunnel refuses each kind of bad host, as its log says.  (The client's own error is
# not a reliable witness: with TLS 1.3 it may see the alert or only the connection closing.)
REFUSALS = {
    "no certificate": "peer did not return a certificate",
    "foreign CA": "Pre-verification error: unable to get local issuer certificate",
    "revoked": "Pre-verification error: certificate revoked",
}


@dataclass
class MTLSFarm:
    base: Path
    ca: tls.CertFiles
    gearmand: Gearmand
    stunnel: tls.Stunnel
    hosts: dict[str, Config]


def _config(farm_address: tuple[str, int], ca: Path, cert: tls.CertFiles | None) -> Config:
    host, port = farm_address
    return Config(gearman=GearmanConfig(
        servers=[f"{host}:{port}"], tls_ca=str(ca), tls_server_name=SERVER_NAME,
        tls_cert=str(cert.cert) if cert else None, tls_key=str(cert.key) if cert else None))


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MTLSFarm]:
    base = tmp_path_factory.mktemp("mtls")
    ca = tls.create_ca(base / "ca")
    other = tls.create_ca(base / "other-ca", common_name="someone else's CA")
    server = tls.create_server_cert(ca, [SERVER_NAME, "127.0.0.1"], base / "srv" / "server.crt",
                                    base / "srv" / "server.key")
    certs = {
        "valid": tls.create_client_cert(ca, "build-1.lab"),
        "revoked": tls.create_client_cert(ca, "retired.lab"),
        # Same host name, issued by a CA the farm does not trust.
        "foreign CA": tls.create_client_cert(other, "build-1.lab"),
    }
    tls.revoke(ca, "retired.lab")
    with Gearmand(base / "gearmand") as gearmand, \
            tls.Stunnel(base / "stunnel", gearmand.address, server.cert, server.key,
                        client_ca=ca.cert, crl=ca.cert.parent / tls.CRL_FILE) as stunnel:
        hosts = {case: _config(stunnel.address, ca.cert, cert) for case, cert in certs.items()}
        hosts["no certificate"] = _config(stunnel.address, ca.cert, None)
        yield MTLSFarm(base, ca, gearmand, stunnel, hosts)


def _client(cfg: Config) -> Client:
    return Client(cfg.gearman.addresses(), ssl_context=ssl_context(cfg), server_hostname=SERVER_NAME)


def _worker(cfg: Config, client_id: str) -> Worker:
    return Worker(cfg.gearman.addresses(), client_id=client_id, ssl_context=ssl_context(cfg),
                  server_hostname=SERVER_NAME, **FAST)


def _refused(err: ServerUnavailable) -> None:
    assert err.attempts and all(isinstance(e, (ssl.SSLError, ConnectionError)) for _, e in err.attempts), \
        err.attempts


class StunnelLog:
    """What stunnel logged from now on: the server's own account of every connection."""

    def __init__(self, stunnel: tls.Stunnel) -> None:
        self.path = stunnel.log_path
        self.mark = self.path.stat().st_size

    def lines(self) -> list[str]:
        with open(self.path, "rb") as f:
            f.seek(self.mark)
            return f.read().decode(errors="replace").splitlines()

    def assert_only_refusals(self, reason: str, at_least: int) -> None:
        lines = self.lines()
        # stunnel opens its connection to gearmand only after a handshake it accepted.
        forwarded = [line for line in lines if "s_connect: connected" in line]
        assert not forwarded, f"stunnel forwarded a connection to gearmand: {forwarded}"
        refusals = [line for line in lines if reason in line]
        assert len(refusals) >= at_least, f"expected {at_least}+ refusals for {reason!r}:\n" + "\n".join(lines)


def _queued(farm: MTLSFarm, function: str) -> tuple[int, int]:
    """(queued, workers) for ``function`` as gearmand itself reports it, behind no TLS."""
    status = admin.status(*farm.gearmand.address).get(function)
    return (status.queued, status.workers) if status else (0, 0)


def test_a_valid_client_certificate_submits_takes_reads_status_and_delivers(farm: MTLSFarm) -> None:
    cfg = farm.hosts["valid"]
    taken: list[bytes] = []
    delivered: list[bytes] = []
    worker = _worker(cfg, "mtls-valid")
    worker.register("mtls_work", lambda job: taken.append(job.data) or b"done:" + job.data)
    collector = _worker(cfg, "mtls-collector")
    collector.register(COLLECT_FUNCTION, lambda job: delivered.append(job.data) or b"")
    with _client(cfg) as client:
        client.submit_background("mtls_work", b"job-1", unique="mtls-valid-1")
        assert worker.work_one(timeout=10), "the valid host took no job"
        client.submit_background(COLLECT_FUNCTION, b"result of job-1", unique="mtls-valid-result")
        assert collector.work_one(timeout=10), "the collector got no result"
        status = admin.status(*farm.stunnel.address, ssl_context=ssl_context(cfg))
    assert taken == [b"job-1"] and delivered == [b"result of job-1"]
    assert COLLECT_FUNCTION in status and "mtls_work" in status
    worker.close()
    collector.close()


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_host_without_a_valid_certificate_gets_nothing(farm: MTLSFarm, case: str) -> None:
    cfg, reason = farm.hosts[case], REFUSALS[case]
    tag = case.replace(" ", "_")
    submit_fn, take_fn = f"mtls_submit_{tag}", f"mtls_take_{tag}"
    with _client(farm.hosts["valid"]) as good:
        good.submit_background(take_fn, b"payload for someone else", unique=f"{tag}-take")
    assert _queued(farm, take_fn) == (1, 0)
    log = StunnelLog(farm.stunnel)

    with _client(cfg) as bad:
        # Submit: refused during the handshake, and gearmand never heard of the function.
        with pytest.raises(ServerUnavailable) as err:
            bad.submit_background(submit_fn, b"must not arrive", unique=f"{tag}-submit")
        _refused(err.value)
        assert _queued(farm, submit_fn) == (0, 0)
        # Deliver a result: the collector's function stays empty.
        before = _queued(farm, COLLECT_FUNCTION)[0]
        with pytest.raises(ServerUnavailable) as err:
            bad.submit_background(COLLECT_FUNCTION, b"forged result", unique=f"{tag}-result")
        _refused(err.value)
        assert _queued(farm, COLLECT_FUNCTION)[0] == before
        # Read status, through the job protocol and through the admin protocol.
        with pytest.raises(ServerUnavailable) as err:
            bad.get_status("H:nowhere:1")
        _refused(err.value)
    with pytest.raises(ServerUnavailable) as err:
        admin.status(*farm.stunnel.address, ssl_context=ssl_context(cfg))
    _refused(err.value)

    # Take a job: the valid host queued one above; the bad worker cannot register or grab it.
    got: list[bytes] = []
    bad_worker = _worker(cfg, f"mtls-{tag}")
    bad_worker.register(take_fn, lambda job: got.append(job.data) or b"")
    assert not bad_worker.work_one(timeout=1.5)
    bad_worker.close()
    assert got == [] and _queued(farm, take_fn) == (1, 0)
    # Four refused calls plus the worker's connection attempts, each refused for this reason,
    # and not one connection reached gearmand.
    log.assert_only_refusals(reason, at_least=5)
    # ... and the job is still there for a host with a valid certificate: nothing was lost.
    good_worker = _worker(farm.hosts["valid"], f"mtls-good-{tag}")
    good_worker.register(take_fn, lambda job: got.append(job.data) or b"")
    assert good_worker.work_one(timeout=10)
    good_worker.close()
    assert got == [b"payload for someone else"]


def test_revoking_a_working_host_shuts_it_out_after_reload(farm: MTLSFarm) -> None:
    cert = tls.create_client_cert(farm.ca, "test-7.lab")
    cfg = _config(farm.stunnel.address, farm.ca.cert, cert)
    with _client(cfg) as client:
        client.submit_background("mtls_before_revoke", b"x", unique="rev-1")
    assert _queued(farm, "mtls_before_revoke")[0] == 1
    revoked = tls.revoke(farm.ca, "test-7.lab")
    assert [e.name for e in revoked] == ["test-7.lab"] and revoked[0].revoked
    farm.stunnel.reload()
    log = StunnelLog(farm.stunnel)
    with _client(cfg) as client, pytest.raises(ServerUnavailable) as err:
        client.submit_background("mtls_after_revoke", b"x", unique="rev-2")
    _refused(err.value)
    log.assert_only_refusals(REFUSALS["revoked"], at_least=1)
    assert _queued(farm, "mtls_after_revoke") == (0, 0)
    # The other hosts are unaffected by the reload.
    with _client(farm.hosts["valid"]) as client:
        client.submit_background("mtls_after_revoke", b"y", unique="rev-3")
    assert _queued(farm, "mtls_after_revoke")[0] == 1


def test_half_a_client_certificate_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key together"):
        GearmanConfig(tls_ca="ca.crt", tls_cert="host.crt")
    with pytest.raises(ValueError, match="needs tls_ca"):
        GearmanConfig(tls_cert="host.crt", tls_key="host.key")


def test_an_unreadable_client_certificate_names_the_fix(tmp_path: Path, farm: MTLSFarm) -> None:
    with pytest.raises(tls.TLSError, match="gearfarm tls client"):
        tls.client_context(farm.ca.cert, tmp_path / "missing.crt", tmp_path / "missing.key")


def test_postgresql_with_verify_full_and_a_client_certificate(tmp_path: Path) -> None:
    """The lab's results database: the farm connects with sslmode=verify-full and its host
    certificate; without either, or trusting another CA, it gets no connection."""
    ca = tls.create_ca(tmp_path / "ca")
    other = tls.create_ca(tmp_path / "other", common_name="someone else's CA")
    srv = tls.create_server_cert(ca, ["db.farm.test", "127.0.0.1"], tmp_path / "pg.crt", tmp_path / "pg.key")
    host = tls.create_client_cert(ca, "collector.lab")
    server = PostgresServer(tls=(srv.cert, srv.key, ca.cert))
    try:
        server.start()
    except PostgresError as e:
        pytest.skip(f"PostgreSQL unavailable: {e}")
    try:
        plain = server.create_database("mtls_results")
        full = (f"{plain}?sslmode=verify-full&sslrootcert={ca.cert}"
                f"&sslcert={host.cert}&sslkey={host.key}")
        db = ResultsDB(full)  # migrates to head over TLS
        assert db.create_run("mtls-run", "a" * 40, ["linux-x86_64"], ["linux-x86_64:build"])
        with db.engine.connect() as conn:
            row = conn.exec_driver_sql("SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()").one()
        assert row[0] is True and row[1] == "/CN=collector.lab", row
        assert ResultsDB(full).get_run("mtls-run") is not None
        db.engine.dispose()
        refused = {  # url: what the server (or, for the last, libpq) says
            f"{plain}?sslmode=verify-full&sslrootcert={ca.cert}": "connection requires a valid client certificate",
            f"{plain}?sslmode=disable": "no encryption",
            (f"{plain}?sslmode=verify-full&sslrootcert={other.cert}&sslcert={host.cert}&sslkey={host.key}"):
                "certificate verify failed",
        }
        for url, reason in refused.items():
            engine = create_engine(url)
            with pytest.raises(OperationalError) as err:
                engine.connect().close()
            engine.dispose()
            assert reason in str(err.value), f"{url}: {err.value}"
    finally:
        server.stop()
