"""A lab host under a real systemd, for tests/farm/test_systemd.py: systemd is not PID 1 on the
machines the tests run on, so the host is a podman container whose PID 1 is systemd, made from
the lab's worker image (make images) with systemd, gearmand and stunnel added, and this checkout
mounted at /src in place of the image's copy of the package.

The test installs the units as docs/lab.md says (its install steps run in the container), gives
the host a config, keys and certificates (`python -m tests.farm.unitlab setup`, run inside: it
imports only the checkout's own package, which the image has), starts the units and runs a
nightly of a small project against them.

Nothing here imports pytest: the same module runs on the test's side and inside the container."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

BASE_IMAGE = "localhost/gearfarm-worker"
IMAGE = "localhost/gearfarm-systemd-test"
ETC = Path("/etc/gearfarm")
STATE = Path("/var/lib/gearfarm")
PROJECT_REPO = Path("/srv/git/hello")
HOST = "systemd-host"
MINIO_PORT = 9000
MINIO_KEYS = ("gearfarm-root", "systemd-test-secret")

# The image: the worker image's Debian with systemd as PID 1, the job server's packages, git for
# the nightly, and no gearfarm user (docs/lab.md's install steps make it). The gearfarm package
# is imported from the checkout at /src (the finder below), so the units run this tree's code
# with the image's libraries.
DOCKERFILE = f"""FROM {BASE_IMAGE}
USER root
RUN apt-get update && \\
    apt-get install -y --no-install-recommends systemd systemd-sysv gearman-job-server stunnel4 sqlite3 git && \\
    rm -rf /var/lib/apt/lists/* && \\
    systemctl mask gearman-job-server.service stunnel4.service && \\
    userdel gearfarm && rm -rf /var/lib/gearfarm
COPY checkout_finder.py gearfarm-checkout.pth /opt/gearfarm/.venv/lib/python3.11/site-packages/
WORKDIR /
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT []
CMD ["/lib/systemd/systemd"]
"""

# pyproject.toml's package-dir, for the checkout at /src: gearfarm.s3 and gearfarm.workers live
# in top-level folders.
FINDER = '''"""The checkout at /src as the gearfarm package (tests/farm/unitlab.py's image)."""
import importlib.abc
import importlib.util
import sys

MAPPING = {"gearfarm": "/src/gearfarm", "gearfarm.s3": "/src/s3", "gearfarm.workers": "/src/workers"}


class CheckoutFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in MAPPING:
            return None
        return importlib.util.spec_from_file_location(name, MAPPING[name] + "/__init__.py",
                                                      submodule_search_locations=[MAPPING[name]])


sys.meta_path.insert(0, CheckoutFinder())
'''

# The project the nightly builds: one C program per target, run by its suite on the test side;
# the linux-i686 one runs natively (the x86 system calls), the linux-aarch64 one under qemu.
HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from the farm"); return 0; }\n'
CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "mkdir -p out && {cc} -static -O1 -o out/hello hello.c"]
outputs = ["out/hello"]
timeout = 300

[targets.linux-x86_64]
tools = ["gcc"]
vars = { cc = "gcc", static = "1" }
suites = ["hello"]

[targets.linux-i686]
tools = ["i686-linux-gnu-gcc"]
vars = { cc = "i686-linux-gnu-gcc", static = "1" }
suites = ["hello"]

[targets.linux-aarch64]
tools = ["aarch64-linux-gnu-gcc"]
vars = { cc = "aarch64-linux-gnu-gcc", static = "1" }
runner = ["qemu-aarch64"]
suites = ["hello"]

[suites.hello]
argv = ["{root}/out/hello"]
format = "exit-code"
timeout = 120
"""
TARGETS = ("linux-x86_64", "linux-i686", "linux-aarch64")

MINIO_UNIT = f"""[Unit]
Description=S3 for the systemd test (MinIO on loopback)

[Service]
Environment=MINIO_ROOT_USER={MINIO_KEYS[0]} MINIO_ROOT_PASSWORD={MINIO_KEYS[1]}
ExecStart=/usr/local/bin/minio server --quiet --address 127.0.0.1:{MINIO_PORT} /var/lib/test-minio
"""


def build_context(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(DOCKERFILE)
    (directory / "checkout_finder.py").write_text(FINDER)
    (directory / "gearfarm-checkout.pth").write_text("import checkout_finder\n")
    return directory


def make_repo(dest: Path) -> str:
    """The small project's repository (on the test's side); its revision."""
    from tests.farmkit import GIT, commit

    (dest / "jobs").mkdir(parents=True)
    (dest / "hello.c").write_text(HELLO_C)
    (dest / "jobs" / "catalog.toml").write_text(CATALOG)
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=dest, check=True)
    return commit(dest, "hello")


# ------------------------------------------------------------------ inside the container


def _own(path: Path, uid: int, gid: int, file_mode: int, dir_mode: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, gid)
        os.chmod(p, dir_mode if p.is_dir() else file_mode)


def setup(repo: Path) -> None:
    """As root in the container, after docs/lab.md's install steps: the host's certificates, keys,
    config and results database (as a lab admin makes them), S3 (MinIO, its bucket) and the
    project's catalog in it, as a first nightly would leave it for workers started without
    --targets."""
    from gearfarm import config as config_mod
    from gearfarm.config import Config
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB
    from gearfarm.formats import catalog as catalog_mod
    from gearfarm.formats.seal import Signer
    from gearfarm.hosts import tls
    from gearfarm.run import snapshot
    from gearfarm.s3.store import ArtifactStore

    user = pwd.getpwnam("gearfarm")
    # The project's clone on the nightly's host, owned by the user the nightly runs as.
    shutil.copytree(repo, PROJECT_REPO)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    _own(PROJECT_REPO, user.pw_uid, user.pw_gid, 0o644, 0o755)

    # The farm's CA stays off the host's config; stunnel's server certificate, this host's client one.
    ca = tls.create_ca(Path("/root/farm-ca"))
    certs = ETC / "tls"
    certs.mkdir()
    tls.create_server_cert(ca, ["localhost", "127.0.0.1"], certs / "server.crt", certs / "server.key")
    tls.create_client_cert(ca, f"{HOST}.lab", certs / "host.crt", certs / "host.key")
    shutil.copy(ca.cert, certs / "ca.crt")
    shutil.copy(ca.cert.parent / tls.CRL_FILE, certs / tls.CRL_FILE)
    nightly, host = Signer.generate(), Signer.generate()
    config_mod.write_private(ETC / "keys" / "nightly.key", nightly.pem())
    config_mod.write_private(ETC / "keys" / "host.key", host.pem())

    db_url = f"sqlite:///{STATE / 'results.db'}"
    cfg = Config.model_validate({
        "projects": [{"name": "hello", "repo": str(PROJECT_REPO), "targets": list(TARGETS)}],
        "gearman": {"servers": ["127.0.0.1:4731"], "tls_ca": str(certs / "ca.crt"),
                    "tls_cert": str(certs / "host.crt"), "tls_key": str(certs / "host.key")},
        "s3": {"endpoint": f"http://127.0.0.1:{MINIO_PORT}", "access_key": MINIO_KEYS[0],
               "secret_key": MINIO_KEYS[1]},
        "database": {"url": db_url},
        "farm": {"state_dir": str(STATE), "nightly_keys": [nightly.public_text],
                 "signing_key": str(ETC / "keys" / "nightly.key"), "host_key": str(ETC / "keys" / "host.key"),
                 "host_name": HOST, "no_worker_wait": 120, "run_deadline": 900},
        "bisect": {"auto": False},
        "web": {"listen": "127.0.0.1:8631"},
    })
    config_mod.dump(cfg, ETC / "farm.toml")
    cfg = config_mod.load(ETC / "farm.toml")
    db = ResultsDB(db_url)
    Registry(db).add(HOST, host.public_text, ["build", "test"], ["*"])
    db.engine.dispose()

    # S3: MinIO under systemd too, its bucket, and the catalog a first nightly would publish.
    Path("/etc/systemd/system/test-minio.service").write_text(MINIO_UNIT)
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "start", "test-minio.service"], check=True)
    store = ArtifactStore(cfg.s3, retry_for=60)
    store.ensure_bucket()
    text = (PROJECT_REPO / "jobs" / "catalog.toml").read_text()
    catalog_mod.parse(text, "hello@" + rev[:12])
    sha, _ = snapshot.publish_catalog(store, text)
    snapshot.publish_latest(store, "hello", rev, sha)

    # Owners and modes as docs/lab.md says: the config root:gearfarm 0640, the state the user's.
    _own(ETC / "tls", 0, user.pw_gid, 0o640, 0o750)
    _own(ETC / "keys", 0, user.pw_gid, 0o640, 0o750)
    os.chown(ETC / "farm.toml", 0, user.pw_gid)
    os.chmod(ETC / "farm.toml", 0o640)
    for p in [STATE, *STATE.rglob("*")]:
        os.chown(p, user.pw_uid, user.pw_gid)


def main(argv: list[str]) -> int:
    if argv[:1] == ["setup"] and len(argv) == 2:
        t0 = time.monotonic()
        setup(Path(argv[1]))
        print(f"setup: {time.monotonic() - t0:.1f}s")
        return 0
    print("usage: python -m tests.farm.unitlab setup REPO", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
