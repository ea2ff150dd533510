"""A local MinIO server for the embedded farm and the integration tests: loopback only, a free
port, data under a state directory, and a bucket ready before start() returns."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from gearfarm import process
from gearfarm.config import S3Config
from gearfarm.net import free_port


class MinioError(RuntimeError):
    pass


def find_binary() -> str:
    cache = Path(os.environ.get("GEARFARM_CACHE", Path.home() / ".cache" / "gearfarm"))
    for cand in (os.environ.get("GEARFARM_MINIO"), str(cache / "bin" / "minio"), shutil.which("minio")):
        if cand and Path(cand).exists():
            return cand
    raise MinioError("MinIO server binary not found; run 'make setup' (it builds MinIO into "
                     f"{cache}/bin) or set GEARFARM_MINIO")


class MinioServer:
    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 bucket: str = "gearfarm", access_key: str = "gearfarm", secret_key: str | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self.port = port
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir / "minio.log"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def s3_config(self) -> S3Config:
        return S3Config(endpoint=self.endpoint, bucket=self.bucket, access_key=self.access_key,
                        secret_key=self.secret_key)

    def start(self, timeout: float = 60.0) -> MinioServer:
        binary = find_binary()
        data = self.state_dir / "minio-data"
        data.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a free port can be taken between probing and binding
            if self.port is None:
                self.port = free_port(self.host)
            env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                       MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CALLHOME_ENABLE="off")
            argv = [binary, "server", str(data), "--address", f"{self.host}:{self.port}", "--quiet"]
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
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def _make_bucket(self) -> None:
        from s3.store import ArtifactStore

        ArtifactStore(self.s3_config(), retry_for=30).ensure_bucket()

    def stop(self) -> None:
        if self.proc is not None:
            process.stop(self.proc)
            self.proc = None

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
