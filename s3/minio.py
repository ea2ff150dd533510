"""MinIO's own tools as the farm uses them: finding the ``minio`` and ``mc`` binaries that
s3/install-minio.bash built, the endpoint of a storage that answers, and each worker role's
MinIO user with its policy (made through ``mc``). The local server itself is a daemon of this
host: gearfarm.hosts.minio_server."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

from gearfarm.s3.keys import ALL_TARGETS, role_policy
from gearfarm.s3.settings import S3Config, S3Keys


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
