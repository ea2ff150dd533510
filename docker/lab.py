"""The compose lab (docker/compose.yaml, docs/lab.md "The compose lab"): make its directory
(the farm CA, every server's and host's certificate, the nightly's signing key and each worker
host's own, each host's config, the secrets), bring it up in order (enrolling every worker host's
key in the registry with its role and targets), stop and start its parts, and take it down.

    .venv/bin/python docker/lab.py init LAB --repo . [--targets linux-x86_64,linux-i686]
    .venv/bin/python docker/lab.py up LAB
    ./nightly.bash --config LAB/nightly/farm.toml
    .venv/bin/python docker/lab.py stop LAB gearmand1 minio3     # and start LAB ...
    .venv/bin/python docker/lab.py down LAB

The order matters. compose.yaml states it (the hosts' depends_on waits for the servers'
health checks), but Debian 12's podman-compose (1.0.3) only starts services in that order
without waiting, and the workers' MinIO users must exist before a worker's first job, which
needs MinIO's admin API up first: so `up` waits for each server itself and makes the users in
between. Every host gets only its own client certificate and key, and a worker
only its role's MinIO keys (never MinIO's root keys); only the nightly's host holds the root
keys, as in a real lab.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gearfarm import config as config_mod
from gearfarm.config import Config, S3Keys
from gearfarm.db.registry import Registry
from gearfarm.db.results import ResultsDB
from gearfarm.formats.seal import Signer
from gearfarm.gearman import admin
from gearfarm.hosts import tls
from gearfarm.hosts.connection import ssl_context
from gearfarm.hosts.net import free_port
from gearfarm.s3.minio import make_role_users
from gearfarm.s3.store import ArtifactStore

COMPOSE = Path(__file__).resolve().parent / "compose.yaml"
SERVERS = ("gearmand1", "gearmand2", "minio1", "minio2", "minio3", "minio4", "postgres")
# The farm's hosts: (service, the gearfarm role whose MinIO keys it gets).
HOSTS = (("collector", "collector"), ("build-1", "build"), ("test-1", "test"), ("perf-1", "perf"))
MINIO_NODES = ("minio1", "minio2", "minio3", "minio4")
IN_CONTAINER = Path("/etc/gearfarm")
# Where each image's user must be able to read its directory: (lab subdirectory, image).
OWNERS = (("gearmand", "gearfarm-gearmand"), ("minio", "gearfarm-minio"), ("postgres", "gearfarm-postgres"),
          ("hosts/collector", "gearfarm-base"), ("hosts/build-1", "gearfarm-worker"),
          ("hosts/test-1", "gearfarm-worker"), ("hosts/perf-1", "gearfarm-worker"))
DEFAULT_TARGETS = "linux-x86_64,linux-i686,linux-aarch64"


class LabError(RuntimeError):
    pass


def podman() -> str:
    # The settings podman needs on these machines (docker/containers.conf: runc, no default
    # ulimits), unless the caller chose its own.
    os.environ.setdefault("CONTAINERS_CONF", str(COMPOSE.parent / "containers.conf"))
    exe = shutil.which("podman")
    if exe is None:
        raise LabError("podman not found: apt-get install podman runc podman-compose (make setup does)")
    return exe


def read_env(lab: Path) -> dict[str, str]:
    path = lab / "lab.env"
    if not path.exists():
        raise LabError(f"{path} not found: make the lab first (docker/lab.py init {lab})")
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _image_uid(image: str) -> int:
    out = subprocess.run([podman(), "run", "--rm", "--network", "none", "--no-healthcheck",
                          "--entrypoint", "/usr/bin/id", f"localhost/{image}", "-u"], capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"cannot run localhost/{image} ({out.stderr.strip()}): build the images first (make images)")
    return int(out.stdout)


def _chown(tree: Path, uid: int) -> None:
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, uid, -1)


def _server_tls(ca: tls.CertFiles, out: Path, names: Sequence[str], minio: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if minio:
        tls.create_server_cert(ca, names, out / "public.crt", out / "private.key")
        (out / "CAs").mkdir(exist_ok=True)
        shutil.copy(ca.cert, out / "CAs" / "ca.crt")
        return
    tls.create_server_cert(ca, names, out / "server.crt", out / "server.key")
    shutil.copy(ca.cert, out / "ca.crt")
    shutil.copy(ca.cert.parent / tls.CRL_FILE, out / tls.CRL_FILE)


def _host_config(lab: Path, env: dict[str, str], host: str, role: str | None, inside: bool,
                 repo: str, targets: list[str], roles: dict[str, S3Keys], root: S3Keys, nightly_key: str) -> Config:
    """One host's config. ``inside``: a container of the lab (servers by service name, files
    under /etc/gearfarm); else the container host itself (the nightly, through 127.0.0.1)."""
    base = IN_CONTAINER if inside else lab / "hosts" / host
    tls_dir = base / "tls"
    if inside:
        gearmand = ["gearmand1:4731", "gearmand2:4731"]
        minio = [f"https://{n}:9000" for n in MINIO_NODES]
        pg = "postgres:5432"
    else:
        gearmand = [f"127.0.0.1:{env['GF_GEARMAND1_PORT']}", f"127.0.0.1:{env['GF_GEARMAND2_PORT']}"]
        minio = [f"https://127.0.0.1:{env[f'GF_{n.upper()}_PORT']}" for n in MINIO_NODES]
        pg = f"127.0.0.1:{env['GF_POSTGRES_PORT']}"
    keys = roles[role] if role else root
    data: dict[str, object] = {
        "projects": [{"name": "engine", "repo": repo, "targets": targets}],
        "gearman": {"servers": gearmand, "tls_ca": str(tls_dir / "ca.crt"),
                    "tls_cert": str(tls_dir / "host.crt"), "tls_key": str(tls_dir / "host.key")},
        "s3": {"endpoint": minio[0], "endpoints": minio[1:], "ca_bundle": str(tls_dir / "ca.crt"),
               "access_key": keys.access_key, "secret_key": keys.secret_key,
               "roles": {role: keys} if role else {}},
        "farm": {"nightly_keys": [nightly_key], "host_name": host,
                 "state_dir": "/var/lib/gearfarm/state" if inside else str(lab / "nightly-state"), "repo": repo},
    }
    # Only the nightly's host holds the key that signs payloads; a worker host holds its own.
    if role is None:
        data["farm"]["signing_key"] = str(base / "keys" / "nightly.key")  # type: ignore[index]
    elif role != "collector":
        data["farm"]["host_key"] = str(base / "keys" / "host.key")  # type: ignore[index]
    if role in (None, "collector"):
        data["database"] = {"url": f"postgresql+psycopg://gearfarm@{pg}/gearfarm?sslmode=verify-full"
                                   f"&sslrootcert={tls_dir / 'ca.crt'}&sslcert={tls_dir / 'host.crt'}"
                                   f"&sslkey={tls_dir / 'host.key'}"}
    return Config.model_validate(data)


def init(lab: Path, repo: str, targets: str, perf_targets: str) -> None:
    if (lab / "lab.env").exists():
        raise LabError(f"{lab} already holds a lab (lab.env): take it down and remove it, or pick another directory")
    lab.mkdir(parents=True, exist_ok=True)
    wanted = [t for t in targets.split(",") if t]
    env = {"GEARFARM_LAB": str(lab.resolve()), "GF_PROJECT": f"gearfarm-lab-{secrets.token_hex(3)}",
           "GF_BUILD_TARGETS": targets, "GF_TEST_TARGETS": targets, "GF_PERF_TARGETS": perf_targets}
    for name in SERVERS:
        env[f"GF_{name.upper()}_PORT"] = str(free_port())
    ca = tls.create_ca(lab / "ca", "gearfarm lab CA")
    local = ["localhost", "127.0.0.1"]
    _server_tls(ca, lab / "gearmand" / "tls", ["gearmand1", "gearmand2", *local])
    _server_tls(ca, lab / "minio" / "tls" / "minio", [*MINIO_NODES, *local], minio=True)
    _server_tls(ca, lab / "postgres" / "tls", ["postgres", *local])
    root = S3Keys(access_key="gearfarm-root", secret_key=secrets.token_urlsafe(24))
    config_mod.write_private(lab / "minio.env",
                             f"MINIO_ROOT_USER={root.access_key}\nMINIO_ROOT_PASSWORD={root.secret_key}\n".encode())
    roles = {role: S3Keys(access_key=f"gearfarm-{role}", secret_key=secrets.token_urlsafe(24))
             for _, role in HOSTS}
    nightly = Signer.generate()
    config_mod.write_private(lab / "hosts" / "nightly" / "keys" / "nightly.key", nightly.pem())
    for host, role in (*HOSTS, ("nightly", None)):
        d = lab / "hosts" / host
        (d / "tls").mkdir(parents=True, exist_ok=True)
        tls.create_client_cert(ca, f"{host}.lab", d / "tls" / "host.crt", d / "tls" / "host.key")
        shutil.copy(ca.cert, d / "tls" / "ca.crt")
        if role not in (None, "collector"):
            config_mod.write_private(d / "keys" / "host.key", Signer.generate().pem())
        cfg = _host_config(lab, env, host, role, host != "nightly", str(Path(repo).resolve()), wanted,
                           roles, root, nightly.public_text)
        config_mod.dump(cfg, d / "farm.toml")
    for sub, image in OWNERS:
        _chown(lab / sub, _image_uid(image))
    (lab / "lab.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    print(f"made the lab in {lab}; next: docker/lab.py up {lab}")


def compose(lab: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = read_env(lab)
    podman()
    exe = shutil.which("podman-compose")
    if exe is None:
        raise LabError("podman-compose not found: apt-get install podman-compose (make setup does)")
    out = subprocess.run([exe, "-p", env["GF_PROJECT"], "-f", str(COMPOSE), *args], env={**os.environ, **env},
                         capture_output=True, text=True)
    if check and out.returncode != 0:
        raise LabError(f"podman-compose {' '.join(args)} failed ({out.returncode}): "
                       f"{(out.stderr or out.stdout).strip()[-2000:]}")
    return out


def nightly_config(lab: Path) -> Config:
    return config_mod.load(lab / "hosts" / "nightly" / "farm.toml")


def _until(what: str, ok: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | str = "not yet"
    while time.monotonic() < deadline:
        try:
            if ok():  # type: ignore[operator]
                return
        except Exception as e:  # noqa: BLE001 - any failure here means "not up yet"; the last is reported
            last = e
        time.sleep(1.0)
    raise LabError(f"{what} not up after {timeout:.0f}s: {last}")


def _minio_cluster_ok(cfg: Config) -> bool:
    ctx = ssl.create_default_context(cafile=cfg.s3.ca_bundle)
    # The cluster endpoint answers 200 only while the erasure set has its write quorum.
    with urllib.request.urlopen(f"{cfg.s3.endpoint}/minio/health/cluster", context=ctx, timeout=5) as r:
        return bool(r.status == 200)


def _postgres_ok(cfg: Config) -> bool:
    import sqlalchemy

    engine = sqlalchemy.create_engine(cfg.database.url)
    try:
        with engine.connect() as c:
            return c.execute(sqlalchemy.text("select 1")).scalar() == 1
    finally:
        engine.dispose()


def _functions(cfg: Config) -> set[str]:
    """Functions with a worker, on every gearmand (each must see every worker)."""
    seen: list[set[str]] = []
    for host, port in cfg.gearman.addresses():
        st = admin.status(host, port, ssl_context=ssl_context(cfg))
        seen.append({f for f, s in st.items() if s.workers > 0})
    return set.intersection(*seen)


def _gearmand_ok(cfg: Config) -> bool:
    """True once both job servers answer the admin protocol through their stunnel (raises before)."""
    _functions(cfg)
    return True


def wanted_functions(lab: Path) -> set[str]:
    env = read_env(lab)
    return ({f"build:{t}" for t in env["GF_BUILD_TARGETS"].split(",")} |
            {f"test:{t}" for t in env["GF_TEST_TARGETS"].split(",")} |
            {f"perf:{t}" for t in env["GF_PERF_TARGETS"].split(",") if t} | {"collect"})


def up(lab: Path, timeout: float = 180.0) -> None:
    cfg = nightly_config(lab)
    compose(lab, "up", "-d", *SERVERS)
    _until("MinIO (cluster health, write quorum)", lambda: _minio_cluster_ok(cfg), timeout)
    _until("PostgreSQL (TLS, client certificate)", lambda: _postgres_ok(cfg), timeout)
    _until("both gearmand (mutual TLS)", lambda: _gearmand_ok(cfg), timeout)
    env = read_env(lab)
    make_role_users(cfg.s3, _role_keys(lab), {role: _targets(env, role) for _, role in HOSTS if role != "collector"})
    ArtifactStore(cfg.s3, retry_for=30).ensure_bucket()
    enroll(lab, cfg)
    compose(lab, "up", "-d", *(h for h, _ in HOSTS))
    want = wanted_functions(lab)
    _until(f"the workers ({', '.join(sorted(want))}) on both gearmand", lambda: want <= _functions(cfg), timeout)


def enroll(lab: Path, cfg: Config) -> None:
    """Register every worker host's public key with the role and targets it serves, as an
    operator does with `gearfarm keys add` (as its TLS certificate is made by the lab's CA)."""
    env = read_env(lab)
    registry = Registry(ResultsDB(cfg.database.url))
    for host, role in HOSTS:
        if role == "collector":
            continue
        key = Signer.load(lab / "hosts" / host / "keys" / "host.key")
        registry.add(host, key.public_text, [role], list(_targets(env, role)))


def _targets(env: dict[str, str], role: str) -> tuple[str, ...]:
    """The targets the lab's host of ``role`` serves: its key is registered for them and its
    MinIO user writes only theirs."""
    return tuple(t for t in env[f"GF_{role.upper()}_TARGETS"].split(",") if t)


def _role_keys(lab: Path) -> dict[str, S3Keys]:
    """Each role's keys, from its host's config (the nightly's holds the root keys only)."""
    keys: dict[str, S3Keys] = {}
    for host, role in HOSTS:
        cfg = config_mod.load(lab / "hosts" / host / "farm.toml")
        keys[role] = cfg.s3.roles[role]
    return keys


def down(lab: Path) -> None:
    compose(lab, "down", "-v", "-t", "10", check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="docker/lab.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="make the lab directory: certificates, configs, secrets, ports")
    p.add_argument("lab", type=Path)
    p.add_argument("--repo", default=".", help="the engine's repository, read by the nightly on this host")
    p.add_argument("--targets", default=DEFAULT_TARGETS, help="what the build and test containers serve")
    p.add_argument("--perf-targets", default="linux-x86_64", help="what the perf container measures")
    for name in ("up", "down"):
        sub.add_parser(name).add_argument("lab", type=Path)
    for name in ("stop", "start"):
        p = sub.add_parser(name, help=f"{name} some of the lab's services")
        p.add_argument("lab", type=Path)
        p.add_argument("services", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            init(args.lab, args.repo, args.targets, args.perf_targets)
        elif args.command == "up":
            up(args.lab)
            print(f"the lab is up; run: ./nightly.bash --config {args.lab / 'hosts' / 'nightly' / 'farm.toml'}")
        elif args.command == "down":
            down(args.lab)
        else:
            compose(args.lab, args.command, *args.services)
    except (LabError, tls.TLSError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
