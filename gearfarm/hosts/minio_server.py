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
import urllib.request
from pathlib import Path
from typing import Self

from gearfarm.hosts.daemon import Daemon, Failure
from gearfarm.s3.keys import ALL_TARGETS, role_policy
from gearfarm.s3.minio import MinioError, find_binary, make_role_users
from gearfarm.s3.settings import S3Config, S3Keys


class MinioServer(Daemon):
    name = "MinIO"
    error = MinioError
    # Fewer launches than the others: every failure is retried (see lost_race), and a hung one
    # takes the whole start timeout.
    attempts = 3
    poll_interval = 0.1

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 bucket: str = "gearfarm", access_key: str = "gearfarm", secret_key: str | None = None,
                 certs_dir: Path | None = None, ca_bundle: Path | None = None) -> None:
        if certs_dir is not None and ca_bundle is None:
            # Probing without verification would hide a certificate clients then reject.
            raise ValueError("MinioServer with certs_dir needs ca_bundle (the CA that issued public.crt)")
        super().__init__(Path(state_dir), Path(state_dir) / "minio.log", host, port, start_timeout=60.0)
        self.certs_dir = Path(certs_dir).resolve() if certs_dir is not None else None
        self.ca_bundle = Path(ca_bundle).resolve() if ca_bundle is not None else None
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.data_dir = self.state_dir / "minio-data"
        self._binary = ""
        self._probe_context: ssl.SSLContext | None = None

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.certs_dir is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def s3_config(self) -> S3Config:
        return S3Config(endpoint=self.endpoint, bucket=self.bucket, access_key=self.access_key,
                        secret_key=self.secret_key,
                        ca_bundle=str(self.ca_bundle) if self.ca_bundle is not None else None)

    def start(self, timeout: float = 60.0) -> Self:
        """Start MinIO, wait until it is ready (``timeout`` seconds a launch) and make the bucket."""
        if self.running:
            return self
        self.start_timeout = timeout
        super().start()
        self._make_bucket()
        return self

    def prepare(self) -> None:
        self._binary = find_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.certs_dir is not None:
            for name in ("public.crt", "private.key"):
                if not (self.certs_dir / name).is_file():
                    raise MinioError(f"MinIO certs dir {self.certs_dir} has no {name}")
        self._probe_context = (ssl.create_default_context(cafile=str(self.ca_bundle))
                               if self.ca_bundle is not None else None)

    def environment(self) -> dict[str, str]:
        return dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                    MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CALLHOME_ENABLE="off")

    def command(self, port: int) -> list[str]:
        argv = [self._binary, "server", str(self.data_dir), "--address", f"{self.host}:{port}", "--quiet"]
        if self.certs_dir is not None:
            # Without it MinIO reads ~/.minio/certs, which must not decide the scheme.
            argv += ["--certs-dir", str(self.certs_dir)]
        return argv

    def ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1,
                                        context=self._probe_context) as r:
                return r.status == 200
        except OSError as e:
            reason = getattr(e, "reason", e)  # urllib wraps the ssl error in URLError
            if isinstance(reason, ssl.SSLCertVerificationError):
                # Our own MinIO answering with a certificate the CA does not vouch for is
                # a configuration error; waiting out the timeout would only hide it.
                raise MinioError(f"MinIO at {self.endpoint} presents a certificate that {self.ca_bundle} "
                                 f"does not verify: {reason}") from e
            return False

    def lost_race(self, failure: Failure) -> bool:
        # MinIO exits on a taken port ("Specified port is already in use", measured) with the
        # code 1 of any fatal error, so an exit alone does not tell a race, and a launch that
        # hung is worth another try on a fresh port rather than failing the farm: any failure
        # counts, as it always has (hence only three launches).
        return True

    def start_error(self, failures: list[Failure]) -> str:
        return f"MinIO did not start on {self.host}; log {self.log_path}:\n{self.log_tail()}"

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
