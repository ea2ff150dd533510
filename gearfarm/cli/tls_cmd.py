"""`gearfarm tls`: the farm's certificate authority (docs/tls.md) -- make it, issue server and
client certificates, revoke a host, re-sign the revocation list, list what was issued. What
each does is gearfarm.hosts.tls; this is its command line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from gearfarm.cli.common import fail
from gearfarm.hosts import tls

_DIR = click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))


@contextmanager
def _refusals() -> Iterator[None]:
    """What the CA refuses (an existing CA, a name it never issued, a bad host name) as one
    error line and exit status 2."""
    try:
        yield
    except (tls.TLSError, ValueError, FileNotFoundError) as e:
        fail(str(e))


def _days(default: int, what: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option("--days", type=click.IntRange(min=1), default=default, show_default=True, help=what)


def _wrote(files: tls.CertFiles) -> None:
    click.echo(f"wrote {files.cert} and {files.key}")


@click.group("tls")
def tls_group() -> None:
    """The farm CA: its certificates for stunnel, MinIO and every host (docs/tls.md)."""


@tls_group.command("ca")
@_DIR
@click.option("--name", default="gearfarm farm CA", show_default=True, help="The CA's common name.")
@_days(tls.CA_DAYS, "Days the CA is valid.")
@click.option("--force", is_flag=True, help="Replace an existing CA (invalidates every certificate it issued).")
def tls_ca(directory: Path, name: str, days: int, force: bool) -> None:
    """Create the farm CA in DIR (once per farm).

    DIR/ca.crt and DIR/ca.key, an empty index of what it issues and an empty revocation list."""
    with _refusals():
        _wrote(tls.create_ca(directory, name, days, overwrite=force))


@tls_group.command("server")
@_DIR
@click.argument("names", nargs=-1, required=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (default: DIR, or DIR/minio with --minio).")
@click.option("--minio", is_flag=True, help="Name the files public.crt / private.key, as MinIO's --certs-dir wants.")
@_days(tls.SERVER_DAYS, "Days the certificate is valid.")
def tls_server(directory: Path, names: tuple[str, ...], out: Path | None, minio: bool, days: int) -> None:
    """Issue a server certificate for NAMES.

    Signed by DIR/ca.key, for NAMES: the host names and IP addresses clients connect to
    (stunnel's, MinIO's, PostgreSQL's)."""
    with _refusals():
        _wrote(tls.issue_server(directory, names, out, minio, days))


@tls_group.command("client")
@_DIR
@click.argument("name")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (default: DIR/clients): NAME.crt, NAME.key.")
@_days(tls.SERVER_DAYS, "Days the certificate is valid.")
def tls_client(directory: Path, name: str, out: Path | None, days: int) -> None:
    """Issue a client certificate for host NAME.

    One per farm host, NAME being its name (e.g. build-1.lab: what `revoke` takes)."""
    with _refusals():
        _wrote(tls.issue_client(directory, name, out, days))


@tls_group.command("revoke")
@_DIR
@click.argument("name")
def tls_revoke(directory: Path, name: str) -> None:
    """Revoke every certificate issued to NAME and rewrite DIR/crl.pem."""
    with _refusals():
        for e in tls.revoke(tls.ca_files(directory), name):
            click.echo(f"revoked {e.kind} certificate {e.serial:x} of {e.name}")
    click.echo(f"wrote {directory / tls.CRL_FILE}; copy it to the job servers and reload stunnel there "
               "(systemctl reload gearfarm-stunnel): until then the host can still connect")


@tls_group.command("crl")
@_DIR
@_days(tls.CRL_DAYS, "Days the list is valid (stunnel refuses every client once it has expired).")
def tls_crl(directory: Path, days: int) -> None:
    """Re-sign DIR/crl.pem (before it expires: it is valid for a year)."""
    with _refusals():
        click.echo(f"wrote {tls.write_crl(tls.ca_files(directory), days)}")


@tls_group.command("list")
@_DIR
def tls_list(directory: Path) -> None:
    """What the CA issued (serial, kind, name), and what is revoked."""
    with _refusals():
        tls.ca_files(directory)
        for e in tls.issued(directory):
            state = f"revoked {e.revoked}" if e.revoked else f"valid until {e.not_after}"
            click.echo(f"{e.serial:x}\t{e.kind}\t{e.name}\t{state}")
