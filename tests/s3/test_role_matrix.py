"""Every worker role against every kind of key of the S3 layout (issue #76, case 8), on a real
MinIO with the farm's role users made as the code makes them (MinioServer.add_role_users, as the
embedded farm does, and make_role_users for one target's hosts, as `gearfarm store roles
--targets` does): each role writes only its own kind of key of its own targets, at the place the
layout gives it, and nothing through a '*' that stands for several components. A failure prints
the whole matrix: W written, . refused, and !W or !. where that is not what was expected.

Which run a key is of no static policy can tell: a test host writes its target's test files of
any run (the rows "another project's run"), and the sha256 each record gives its files is what
makes such a write harmless (tests/farm/test_log_binding.py; docs/security.md, "Files in S3")."""

from __future__ import annotations

import json
from pathlib import Path

from gearfarm.hosts.minio_server import MinioServer
from gearfarm.s3 import keys
from gearfarm.s3.minio import make_role_users
from gearfarm.s3.settings import S3Keys
from gearfarm.s3.store import ArtifactStore, StoreError

T, OTHER = "linux-x86_64", "linux-aarch64"
RUN, OTHER_RUN = "20261207-engine-a1b2", "20261101-billing-c3d4"
REV, TC, SHA = "a" * 40, "0123456789abcdef", "e" * 64
B, TE, P = "build", "test", "perf"  # the roles whose users may write a row's key (any target)

# (what the key is, the key, the roles that may write it when serving T; a row whose target is
# OTHER is refused to the users made for T alone).
ROWS: list[tuple[str, str, set[str]]] = [
    ("source tree", keys.source(REV), set()),
    ("source manifest", keys.source_manifest(REV), set()),
    ("catalog", keys.catalog(SHA), set()),
    ("project's latest catalog", keys.project_latest("engine"), set()),
    ("artifact", keys.artifact(REV, T, TC), {B}),
    ("artifact manifest", keys.manifest(REV, T, TC), {B}),
    ("artifact provenance", keys.provenance(REV, T, TC), {B}),
    ("other target's artifact", keys.artifact(REV, OTHER, TC), {B}),
    ("another name beside an artifact", f"{keys.artifact_prefix(REV, T, TC)}/extra.bin", set()),
    ("artifact with '/' in the rev", f"artifacts/{REV}/x/{T}/{TC}/artifact.tar.zst", set()),
    ("artifact with '/' in the toolchain", f"artifacts/{REV}/{T}/{TC}/x/artifact.tar.zst", set()),
    ("artifact moved aside", keys.quarantine(keys.artifact(REV, T, TC), 0), {B}),
    ("another name moved aside", keys.quarantine(f"{keys.artifact_prefix(REV, T, TC)}/extra.bin", 0), set()),
    ("artifact moved aside, '/' in its time", "quarantine/x/y/" + keys.artifact(REV, T, TC), set()),
    ("build log", keys.job_file(RUN, T, "build", "log.txt", SHA), {B}),
    ("build record", keys.result(RUN, T, "build", 1, SHA), {B}),
    ("build record under a test's name", "runs/R/" + T + "/build/results/" + T + "/test-x.json", set()),
    ("another file in the build's prefix", keys.job_file(RUN, T, "build", "other.txt", SHA), set()),
    ("test log", keys.job_file(RUN, T, "test-unit", "log.txt", SHA), {TE}),
    ("test JUnit", keys.job_file(RUN, T, "test-unit", "junit.xml", SHA), {TE}),
    ("test record", keys.result(RUN, T, "test-unit", 2, SHA), {TE}),
    ("test cases", keys.cases(RUN, T, "test-unit", SHA), {TE}),
    ("test log where older records name it", keys.job_file(RUN, T, "test-unit", "log.txt"), set()),
    ("another project's run's test log", keys.job_file(OTHER_RUN, T, "test-unit", "log.txt", SHA), {TE}),
    ("other target's test log", keys.job_file(RUN, OTHER, "test-unit", "log.txt", SHA), {TE}),
    ("another file in a test's prefix", keys.job_file(RUN, T, "test-unit", "metrics.json", SHA), set()),
    ("test log with '/' in the step", f"runs/{RUN}/{T}/test-unit/x/files/{SHA}/log.txt", set()),
    ("test log with '/' in the run", f"runs/{RUN}/x/{T}/test-unit/files/{SHA}/log.txt", set()),
    ("test log with '/' in its digest", f"runs/{RUN}/{T}/test-unit/files/{SHA}/x/log.txt", set()),
    ("test log under a log", f"runs/{RUN}/{T}/test-unit/files/{SHA}/log.txt/log.txt", set()),
    ("test record with '/' in its name", f"runs/{RUN}/{T}/test-unit/results/a/b.json", set()),
    ("test log with an empty run", f"runs//{T}/test-unit/files/{SHA}/log.txt", set()),
    ("perf log", keys.job_file(RUN, T, "perf-oltp", "log.txt", SHA), {P}),
    ("perf record", keys.result(RUN, T, "perf-oltp", 1, SHA), {P}),
    ("perf JUnit", keys.job_file(RUN, T, "perf-oltp", "junit.xml", SHA), set()),
    ("run report", keys.report(RUN, "html"), set()),
    ("run cancel marker", keys.cancel(RUN), set()),
    ("job cancel marker", keys.cancel(RUN, T, "test-unit"), set()),
]


def _writes(store: ArtifactStore, key: str) -> bool:
    try:
        store.put_bytes(key, b"probe")
        return True
    except StoreError as e:
        # MinIO itself refuses a key with an empty component, whoever asks.
        assert "AccessDenied" in str(e) or "XMinioInvalidObjectName" in str(e), f"{key}: {e}"
        return False


def test_every_role_writes_only_its_own_kind_of_key_of_its_own_targets(tmp_path: Path) -> None:
    roles = {r: S3Keys(access_key=f"m-{r}", secret_key=f"{r}-secret-0123456789") for r in keys.ROLE_WRITES}
    scoped = {r: S3Keys(access_key=f"m-{r}-t", secret_key=f"{r}-t-secret-0123456789") for r in (B, TE, P)}
    with MinioServer(tmp_path / "minio") as minio:
        minio.add_role_users(roles)
        make_role_users(minio.s3_config(), scoped, {r: (T,) for r in scoped})
        base = minio.s3_config()
        users = {r: base.model_copy(update={"access_key": k.access_key, "secret_key": k.secret_key})
                 for r, k in roles.items()}
        users |= {f"{r}@{T}": base.model_copy(update={"access_key": k.access_key, "secret_key": k.secret_key})
                  for r, k in scoped.items()}
        stores = {u: ArtifactStore(c, retry_for=0, attempts=1) for u, c in users.items()}
        got = {(what, u): _writes(s, key) for what, key, _ in ROWS for u, s in stores.items()}

    def expected(what: str, key: str, allowed: set[str], user: str) -> bool:
        role, _, only = user.partition("@")
        return role in allowed and not (only and f"/{OTHER}/" in key)

    want = {(what, u): expected(what, key, allowed, u) for what, key, allowed in ROWS for u in stores}
    width = max(len(w) for w, _, _ in ROWS)
    lines = [" " * width + "  " + "  ".join(f"{u:>{len(u)}}" for u in stores)]
    for what, _, _ in ROWS:
        cells = []
        for u in stores:
            mark = "W" if got[what, u] else "."
            cells.append(f"{('' if got[what, u] == want[what, u] else '!') + mark:>{len(u)}}")
        lines.append(f"{what:<{width}}  " + "  ".join(cells))
    wrong = sorted(k for k in want if got[k] != want[k])
    assert not wrong, (f"{len(wrong)} role x key cells are not what the layout allows "
                       "(W written, . refused, ! unexpected):\n" + "\n".join(lines))


def test_a_role_policy_for_a_host_of_forty_targets_fits_what_minio_takes() -> None:
    """MinIO refuses a policy over 20 KiB (maxBucketPolicySize, also for IAM policies): the denies
    are made once for every target, so a host's policy grows only by its allowed patterns."""
    many = tuple(f"linux-t{i:02d}" for i in range(40))
    for role in ("build", "test", "perf"):
        size = len(json.dumps(keys.role_policy("gearfarm-bucket", role, many)))
        assert size < 20 * 1024, f"the {role} role's policy for 40 targets is {size} bytes"
