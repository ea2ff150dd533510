"""A fresh Debian 12 machine, measured: the project's own debootstrap image (docker.io/library/
debian:bookworm, made by `make images-base`), with nothing on it, nothing mounted from this machine
but a clean clone of the checkout's HEAD (and the network's egress CA, see below), no Go and no
cache.

  full    the README's commands: `apt-get install git make`, `make setup`, `./nightly.bash`;
          prints the wall time of each and the nightly's exit status.
  worker  `make setup-worker TARGETS=linux-x86_64` in a second clean container; prints its wall
          time and the Debian packages it installed (and asserts podman, chromium and PostgreSQL
          are not among them); then that container's worker serves a nightly: an embedded farm on
          this host whose own workers serve only linux-aarch64, so every linux-x86_64 job must go
          to the container's worker (the jobs' worker names say where they ran).

Usage: .venv/bin/python bench/fresh_machine.py full|worker   (minutes: full ~30, worker ~10)

The network here reaches the registries through an egress proxy with its own CA: every host on
it, fresh or not, trusts that CA (/usr/local/share/ca-certificates) and pip is pointed at the
system bundle (PIP_CERT), as on this machine. That is the network's, not a prerequisite of the
project's, and it is all that is lent.
"""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "docker.io/library/debian:bookworm"
PODMAN = ["podman"]
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "containers.conf")}
EGRESS_CA = Path("/usr/local/share/ca-certificates")
# The embedded farm's workers confine jobs with bubblewrap: the same grants as the lab's worker image.
CONFINE = ["--cap-add", "SYS_ADMIN", "--security-opt", "systempaths=unconfined"]
NEVER_ON_A_WORKER = ("podman", "chromium", "postgresql")


def _clone(into: Path) -> Path:
    dest = into / "gearfarm"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dest)], check=True)
    return dest


def _run_args(checkout: Path, name: str) -> list[str]:
    args = [*PODMAN, "run", "--rm", "--name", name, "--network", "host", *CONFINE,
            "-v", f"{checkout}:/opt/gearfarm", "-w", "/opt/gearfarm", "-e", "CI=true",
            "-e", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
    if EGRESS_CA.is_dir():
        args += ["-v", f"{EGRESS_CA}:{EGRESS_CA}:ro"]
    return args


def _timed(label: str, command: str) -> str:
    """A shell fragment that runs ``command`` and prints `TIME label seconds rc`."""
    return (f"s=$(date +%s); ( {command} ); rc=$?; echo \"TIME {label} $(( $(date +%s) - s )) $rc\"; "
            f"[ $rc = 0 ] || exit $rc")


PREREQ = "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q git make >/dev/null"
PACKAGES = "dpkg-query -W -f='${Package}\\n' | sort > /opt/gearfarm/.packages-$1"


def full() -> int:
    with tempfile.TemporaryDirectory(prefix="gearfarm-fresh-") as tmp:
        checkout = _clone(Path(tmp))
        script = "; ".join([
            "set -o pipefail", PACKAGES.replace("$1", "before"), _timed("prerequisites", PREREQ),
            _timed("make-setup", "make setup 2>&1 | tail -40"),
            _timed("nightly", "./nightly.bash 2>&1 | tail -60"),
            PACKAGES.replace("$1", "after")])
        started = time.monotonic()
        proc = subprocess.run([*_run_args(checkout, "gearfarm-fresh-full"), IMAGE, "bash", "-c", script],
                              env=ENV, capture_output=True, text=True)
        print(proc.stdout[-12000:])
        print(_noise_free(proc.stderr)[-4000:], file=sys.stderr)
        added = _added(checkout)
        print(f"packages installed: {len(added)}; podman/chromium/postgresql among them: "
              f"{[p for p in added if p.startswith(NEVER_ON_A_WORKER)]}")
        print(f"whole run: {time.monotonic() - started:.0f} s, exit {proc.returncode}")
        return proc.returncode


def worker() -> int:
    sys.path.insert(0, str(ROOT))
    from gearfarm.formats import catalog as catalog_mod
    from gearfarm.gearman import admin
    from gearfarm.run.farm import EmbeddedFarm
    from tests.farmkit import gearfarm, make_repo, wait_for

    with tempfile.TemporaryDirectory(prefix="gearfarm-fresh-") as tmp:
        base = Path(tmp)
        checkout = _clone(base)
        repo = make_repo(base / "repo")
        farm = EmbeddedFarm(base / "state", repo)
        cat = catalog_mod.load_file(repo / "jobs" / "catalog.toml")
        name = "gearfarm-fresh-worker"
        started = time.monotonic()
        try:
            cfg = farm.start(cat, ["linux-aarch64"])
            host, port = cfg.gearman.addresses()[0]
            # The worker host as a lab admits one (docs/lab.md, "Hosts"): its own key, registered
            # for what it serves, and the farm's config naming that key and host.
            key = base / "state" / "keys" / "fresh-worker.key"
            public = gearfarm("keys", "new", "--out", str(key)).stdout.strip().splitlines()[-1]
            added = gearfarm("keys", "add", "fresh-worker", public, "--role", "build,test", "--target", "linux-x86_64",
                             "--config", str(farm.config_path))
            assert added.returncode == 0, added.stdout + added.stderr
            worker_cfg = base / "state" / "fresh-worker.toml"
            text = farm.config_path.read_text()
            text = re.sub(r'(?m)^host_name = .*\n', '', text)
            text = re.sub(r'(?m)^host_key = .*$', f'host_key = "{key}"\nhost_name = "fresh-worker"', text)
            assert 'host_name = "fresh-worker"' in text and str(key) in text, text
            worker_cfg.write_text(text)
            worker_cfg.chmod(0o600)  # it names the keys: the worker refuses a config others can read
            # One container: the role's setup, its package list, then its worker serves.
            script = "; ".join([
                "set -o pipefail", PACKAGES.replace("$1", "before"), _timed("prerequisites", PREREQ),
                _timed("make-setup-worker", "make setup-worker TARGETS=linux-x86_64 2>&1 | tail -40"),
                PACKAGES.replace("$1", "after"),
                f"exec .venv/bin/gearfarm worker --config {shlex.quote(str(worker_cfg))} "
                "--role build,test --targets linux-x86_64"])
            args = [a for a in _run_args(checkout, name) if a != "--rm"]
            subprocess.run([*args, "-d", "-v", f"{base / 'state'}:{base / 'state'}", "--hostname", "fresh-worker",
                            IMAGE, "bash", "-c", script], env=ENV, check=True, capture_output=True)

            def registered() -> bool:
                if subprocess.run([*PODMAN, "container", "exists", name], env=ENV).returncode != 0:
                    raise RuntimeError("the worker container stopped")
                return any("build:linux-x86_64" in w.functions for w in admin.workers(host, port))
            wait_for("the container's worker to register", registered, timeout=1800)
            logs = subprocess.run([*PODMAN, "logs", name], env=ENV, capture_output=True, text=True).stdout
            print("\n".join(line for line in logs.splitlines() if line.startswith("TIME")))
            added_pkgs = _added(checkout)
            print(f"worker role installed {len(added_pkgs)} Debian packages: {' '.join(added_pkgs)}")
            forbidden = [p for p in added_pkgs if p.startswith(NEVER_ON_A_WORKER)]
            print(f"podman/chromium/postgresql among them: {forbidden}")
            nightly = gearfarm("nightly", "--config", str(farm.config_path), "--targets", "linux-x86_64",
                               "--suites", "unit", "--benchmarks", "none", "--run-id", "fresh1", timeout=1200)
            print(nightly.stdout[-3000:], nightly.stderr[-2000:])
            with sqlite3.connect(base / "state" / "results.db") as db:
                rows = db.execute("SELECT job_id, status, worker FROM jobs ORDER BY job_id").fetchall()
            for row in rows:
                print("job", *row)
            print(f"nightly exit {nightly.returncode}; whole run {time.monotonic() - started:.0f} s")
            served = bool(rows) and all(status == "passed" and "fresh-worker" in (w or "") for _, status, w in rows)
            print("the container's worker served every job:", served)
            return 0 if served and nightly.returncode == 0 and not forbidden else 1
        finally:
            logs = subprocess.run([*PODMAN, "logs", name], env=ENV, capture_output=True, text=True)
            print("worker container log (tail):", _noise_free(logs.stdout + logs.stderr)[-3000:])
            subprocess.run([*PODMAN, "rm", "-f", name], env=ENV, capture_output=True)
            farm.stop()


def _added(checkout: Path) -> list[str]:
    before = set((checkout / ".packages-before").read_text().split()) if (checkout / ".packages-before").exists() \
        else set()
    after = (checkout / ".packages-after").read_text().split() if (checkout / ".packages-after").exists() else []
    return [p for p in after if p not in before]


def _noise_free(text: str) -> str:
    # podman without systemd logs an error per healthcheck timer it cannot remove: not ours.
    return "\n".join(line for line in text.splitlines() if not re.search(r"level=error msg=\"Removing timer", line))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("full", "worker"):
        sys.exit(__doc__)
    sys.exit(full() if sys.argv[1] == "full" else worker())
