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
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from gearfarm.hosts import process
from gearfarm.hosts.net import free_port
from gearfarm.s3.keys import ALL_TARGETS, role_policy
from gearfarm.s3.minio import MinioError, find_binary, make_role_users
from gearfarm.s3.settings import S3Config, S3Keys


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
