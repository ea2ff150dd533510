"""TLS for the farm (issue #7): the farm CA, stunnel in front of gearmand, MinIO over HTTPS.

Everything runs against the real programs on free loopback ports, state in tmp dirs:
gearmand bound to 127.0.0.1, stunnel (Debian stunnel4) terminating TLS in front of it, and
MinIO with ``--certs-dir``.  Clients and workers are configured the way the farm configures
them (``gearfarm.hosts.connection.ssl_context`` from ``[gearman] tls_ca`` / ``tls_server_name``).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import SSLError as BotoSSLError

from gearfarm.config import Config, GearmanConfig
from gearfarm.gearman import Client, Command, Job, ServerUnavailable, Worker, admin
from gearfarm.gearman.protocol import REQ, RES, encode
from gearfarm.hosts import tls
from gearfarm.hosts.connection import ssl_context
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3.store import ArtifactStore, StoreError

# The name clients ask for (tls_server_name); deliberately not resolvable, because the
# clients dial 127.0.0.1 and only the certificate check uses the name.
SERVER_NAME = "gearman.farm.test"
FAST = {"poll_interval": 0.1, "max_backoff": 0.3}


@dataclass
class TLSFarm:
    ca: tls.CertFiles
    other_ca: tls.CertFiles
    gearmand: Gearmand
    stunnel: tls.Stunnel

    def config(self, ca: Path, server_name: str | None = SERVER_NAME) -> Config:
        host, port = self.stunnel.address
        return Config(gearman=GearmanConfig(servers=[f"{host}:{port}"], tls_ca=str(ca),
                                            tls_server_name=server_name))


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSFarm]:
    base = tmp_path_factory.mktemp("tls")
    ca = tls.create_ca(base / "ca")
    # A second, unrelated CA: what a host with the wrong tls_ca file trusts.
    other_ca = tls.create_ca(base / "other-ca", common_name="someone else's CA")
    server = tls.create_server_cert(ca, [SERVER_NAME, "localhost", "127.0.0.1"],
                                    base / "certs" / "server.crt", base / "certs" / "server.key")
    with Gearmand(base / "gearmand") as gearmand, \
            tls.Stunnel(base / "stunnel", gearmand.address, server.cert, server.key) as stunnel:
        yield TLSFarm(ca, other_ca, gearmand, stunnel)


@contextmanager
def serving(worker: Worker) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=worker.work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive(), "worker loop did not stop within 5 s"


def test_worker_and_client_round_trip_jobs_over_verified_tls(farm: TLSFarm) -> None:
    cfg = farm.config(farm.ca.cert)
    ctx = ssl_context(cfg)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    background_done = threading.Event()
    seen: list[bytes] = []

    def echo(job: Job) -> bytes:
        return b"tls:" + job.data

    def record(job: Job) -> bytes:
        seen.append(job.data)
        background_done.set()
        return b""

    worker = Worker(cfg.gearman.addresses(), client_id="tls-worker", ssl_context=ctx,
                    server_hostname=cfg.gearman.tls_server_name, **FAST)
    worker.register("tls_echo", echo)
    worker.register("tls_record", record)
    with serving(worker), Client(cfg.gearman.addresses(), ssl_context=ctx,
                                 server_hostname=cfg.gearman.tls_server_name) as client:
        assert client.submit("tls_echo", b"hello", unique="fg-1", timeout=15) == b"tls:hello"
        client.submit_background("tls_record", b"queued over tls", unique="bg-1")
        assert background_done.wait(15), "background job not run within 15 s"
        assert seen == [b"queued over tls"]
        # The admin protocol through stunnel, verified (it checks the address it dials,
        # which is why the certificate carries 127.0.0.1).
        status = admin.status(*farm.stunnel.address, ssl_context=ctx)
        assert status["tls_echo"].workers == 1 and status["tls_record"].workers == 1
    # Through stunnel gearmand sees every TLS client as a connection from loopback.
    workers_seen = admin.workers(*farm.gearmand.address)
    assert all(w.ip == "127.0.0.1" for w in workers_seen), workers_seen


@pytest.mark.parametrize("case", ["wrong CA", "wrong server name"])
def test_client_that_cannot_verify_the_server_is_refused_and_submits_nothing(farm: TLSFarm, case: str) -> None:
    if case == "wrong CA":
        cfg = farm.config(farm.other_ca.cert)
    else:
        cfg = farm.config(farm.ca.cert, server_name="other.farm.test")
    function = "tls_refused_" + case.replace(" ", "_")
    with Client(cfg.gearman.addresses(), ssl_context=ssl_context(cfg),
                server_hostname=cfg.gearman.tls_server_name) as client:
        with pytest.raises(ServerUnavailable) as info:
            client.submit_background(function, b"must not arrive", unique="refused-1")
    errors = [err for _, err in info.value.attempts]
    assert errors and all(isinstance(e, ssl.SSLCertVerificationError) for e in errors), errors
    # Asked on gearmand's own loopback port: the function was never heard of.
    assert function not in admin.status(*farm.gearmand.address)
    if case == "wrong server name":
        return  # the admin helpers check the address they dial, not tls_server_name
    # The admin helpers refuse the same way (they wrap the error with the address).
    with pytest.raises(ServerUnavailable) as admin_info:
        admin.status(*farm.stunnel.address, ssl_context=ssl_context(cfg))
    assert isinstance(admin_info.value.attempts[0][1], ssl.SSLCertVerificationError), admin_info.value


def _plaintext_exchange(address: tuple[str, int], payload: bytes, timeout: float = 5.0) -> bytes:
    """Send ``payload`` unencrypted and return everything received until EOF (or timeout)."""
    received = b""
    deadline = time.monotonic() + timeout
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(payload)
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
            if b"\n.\n" in received or len(received) > 65536:
                break
    return received


def test_plaintext_client_gets_no_gearman_answer_from_stunnel(farm: TLSFarm) -> None:
    echo = encode(Command.ECHO_REQ, b"plain", magic=REQ)
    # Control: gearmand itself answers these exact bytes, so the checks below can fail.
    direct = _plaintext_exchange(farm.gearmand.address, echo, timeout=1.0)
    assert direct.startswith(RES), direct
    # Binary protocol and the text admin protocol, unencrypted, to stunnel's port.
    for payload in (echo, b"status\n"):
        reply = _plaintext_exchange(farm.stunnel.address, payload)
        assert RES not in reply and b"\n.\n" not in reply, reply
        # At most a TLS alert record (content type 21) before stunnel hangs up.
        assert reply == b"" or reply[0] == 0x15, reply


def test_gearmand_listens_on_loopback_only(farm: TLSFarm) -> None:
    assert farm.gearmand.pid is not None and farm.stunnel.pid is not None
    assert tls.listening_sockets(farm.gearmand.pid) == {("127.0.0.1", farm.gearmand.port)}
    assert tls.listening_sockets(farm.stunnel.pid) == {farm.stunnel.address}
    # Bound to exactly 127.0.0.1, not to a wildcard: another loopback address is refused
    # although Linux routes all of 127/8 to lo (with 0.0.0.0 this connect would succeed).
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", farm.gearmand.port), timeout=2).close()


def test_minio_over_https_with_the_farm_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Make "no CA" mean the system trust store: no bundle may sneak in from the environment.
    for var in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(var, raising=False)
    ca = tls.create_ca(tmp_path / "ca")
    certs = tmp_path / "minio-certs"
    tls.create_server_cert(ca, ["127.0.0.1", "localhost"], certs / "public.crt", certs / "private.key")
    with MinioServer(tmp_path / "minio", certs_dir=certs, ca_bundle=ca.cert) as minio:
        cfg = minio.s3_config()
        assert cfg.endpoint.startswith("https://127.0.0.1:") and cfg.ca_bundle == str(ca.cert)
        store = ArtifactStore(cfg, retry_for=5)
        store.put_bytes("tls/hello.txt", b"over https", "text/plain")
        assert store.get_bytes("tls/hello.txt") == b"over https"
        url = store.presign("tls/hello.txt")
        assert url.startswith(f"{minio.endpoint}/"), url
        with urllib.request.urlopen(url, context=tls.client_context(ca.cert), timeout=10) as r:
            assert r.read() == b"over https"

        # The same endpoint trusted by the system store only: certificate errors.
        with pytest.raises(urllib.error.URLError) as url_err:
            urllib.request.urlopen(url, timeout=10)
        assert isinstance(url_err.value.reason, ssl.SSLCertVerificationError), url_err.value
        untrusting = ArtifactStore(cfg.model_copy(update={"ca_bundle": None}), retry_for=0)
        with pytest.raises(StoreError) as store_err:
            untrusting.put_bytes("tls/never.txt", b"must not arrive")
        assert isinstance(store_err.value.__cause__, BotoSSLError), repr(store_err.value.__cause__)
        assert "CERTIFICATE_VERIFY_FAILED" in str(store_err.value)
        assert not store.exists("tls/never.txt")


# -- the certificate helpers themselves --------------------------------------------------


@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
def test_certificates_verify_strictly_with_either_backend(tmp_path: Path, backend: str) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to check the certificates (apt-get install openssl)")
    if backend == "cryptography":
        pytest.importorskip("cryptography")
    ca = tls.create_ca(tmp_path / "ca", backend=backend)
    srv = tls.create_server_cert(ca, ["build1.lab", "10.0.0.7"], tmp_path / "s.crt", tmp_path / "s.key",
                                 backend=backend)
    for key in (ca.key, srv.key):
        assert (key.stat().st_mode & 0o777) == 0o600, key
    verify = subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile",
                             str(ca.cert), str(srv.cert)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    san = subprocess.run(["openssl", "x509", "-in", str(srv.cert), "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout
    assert "DNS:build1.lab" in san and "IP Address:10.0.0.7" in san, san
    # A certificate from the other CA does not verify against this one.
    other = tls.create_ca(tmp_path / "other", backend=backend)
    refused = subprocess.run(["openssl", "verify", "-CAfile", str(other.cert), str(srv.cert)],
                             capture_output=True, text=True)
    assert refused.returncode != 0


def test_missing_stunnel_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tls.shutil, "which", lambda name: None)
    monkeypatch.setattr(tls.os, "access", lambda path, mode: False)
    with pytest.raises(tls.TLSError, match="apt-get install stunnel4"):
        tls.find_stunnel()
