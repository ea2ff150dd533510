"""`gearfarm tls` (gearfarm/cli/tls_cmd.py over gearfarm/hosts/tls.py): every subcommand and
option, the CA's index and revocation list as openssl reads them, and what it refuses (exit 2,
one error line)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from click.testing import CliRunner, Result

from gearfarm.cli.main import main
from gearfarm.hosts import tls


def gearfarm_tls(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["tls", *map(str, args)])


def openssl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)


def test_makes_a_ca_server_and_minio_certificates_and_keeps_an_existing_ca(tmp_path: Path) -> None:
    d = tmp_path / "tls"
    made = gearfarm_tls("ca", d, "--name", "lab CA", "--days", "30")
    assert made.exit_code == 0 and made.stdout == f"wrote {d / 'ca.crt'} and {d / 'ca.key'}\n", made.output
    assert "lab CA" in openssl("x509", "-in", d / "ca.crt", "-noout", "-subject").stdout
    first = (d / "ca.key").read_bytes()
    again = gearfarm_tls("ca", d)  # refuses to orphan the certificates of the old CA
    assert again.exit_code == 2 and (d / "ca.key").read_bytes() == first
    assert again.stderr.startswith("error: ") and "exists" in again.stderr and "--force" in again.stderr
    assert gearfarm_tls("ca", d, "--force").exit_code == 0 and (d / "ca.key").read_bytes() != first

    assert gearfarm_tls("server", d, "gearman1.lab", "10.1.2.3").exit_code == 0
    assert gearfarm_tls("server", d, "--minio", "minio.lab").exit_code == 0
    assert gearfarm_tls("server", d, "pg.lab", "--out", tmp_path / "pg", "--days", "2").exit_code == 0
    for name in ("tls/server.crt", "tls/server.key", "tls/minio/public.crt", "tls/minio/private.key",
                 "pg/server.crt", "pg/server.key"):
        assert (tmp_path / name).is_file(), name
    san = openssl("x509", "-in", d / "server.crt", "-noout", "-ext", "subjectAltName").stdout
    assert "DNS:gearman1.lab" in san and "IP Address:10.1.2.3" in san, san
    assert openssl("verify", "-CAfile", d / "ca.crt", tmp_path / "pg" / "server.crt").returncode == 0
    # --days: valid for two days, not the default 825.
    assert openssl("x509", "-in", tmp_path / "pg" / "server.crt", "-noout", "-checkend", str(3 * 86400)).returncode == 1

    no_ca = gearfarm_tls("server", tmp_path / "no-ca", "x.lab")
    assert no_ca.exit_code == 2 and f"gearfarm tls ca {tmp_path / 'no-ca'}" in no_ca.stderr
    assert gearfarm_tls("server", d).exit_code == 2  # no NAMES: click's usage error, also 2
    assert "Missing argument 'NAMES...'" in gearfarm_tls("server", d).stderr


def test_the_ca_keeps_an_index_and_a_crl_that_openssl_reads(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    assert gearfarm_tls("ca", d).exit_code == 0
    assert gearfarm_tls("client", d, "perf-2.lab").exit_code == 0
    assert gearfarm_tls("client", d, "build-1.lab", "--out", tmp_path / "b1", "--days", "10").exit_code == 0
    assert (tmp_path / "b1" / "build-1.lab.crt").is_file() and (tmp_path / "b1" / "build-1.lab.key").is_file()
    assert gearfarm_tls("server", d, "gearman2.lab").exit_code == 0
    revoked = gearfarm_tls("revoke", d, "perf-2.lab")
    assert revoked.exit_code == 0 and "revoked client certificate" in revoked.stdout
    assert "reload stunnel" in revoked.stdout
    twice = gearfarm_tls("revoke", d, "perf-2.lab")  # already revoked: says so, changes nothing
    assert twice.exit_code == 2 and "no unrevoked certificate issued to 'perf-2.lab'" in twice.stderr
    assert gearfarm_tls("client", d, "bad name/../x").exit_code == 2
    listing = gearfarm_tls("list", d)
    assert listing.exit_code == 0, listing.output
    lines = listing.stdout.splitlines()
    assert len(lines) == 3 and "client\tperf-2.lab\trevoked" in lines[0], lines
    assert "client\tbuild-1.lab\tvalid until" in lines[1] and "server\tgearman2.lab" in lines[2], lines
    entries = tls.issued(d)
    crl = openssl("crl", "-in", d / tls.CRL_FILE, "-noout", "-text", "-CAfile", d / tls.CA_CERT)
    assert crl.returncode == 0 and "verify OK" in crl.stderr + crl.stdout, crl.stderr
    assert f"{entries[0].serial:X}" in crl.stdout.replace(":", "").upper()
    assert f"{entries[1].serial:X}" not in crl.stdout.replace(":", "").upper()
    # openssl itself rejects the revoked certificate with the CRL, and accepts it without.
    leaf = d / tls.CLIENTS_DIR / "perf-2.lab.crt"
    assert openssl("verify", "-purpose", "sslclient", "-CAfile", d / tls.CA_CERT, leaf).returncode == 0
    checked = openssl("verify", "-crl_check", "-CAfile", d / tls.CA_CERT, "-CRLfile", d / tls.CRL_FILE, leaf)
    assert checked.returncode != 0 and "revoked" in checked.stdout + checked.stderr

    # crl re-signs the list, for --days; it still names the revoked serial.
    resigned = gearfarm_tls("crl", d, "--days", "3")
    assert resigned.exit_code == 0 and resigned.stdout == f"wrote {d / tls.CRL_FILE}\n"
    text = openssl("crl", "-in", d / tls.CRL_FILE, "-noout", "-text").stdout
    assert f"{entries[0].serial:X}" in text.replace(":", "").upper()
    assert gearfarm_tls("list", tmp_path / "nothing").exit_code == 2
