"""TLS for the farm: its own certificate authority, server and client certificates, the
revocation list, and stunnel.

Debian's gearmand accepts ``--ssl`` but is built without an SSL library, so TLS is
terminated by stunnel in front of a gearmand that listens on loopback only.  Both sides
authenticate: clients and workers verify stunnel's certificate against the farm's CA
(``[gearman] tls_ca``), and stunnel asks every client for a certificate from that CA that is
not on the CA's revocation list (``[gearman] tls_cert`` / ``tls_key``).  MinIO serves HTTPS
itself from a certificate issued by the same CA (``[s3] ca_bundle``).

Certificates are made with the ``cryptography`` package when it is importable, else with
the ``openssl`` command; both produce the same shapes (ECDSA P-256, SHA-256).  The CA
directory keeps ``issued.tsv`` (what was issued to whom, and what is revoked) and
``crl.pem``, which is signed with ``cryptography`` (a requirement of the farm).

    gearfarm tls ca DIR                       # DIR/ca.crt + DIR/ca.key, once per farm
    gearfarm tls server DIR NAME [NAME ...]   # DIR/server.crt + DIR/server.key
    gearfarm tls server DIR --minio NAME ...  # DIR/minio/public.crt + private.key
    gearfarm tls client DIR HOST              # DIR/clients/HOST.crt + HOST.key
    gearfarm tls revoke DIR HOST              # revoke HOST's certificates, rewrite crl.pem
    gearfarm tls crl DIR                      # re-sign crl.pem (before it expires)
    gearfarm tls list DIR                     # what was issued, and what is revoked

(the command line is gearfarm.cli.tls_cmd; what it does is here).

``Stunnel`` runs stunnel in the foreground on a free loopback port in front of one
(host, port), for the embedded farm and the tests; see docs/tls.md.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gearfarm.config import write_private
from gearfarm.hosts import process
from gearfarm.hosts.daemon import Daemon, Failure

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CRL_FILE = "crl.pem"
INDEX_FILE = "issued.tsv"
CLIENTS_DIR = "clients"
CA_DAYS = 3650
# stunnel (OpenSSL) rejects every client once the CRL's nextUpdate has passed, so a list that
# expired would lock the whole farm out: a year, and `crl` re-signs it (docs/tls.md).
CRL_DAYS = 365
# 825 days is the longest validity Apple platforms accept for a server certificate; staying
# under it costs nothing and keeps the certificates usable from any client.
SERVER_DAYS = 825


class TLSError(RuntimeError):
    """A certificate could not be made, or stunnel is missing or failed to start."""


@dataclass(frozen=True)
class CertFiles:
    """A PEM certificate and its (unencrypted, mode 0600) PEM private key."""

    cert: Path
    key: Path


# -- certificates ----------------------------------------------------------------------


def _have_cryptography() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def _backend(backend: str | None) -> str:
    if backend is None:
        backend = "cryptography" if _have_cryptography() else "openssl"
    if backend not in ("cryptography", "openssl"):
        raise ValueError(f"backend must be 'cryptography' or 'openssl', not {backend!r}")
    if backend == "openssl" and shutil.which("openssl") is None:
        raise TLSError("neither the Python 'cryptography' package nor the 'openssl' command is available; "
                       "install one (apt-get install openssl)")
    return backend


def _write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)


def _split_names(names: Sequence[str]) -> tuple[list[str], list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    dns: list[str] = []
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        try:
            ips.append(ipaddress.ip_address(name))
        except ValueError:
            # Clients check the name they connect to (or tls_server_name) against these.
            if any(c.isspace() or c in ",/" for c in name):
                raise ValueError(f"not a host name or IP address: {name!r}") from None
            dns.append(name.lower())
    if not dns and not ips:
        raise ValueError("a server certificate needs at least one host name or IP address")
    return dns, ips


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


@dataclass(frozen=True)
class Issued:
    """One line of the CA's ``issued.tsv``: a certificate the CA signed."""

    serial: int
    kind: str  # "server" | "client"
    name: str
    not_after: str  # ISO 8601, UTC
    revoked: str = ""  # ISO 8601 when revoked, else ""


def create_ca(directory: Path, common_name: str = "gearfarm farm CA", days: int = CA_DAYS,
              overwrite: bool = False, backend: str | None = None) -> CertFiles:
    """Create the farm's CA as ``directory/ca.crt`` and ``directory/ca.key``, with an empty
    index of issued certificates and an empty revocation list (stunnel needs the file).

    Refuses to replace an existing CA key unless ``overwrite``: every certificate issued
    by the old one (and every host's tls_ca) would silently stop matching.
    """
    directory = Path(directory)
    files = CertFiles(directory / CA_CERT, directory / CA_KEY)
    if files.key.exists() and not overwrite:
        raise TLSError(f"{files.key} exists; the farm already has a CA (replacing it invalidates every certificate "
                       "it issued: gearfarm tls ca --force)")
    if _backend(backend) == "cryptography":
        _ca_cryptography(files, common_name, days)
    else:
        _ca_openssl(files, common_name, days)
    _write_public(directory / INDEX_FILE, b"")
    write_crl(files)
    return files


def ca_files(directory: Path) -> CertFiles:
    """The farm CA kept in ``directory``; TLSError saying how to make one when it holds none."""
    directory = Path(directory)
    ca = CertFiles(directory / CA_CERT, directory / CA_KEY)
    if not ca.cert.exists():
        raise TLSError(f"{ca.cert} not found: {directory} holds no farm CA (create one with: gearfarm tls ca "
                       f"{directory})")
    return ca


def issue_server(ca_dir: Path, names: Sequence[str], out: Path | None = None, minio: bool = False,
                 days: int = SERVER_DAYS) -> CertFiles:
    """A server certificate from the CA in ``ca_dir``, as ``out/server.crt`` and ``server.key``
    (``out`` defaults to ``ca_dir``), or with ``minio`` as ``public.crt`` and ``private.key``,
    the names MinIO's --certs-dir wants (``out`` defaults to ``ca_dir/minio``)."""
    ca = ca_files(ca_dir)
    if minio:
        out = Path(out) if out else Path(ca_dir) / "minio"
        return create_server_cert(ca, names, out / "public.crt", out / "private.key", days)
    out = Path(out) if out else Path(ca_dir)
    return create_server_cert(ca, names, out / "server.crt", out / "server.key", days)


def issue_client(ca_dir: Path, name: str, out: Path | None = None, days: int = SERVER_DAYS) -> CertFiles:
    """A client certificate for host ``name`` from the CA in ``ca_dir``, as ``out/NAME.crt``
    and ``NAME.key`` (``out`` defaults to ``ca_dir/clients``)."""
    ca = ca_files(ca_dir)
    out = Path(out) if out else Path(ca_dir) / CLIENTS_DIR
    return create_client_cert(ca, name, out / f"{name}.crt", out / f"{name}.key", days)


def create_server_cert(ca: CertFiles, names: Sequence[str], cert: Path, key: Path,
                       days: int = SERVER_DAYS, backend: str | None = None) -> CertFiles:
    """Issue a TLS server certificate for ``names`` (host names and/or IP addresses).

    The first name becomes the subject's common name; all go into subjectAltName, which is
    what clients check.  Include every name clients use: the lab host name, and 127.0.0.1
    if anything connects over loopback (the admin helpers verify the address they dial).
    """
    dns, ips = _split_names(names)
    files = CertFiles(Path(cert), Path(key))
    _issue(ca, files, "server", dns[0] if dns else str(ips[0]), dns, ips, days, backend)
    return files


def create_client_cert(ca: CertFiles, name: str, cert: Path | None = None, key: Path | None = None,
                       days: int = SERVER_DAYS, backend: str | None = None) -> CertFiles:
    """Issue a client certificate for the farm host ``name`` (its common name; what ``revoke``
    takes), by default as ``CA_DIR/clients/NAME.crt`` and ``NAME.key``.

    Every host that talks to gearmand through stunnel needs one: workers, the collector,
    the host running the nightly, the dashboard."""
    if not name or not set(name) <= NAME_CHARS:
        raise ValueError(f"client name {name!r}: use letters, digits, '.', '-' and '_' (e.g. build-1.lab)")
    out = ca.cert.parent / CLIENTS_DIR
    files = CertFiles(Path(cert) if cert else out / f"{name}.crt", Path(key) if key else out / f"{name}.key")
    _issue(ca, files, "client", name, [], [], days, backend)
    return files


def client_context(ca_file: str | os.PathLike[str], cert: str | os.PathLike[str] | None = None,
                   key: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """The client side: verify the peer's chain against ``ca_file`` and its host name, and
    present ``cert`` (with ``key``) when the server asks for a client certificate."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
        except (OSError, ssl.SSLError) as e:
            raise TLSError(f"cannot load the client certificate {cert} (key {key}): {e}; issue one with "
                           f"'gearfarm tls client CA_DIR HOST'") from e
    return ctx


# -- what the CA issued, and revocation ------------------------------------------------


def issued(ca_dir: Path) -> list[Issued]:
    """Every certificate ``ca_dir``'s CA issued, oldest first (empty for a CA made before the
    index existed: its certificates cannot be revoked by name)."""
    path = Path(ca_dir) / INDEX_FILE
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise TLSError(f"{path}:{n}: expected 5 tab-separated fields, got {len(fields)}")
        out.append(Issued(int(fields[0], 16), fields[1], fields[2], fields[3], fields[4]))
    return out


def _write_index(ca_dir: Path, entries: Sequence[Issued]) -> None:
    lines = [f"{e.serial:x}\t{e.kind}\t{e.name}\t{e.not_after}\t{e.revoked}\n" for e in entries]
    path = Path(ca_dir) / INDEX_FILE
    tmp = path.with_suffix(".tmp")
    _write_public(tmp, "".join(lines).encode())
    tmp.replace(path)  # a crash mid-write must not lose the record of what was issued


def revoke(ca: CertFiles, name: str) -> list[Issued]:
    """Revoke every unrevoked certificate issued to ``name`` and re-sign the CRL.

    stunnel reads the CRL when it starts and on SIGHUP (``Stunnel.reload``; systemd:
    ``systemctl reload gearfarm-stunnel``): until then the revoked host can still connect."""
    entries = issued(ca.cert.parent)
    now = _now().isoformat(timespec="seconds")
    hits = [e for e in entries if e.name == name and not e.revoked]
    if not hits:
        known = sorted({e.name for e in entries if not e.revoked})
        raise TLSError(f"no unrevoked certificate issued to {name!r} by {ca.cert.parent}; "
                       f"issued: {', '.join(known) or 'none'} (gearfarm tls list {ca.cert.parent})")
    revoked = [e.serial for e in hits]
    entries = [Issued(e.serial, e.kind, e.name, e.not_after, now) if e.serial in revoked else e for e in entries]
    _write_index(ca.cert.parent, entries)
    write_crl(ca)
    return [e for e in entries if e.serial in revoked]


def write_crl(ca: CertFiles, days: int = CRL_DAYS) -> Path:
    """(Re)sign ``CA_DIR/crl.pem`` listing every revoked serial; valid ``days``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    now = _now()
    builder = (x509.CertificateRevocationListBuilder()
               .issuer_name(ca_cert.subject)
               .last_update(now - datetime.timedelta(hours=1))
               .next_update(now + datetime.timedelta(days=days)))
    for e in issued(ca.cert.parent):
        if e.revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(e.serial)
                .revocation_date(datetime.datetime.fromisoformat(e.revoked)).build())
    crl = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    path = ca.cert.parent / CRL_FILE
    tmp = path.with_suffix(".tmp")
    _write_public(tmp, crl.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)
    return path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _issue(ca: CertFiles, files: CertFiles, kind: str, cn: str, dns: list[str],
           ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address], days: int, backend: str | None) -> None:
    if not ca.key.exists():
        raise TLSError(f"{ca.key} not found; create the CA first: python -m gearfarm.hosts.tls ca {ca.cert.parent}")
    if _backend(backend) == "cryptography":
        _leaf_cryptography(ca, files, kind, cn, dns, ips, days)
    else:
        _leaf_openssl(ca, files, kind, cn, dns, ips, days)
    from cryptography import x509

    made = x509.load_pem_x509_certificate(files.cert.read_bytes())
    entries = issued(ca.cert.parent)
    entries.append(Issued(made.serial_number, kind, cn, made.not_valid_after_utc.isoformat(timespec="seconds")))
    _write_index(ca.cert.parent, entries)


def _ca_cryptography(files: CertFiles, common_name: str, days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little: a host whose clock is a few minutes behind must not reject it.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(files.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    _write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))


def _leaf_cryptography(ca: CertFiles, files: CertFiles, kind: str, cn: str, dns: list[str],
                       ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address], days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TLSError(f"{ca.key}: expected the EC key written by create_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    usage = ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        # Python 3.13+ verifies with VERIFY_X509_STRICT, which requires the AKI.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns] + [x509.IPAddress(i) for i in ips]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    write_private(files.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    _write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise TLSError(f"openssl {args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")


def _ca_openssl(files: CertFiles, common_name: str, days: int) -> None:
    files.cert.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "ca.key"
        crt = Path(tmp) / "ca.crt"
        _openssl("req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-sha256", "-days", str(days), "-subj", "/CN=" + common_name.replace("/", r"\/"),
                 "-keyout", str(key), "-out", str(crt),
                 "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-addext", "subjectKeyIdentifier=hash",
                 "-addext", "authorityKeyIdentifier=keyid:always")
        write_private(files.key, key.read_bytes())
        _write_public(files.cert, crt.read_bytes())


def _leaf_openssl(ca: CertFiles, files: CertFiles, kind: str, cn: str, dns: list[str],
                  ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address], days: int) -> None:
    alt = ",".join([f"DNS:{n}" for n in dns] + [f"IP:{i}" for i in ips])
    with tempfile.TemporaryDirectory() as tmp:
        key, csr, crt, ext = (Path(tmp) / n for n in ("leaf.key", "leaf.csr", "leaf.crt", "ext.cnf"))
        ext.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            f"extendedKeyUsage={'serverAuth' if kind == 'server' else 'clientAuth'}\n"
            + (f"subjectAltName={alt}\n" if alt else "")
            + "subjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid:always\n"
        )
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-subj", f"/CN={cn}", "-keyout", str(key), "-out", str(csr))
        # A random serial per certificate (no serial file next to the CA to keep in sync).
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
                 "-set_serial", "0x" + os.urandom(16).hex(), "-sha256", "-days", str(days),
                 "-extfile", str(ext), "-out", str(crt))
        write_private(files.key, key.read_bytes())
        _write_public(files.cert, crt.read_bytes())


# -- which process listens where -------------------------------------------------------


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by process ``pid`` (Linux).

    Read from /proc, so it answers "what did *this* process bind" rather than "does
    something answer on that port" -- used to tell our stunnel from a port thief, and by
    the tests to prove gearmand is bound to loopback only.
    """
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields: sl local_address rem_address st ... uid timeout inode
            if len(fields) < 10 or fields[3] != "0A" or fields[9] not in inodes:
                continue
            hex_addr, hex_port = fields[1].split(":")
            found.add((_proc_address(hex_addr, family), int(hex_port, 16)))
    return found


def _proc_address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    # The kernel prints each 32-bit word in host (little-endian on x86/arm) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    return str(ipaddress.ip_address(words)) if family == 4 else str(ipaddress.IPv6Address(words))


# -- stunnel ---------------------------------------------------------------------------


def find_stunnel() -> str:
    """Path of stunnel: Debian's stunnel4 package installs ``stunnel4`` (and a ``stunnel`` link)."""
    for name in ("stunnel4", "stunnel"):
        found = shutil.which(name)
        if found:
            return found
    for path in ("/usr/bin/stunnel4", "/usr/bin/stunnel", "/usr/sbin/stunnel"):
        if os.access(path, os.X_OK):
            return path
    raise TLSError("stunnel not found (looked for stunnel4 and stunnel); install it with 'apt-get install stunnel4'")


def stunnel_config(accept: tuple[str, int], connect: tuple[str, int], cert: Path, key: Path,
                   service: str = "gearmand", client_ca: Path | None = None, crl: Path | None = None) -> str:
    """An stunnel configuration terminating TLS on ``accept`` and forwarding to ``connect``.

    With ``client_ca`` (the farm's mode in a lab) every client must present a certificate
    issued by that CA and not listed in ``crl``: a host without one never reaches gearmand,
    so it can neither submit, take a job, read status nor deliver a result.  Without it the
    server only proves its own identity.
    """
    values = [str(cert), str(key), service, accept[0], connect[0], str(client_ca or ""), str(crl or "")]
    for value in values:
        if "\n" in value or "\r" in value:
            raise ValueError(f"newline in stunnel setting {value!r}")
    lines = [
        "; written by gearfarm.hosts.tls",
        # Foreground: the process we started is stunnel itself and logs to our log file.
        "foreground = yes",
        # No pid file: stop() signals the child, and /run may not be writable.
        "pid =",
        "debug = notice",
        f"[{service}]",
        f"accept = {_hostport(accept)}",
        f"connect = {_hostport(connect)}",
        f"cert = {cert}",
        f"key = {key}",
        "sslVersionMin = TLSv1.2",
    ]
    if client_ca is not None:
        lines += [f"CAfile = {client_ca}", "verifyChain = yes", "requireCert = yes"]
        if crl is not None:
            lines.append(f"CRLfile = {crl}")
    return "\n".join(lines + [""])


def _hostport(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Stunnel(Daemon):
    """An stunnel child process terminating TLS in front of ``target`` (host, port).

    Listens on ``host`` (loopback by default) on ``port`` or a free one.  Use as a context
    manager or call start()/stop(), like ``Gearmand`` and ``MinioServer``.
    """

    name = "stunnel"
    error = TLSError
    awaited = "listen"
    stop_grace = 5.0

    def __init__(self, state_dir: Path, target: tuple[str, int], cert: Path, key: Path,
                 host: str = "127.0.0.1", port: int | None = None, start_timeout: float = 15.0,
                 client_ca: Path | None = None, crl: Path | None = None) -> None:
        super().__init__(Path(state_dir), Path(state_dir) / "stunnel.log", host, port, start_timeout)
        self.client_ca = Path(client_ca).resolve() if client_ca is not None else None
        self.crl = Path(crl).resolve() if crl is not None else None
        self.target = (str(target[0]), int(target[1]))
        self.cert = Path(cert).resolve()
        self.key = Path(key).resolve()
        self.config_path = self.state_dir / "stunnel.conf"
        self._binary = ""

    def __repr__(self) -> str:
        return f"<Stunnel {self.host}:{self.port} -> {_hostport(self.target)} pid={self.pid}>"

    def prepare(self) -> None:
        self._binary = find_stunnel()
        for path in (self.cert, self.key, self.client_ca, self.crl):
            if path is not None and not path.is_file():
                raise TLSError(f"stunnel: {path} does not exist")

    def command(self, port: int) -> list[str]:
        # The port is in the configuration file, not the argv: rewritten for every launch.
        self.config_path.write_text(stunnel_config((self.host, port), self.target, self.cert, self.key,
                                                   client_ca=self.client_ca, crl=self.crl))
        return [self._binary, str(self.config_path)]

    def ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        """Once *our* process listens on the port (a lost bind race makes stunnel exit)."""
        try:
            return (self.host, port) in listening_sockets(proc.pid)
        except OSError:
            return False  # the process is going away; poll() tells on the next round

    def lost_race(self, failure: Failure) -> bool:
        # stunnel exits when its bind fails, and from outside that exit looks like any other
        # (a bad configuration exits too, at once, so retrying it costs little); a timeout would
        # just repeat. Unlike gearmand it never keeps running beside a port thief.
        return failure.exited

    def reload(self, timeout: float = 10.0) -> None:
        """Re-read the configuration and the CRL (SIGHUP), e.g. after ``revoke``.  New
        connections are checked against the new list; open ones are not cut (restart for that)."""
        if self.proc is None or self.proc.poll() is not None:
            raise TLSError("stunnel is not running")
        mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(mark)
                text = f.read().decode(errors="replace")
            # stunnel logs this once the new configuration is in force.
            if "Configuration successful" in text:
                return
            if "Configuration failed" in text or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise TLSError(f"stunnel did not reload within {timeout}s; log {self.log_path}:\n"
                       f"{process.log_tail(self.log_path)}")
