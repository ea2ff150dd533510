"""A local MinIO server for the embedded farm and the integration tests: loopback only, a free
port, data under a state directory, and a bucket ready before start() returns.

With ``certs_dir`` (holding ``public.crt`` and ``private.key``, e.g. from
``python -m gearfarm.hosts.tls server DIR --minio 127.0.0.1``) MinIO serves HTTPS only, and
``ca_bundle`` -- the CA that issued the certificate -- is what the readiness probe and
``s3_config()`` verify it with."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

from gearfarm.config import S3Config, S3Keys
from gearfarm.hosts import process
from gearfarm.hosts.net import free_port
from gearfarm.s3.keys import ALL_TARGETS, role_policy


class MinioError(RuntimeError):
    pass


def find_binary(name: str = "minio") -> str:
    """MinIO's server (``minio``) or client (``mc``), as s3/install-minio.bash built them."""
    cache = Path(os.environ.get("GEARFARM_CACHE", Path.home() / ".cache" / "gearfarm"))
    override = os.environ.get("GEARFARM_MINIO") if name == "minio" else os.environ.get("GEARFARM_MC")
    for cand in (override, str(cache / "bin" / name), shutil.which(name)):
        if cand and Path(cand).exists():
            return cand
    raise MinioError(f"MinIO's {name} binary not found; run 'make setup' (it builds MinIO and mc into "
                     f"{cache}/bin) or set {'GEARFARM_MINIO' if name == 'minio' else 'GEARFARM_MC'}")


class MinioServer:
    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 bucket: str = "gearfarm", access_key: str = "gearfarm", secret_key: str | None = None,
                 certs_dir: Path | None = None, ca_bundle: Path | None = None) -> None:
        if certs_dir is not None and ca_bundle is None:
            # Probing without verification would hide a certificate clients then reject.
            raise ValueError("MinioServer with certs_dir needs ca_bundle (the CA that issued public.crt)")
        self.state_dir = Path(state_dir)
        self.certs_dir = Path(certs_dir).resolve() if certs_dir is not None else None
        self.ca_bundle = Path(ca_bundle).resolve() if ca_bundle is not None else None
        self.host = host
        self.port = port
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / "minio.log"

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.certs_dir is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def s3_config(self) -> S3Config:
        return S3Config(endpoint=self.endpoint, bucket=self.bucket, access_key=self.access_key,
                        secret_key=self.secret_key,
                        ca_bundle=str(self.ca_bundle) if self.ca_bundle is not None else None)

    def start(self, timeout: float = 60.0) -> MinioServer:
        binary = find_binary()
        data = self.state_dir / "minio-data"
        data.mkdir(parents=True, exist_ok=True)
        if self.certs_dir is not None:
            for name in ("public.crt", "private.key"):
                if not (self.certs_dir / name).is_file():
                    raise MinioError(f"MinIO certs dir {self.certs_dir} has no {name}")
        for _ in range(3):  # a free port can be taken between probing and binding
            if self.port is None:
                self.port = free_port(self.host)
            env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                       MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CALLHOME_ENABLE="off")
            argv = [binary, "server", str(data), "--address", f"{self.host}:{self.port}", "--quiet"]
            if self.certs_dir is not None:
                # Without it MinIO reads ~/.minio/certs, which must not decide the scheme.
                argv += ["--certs-dir", str(self.certs_dir)]
            self.proc = process.spawn(argv, self.log_path, env=env)
            if self._wait_ready(timeout):
                self._make_bucket()
                return self
            process.stop(self.proc)
            self.port = None
        raise MinioError(f"MinIO did not start on {self.host}; log {self.log_path}:\n"
                         f"{process.log_tail(self.log_path)}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        url = f"{self.endpoint}/minio/health/ready"
        ctx = ssl.create_default_context(cafile=str(self.ca_bundle)) if self.ca_bundle is not None else None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=1, context=ctx) as r:
                    if r.status == 200:
                        return True
            except OSError as e:
                reason = getattr(e, "reason", e)  # urllib wraps the ssl error in URLError
                if isinstance(reason, ssl.SSLCertVerificationError):
                    # Our own MinIO answering with a certificate the CA does not vouch for is
                    # a configuration error; waiting out the timeout would only hide it.
                    self.stop()
                    raise MinioError(f"MinIO at {self.endpoint} presents a certificate that {self.ca_bundle} "
                                     f"does not verify: {reason}") from e
            time.sleep(0.1)
        return False

    def _make_bucket(self) -> None:
        from gearfarm.s3.store import ArtifactStore

        ArtifactStore(self.s3_config(), retry_for=30).ensure_bucket()

    def add_role_users(self, roles: dict[str, S3Keys], targets: dict[str, tuple[str, ...]] | None = None) -> None:
        """Give each worker role its own MinIO user (make_role_users). Accounts live in
        MinIO's data, so a restart with the same keys and policies makes none."""
        marker = self.state_dir / "role-users.json"
        wanted = {role: [k.access_key, hashlib.sha256(k.secret_key.encode()).hexdigest(),
                         role_policy(self.bucket, role, (targets or {}).get(role) or ALL_TARGETS)]
                  for role, k in roles.items()}
        try:
            if json.loads(marker.read_text()) == wanted:
                return
        except (OSError, ValueError):
            pass
        make_role_users(self.s3_config(), roles, targets)
        marker.write_text(json.dumps(wanted))

    def stop(self) -> None:
        if self.proc is not None:
            process.stop(self.proc)
            self.proc = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def answering_endpoint(s3: S3Config, timeout: float = 5.0) -> str:
    """The first of ``s3``'s endpoints whose MinIO answers its liveness probe; MinioError naming
    every endpoint tried when none does. Any node of a distributed MinIO serves its admin API."""
    ctx = ssl.create_default_context(cafile=s3.ca_bundle) if s3.ca_bundle else None
    errors = []
    for endpoint in s3.endpoint_list():
        try:
            with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=timeout, context=ctx) as r:
                if r.status == 200:
                    return endpoint
                errors.append(f"{endpoint} (HTTP {r.status})")
        except OSError as e:
            errors.append(f"{endpoint} ({getattr(e, 'reason', e)})")
    raise MinioError(f"no MinIO endpoint answers: tried {', '.join(errors)}")


def role_policy_name(bucket: str, role: str, targets: tuple[str, ...] = ALL_TARGETS) -> str:
    """The name of ``role``'s policy on ``bucket`` for ``targets`` in MinIO (policies are global
    to a MinIO, and one MinIO may hold several farms' buckets and several hosts' target sets)."""
    if tuple(targets) == ALL_TARGETS:
        return f"gearfarm-{bucket}-{role}"
    return f"gearfarm-{bucket}-{role}-{hashlib.sha256(','.join(sorted(targets)).encode()).hexdigest()[:10]}"


def make_role_users(admin: S3Config, roles: dict[str, S3Keys],
                    targets: dict[str, tuple[str, ...]] | None = None) -> None:
    """Make each role's MinIO user on the MinIO ``admin`` reaches (with an admin's keys), at the
    first of its endpoints that answers: a user with these keys whose only policy is the role's
    for the targets ``targets`` gives it (all when it names none; gearfarm.s3.keys.role_policy,
    stored as role_policy_name), a few ``mc`` calls per role, the roles in parallel. A user that
    exists is made again with these keys and this policy.

    No key is ever on mc's command line, where any local user reads it (/proc/PID/cmdline):
    the admin's keys go in mc's environment (MC_HOST_<alias>) and each role's secret on mc's
    standard input. That is why these are regular users and not service accounts of the
    admin, as they were: `mc admin user svcacct add` takes a chosen secret only as
    --secret-key (mc's source: admin-user-svcacct-add.go, no environment variable, no file),
    while `mc admin user add ALIAS ACCESS` reads the secret from a stdin that is not a
    terminal (admin-user-add.go, fetchUserKeys). Letting mc make up the secret instead would
    change what callers rely on: the embedded farm writes the keys into its config while the
    users are being made, and a lab's keys are chosen before its MinIO runs. (Users also take
    access keys over 20 characters, which service accounts refuse.)"""
    mc = find_binary("mc")
    endpoint = answering_endpoint(admin) if admin.endpoints else admin.endpoint
    scheme, rest = endpoint.split("://", 1)
    for role, keys in roles.items():
        if "\n" in keys.secret_key or "\r" in keys.secret_key:
            raise MinioError(f"the {role} role's secret key holds a line break; mc reads it as one line: choose "
                             "another key")
    with tempfile.TemporaryDirectory(prefix="gearfarm-mc-") as tmp:
        env = dict(os.environ, MC_HOST_farm=f"{scheme}://{quote(admin.access_key, safe='')}:"
                                            f"{quote(admin.secret_key, safe='')}@{rest}")
        if admin.ca_bundle:
            env["SSL_CERT_FILE"] = admin.ca_bundle

        def make(role: str, keys: S3Keys) -> None:
            common = ["--config-dir", str(Path(tmp) / f"mc-{role}"), "--json"]

            def mc_call(*args: str, secret: str | None = None) -> tuple[bool, dict[str, object], str]:
                p = subprocess.run([mc, *args, *common], env=env, capture_output=True, text=True, timeout=60,
                                   input=f"{secret}\n" if secret is not None else None,
                                   stdin=None if secret is not None else subprocess.DEVNULL)
                out = (p.stdout + p.stderr).replace(keys.secret_key, "<secret>").strip()
                try:
                    answer = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
                except ValueError:
                    answer = {}
                return p.returncode == 0, answer if isinstance(answer, dict) else {}, out

            def must(ok_answer_out: tuple[bool, dict[str, object], str], doing: str) -> dict[str, object]:
                ok, answer, out = ok_answer_out
                if not ok:
                    raise MinioError(f"cannot make the {role} role's MinIO user {keys.access_key} at {endpoint} "
                                     f"({doing}): {out[-500:]}")
                return answer

            served = (targets or {}).get(role) or ALL_TARGETS
            name = role_policy_name(admin.bucket, role, served)
            policy = Path(tmp) / f"{role}.json"
            policy.write_text(json.dumps(role_policy(admin.bucket, role, served)))
            must(mc_call("admin", "policy", "create", "farm", name, str(policy)), f"policy {name}")
            made = mc_call("admin", "user", "add", "farm", keys.access_key, secret=keys.secret_key)
            if not made[0]:
                # Made before as a service account (the farm's earlier way): a user cannot take
                # its access key until it is gone.
                mc_call("admin", "user", "svcacct", "rm", "farm", keys.access_key)
                made = mc_call("admin", "user", "add", "farm", keys.access_key, secret=keys.secret_key)
            must(made, "user")
            info = must(mc_call("admin", "user", "info", "farm", keys.access_key), "user info")
            attached = [p for p in str(info.get("policyName") or "").split(",") if p]
            if name not in attached:
                must(mc_call("admin", "policy", "attach", "farm", name, "--user", keys.access_key), "attach")
            others = [p for p in attached if p != name]
            if others:  # a user made again keeps only this role's policy
                must(mc_call("admin", "policy", "detach", "farm", *others, "--user", keys.access_key), "detach")

        with ThreadPoolExecutor(max_workers=4) as pool:
            for f in [pool.submit(make, role, keys) for role, keys in roles.items()]:
                f.result()
