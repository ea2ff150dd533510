"""No host can sign what it does not do (issue #33), tried as an attacker would, on a real farm
(gearmand, MinIO, the collector, workers, the dashboard), with libgearman's own `gearman` CLI and
a rogue libgearman worker (tests/gearman_holder.c) on the wire and boto3 on S3:

- with every file a test-only host has (its config, its own registered key, the nightly's public
  key, the test role's S3 keys): forged test records for its own target and another, a forged
  build record and a forged payload are rejected or dropped; a forged dashboard cookie does not
  log in;
- a build replaced in S3 with the build role's keys is refused by digest and never runs; the next
  build moves it aside (kept under quarantine/), stores its own, and its night is green and names
  the replaced object;
- a cancel marker written with the test role's keys is refused; one the nightly did not sign, or
  signed for another run, is ignored; the job completes;
- a rogue worker holding a job with WORK_STATUS loses it within the lease time;
- `gearfarm artifact get` checks a build against its signed record and provenance, and
  `gearfarm artifact verify` names the check a flipped byte fails."""

from __future__ import annotations

import email
import email.policy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from gearfarm import config as config_mod
from gearfarm.config import Config, FarmConfig, GearmanConfig, ProjectConfig
from gearfarm.db.registry import Registry
from gearfarm.db.results import ResultsDB
from gearfarm.formats import catalog as catalog_mod
from gearfarm.formats.job import JobId, Source, make_payload, sign, verify
from gearfarm.formats.marker import Marker, sealed
from gearfarm.formats.result import ResultRecord, seal_record
from gearfarm.formats.seal import Signer
from gearfarm.run.farm import EmbeddedFarm
from gearfarm.s3 import artifact, keys
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import ROOT, add_user, carried_files, commit, gearfarm, start_web, wait_for
from tests.projects import _init

T = "linux-x86_64"
MARKER = "REPLACED-BINARY-RAN"
CATALOG = """schema = 2

[build]
argv = ["sh", "-c", "printf '#!/bin/sh\\necho \\"ok 1 - $1\\"\\n' > check.sh && chmod 755 check.sh"]
outputs = ["check.sh"]
timeout = 60

[suites.good]
argv = ["{root}/check.sh", "good"]
format = "tap"
timeout = 60

[suites.broken]
argv = ["sh", "-c", "echo 'not ok 1 - broken'"]
format = "tap"
timeout = 60

[suites.slow]
argv = ["sh", "-c", "sleep 20; echo 'ok 1 - slept'"]
format = "tap"
timeout = 120

[targets.linux-x86_64]
tools = ["sh"]
suites = ["good", "broken", "slow"]
"""


@dataclass
class Farm:
    farm: EmbeddedFarm
    cfg: Config
    db: ResultsDB
    repo: Path
    revs: list[str]
    # The test-only host's config: the one file, with what it names, an attacker who owns that
    # host has. Nothing else of the farm's is read by the attacks.
    rogue: Path

    def starts(self, job: str) -> int:
        """COMMAND START lines of a job in every worker's log: what ran."""
        line = f"COMMAND START job={job} "
        return sum(p.read_text(errors="replace").count(line) for p in (self.farm.state / "logs").glob("*.log"))

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted((self.farm.state / "logs").glob("*.log")))

    def nightly(self, run_id: str, *args: str, rev: int = 0, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return gearfarm("nightly", "--config", str(self.farm.config_path), "--project", "auth", "--rev",
                        self.revs[rev], "--benchmarks", "none", "--run-id", run_id, *args, timeout=timeout)

    def start_nightly(self, run_id: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config",
                                 str(self.farm.config_path), "--project", "auth", "--rev", self.revs[0],
                                 "--benchmarks", "none", "--run-id", run_id, *args],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def gearman(self, *args: str, data: bytes = b"") -> None:
        host, port = self.cfg.gearman.addresses()[0]
        subprocess.run(["gearman", "-h", host, "-p", str(port), *args], input=data, check=True, timeout=30,
                       capture_output=True)


def s3_client(cfg: Config):  # type: ignore[no-untyped-def]
    """boto3 as the attacker holds it: the keys of one config, nothing of the farm's code."""
    return boto3.client("s3", endpoint_url=cfg.s3.endpoint, aws_access_key_id=cfg.s3.access_key,
                        aws_secret_access_key=cfg.s3.secret_key, region_name="us-east-1",
                        config=BotoConfig(signature_version="s3v4", s3={"addressing_style": "path"},
                                          request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required"))


def _enroll_test_only_host(cfg: Config, db: ResultsDB, home: Path) -> Path:
    """A test-only host, set up as a lab sets one up: its own key (registered for test jobs of
    one target), the nightly's public key, gearmand's address and the test role's S3 keys."""
    key = home / "host.key"
    config_mod.write_private(key, Signer.generate().pem())
    Registry(db).add("test-only-1", Signer.load(key).public_text, ["test"], [T])
    rogue = Config(gearman=GearmanConfig(servers=cfg.gearman.servers), s3=cfg.s3.for_role("test"),
                   farm=FarmConfig(state_dir=str(home / "state"), nightly_keys=cfg.farm.nightly_keys,
                                   host_key=str(key), host_name="test-only-1"))
    rogue.s3.roles = {"test": cfg.s3.roles["test"]}
    config_mod.dump(rogue, home / "farm.toml")
    return home / "farm.toml"


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    base = tmp_path_factory.mktemp("authority")
    repo = base / "auth"
    revs = [_init(repo, {"jobs/catalog.toml": CATALOG})]
    for n in (2, 3):
        (repo / "notes.txt").write_text(f"change {n}\n")
        revs.append(commit(repo, f"change {n}"))
    (base / "none").mkdir()
    farm = EmbeddedFarm(base / "state", base / "none", projects=[ProjectConfig(name="auth", repo=str(repo))], slots=2)
    cfg = farm.start(catalog_mod.parse(CATALOG, "auth"), [T])
    # Fewer nightlies' time spent waiting for the rogue holder; the embedded farm uses the default.
    cfg = config_mod.load(farm.config_path)
    cfg.farm.lease_timeout = 20.0
    cfg.bisect.auto = False
    config_mod.dump(cfg, farm.config_path)
    db = ResultsDB(cfg.database.url)
    (base / "test-only-host").mkdir()
    rogue = _enroll_test_only_host(cfg, db, base / "test-only-host")
    try:
        yield Farm(farm, cfg, db, repo, revs, rogue)
    finally:
        farm.stop()


def test_a_test_only_hosts_files_sign_nothing_it_does_not_do(auth: Farm) -> None:
    """While a run is open, the test-only host forges: a `passed` attempt 100 and a `passed`
    attempt 1 of a test that really fails (its own target), a passed test of another target, a
    `failed` build of the running run, and a build payload for a run that does not exist. 0
    applied, 0 executed; the run ends as if they were never sent."""
    rogue = config_mod.load(auth.rogue)
    key = rogue.host_signer()
    nightly = auth.start_nightly("forgery", "--suites", "good,broken,slow")
    try:
        broken = JobId("forgery", T, "test-broken")
        wait_for("the real result of the broken suite", lambda: any(
            d.job_id == str(broken) and d.outcome == "applied" for d in auth.db.deliveries("forgery")), 120)
        assert nightly.poll() is None, "the run ended before the forgeries: the test proves nothing"
        real = auth.db.job(str(broken))
        assert real is not None and real.status == "failed"

        def forged(jid: JobId, status: str, attempt: int, **kw: object) -> ResultRecord:
            return ResultRecord(job_id=str(jid), run_id=jid.run_id, target=jid.target, kind=jid.kind, step=jid.step,
                                name=jid.name, rev=real.rev, status=status, attempt=attempt,  # type: ignore[arg-type]
                                worker="test-only-1-test-1", host={"hostname": rogue.host_name()},
                                started_at=1.0, finished_at=2.0, **kw)  # type: ignore[arg-type]

        records = {
            "its own target, attempt 100": forged(broken, "passed", 100),
            "its own target, the attempt the real host holds, finished first": forged(broken, "passed", 1),
            "another target": forged(JobId("forgery", "linux-aarch64", "test-good"), "passed", 1),
            "the running run's build, failed": forged(JobId("forgery", T, "build"), "failed", 1),
        }
        for i, rec in enumerate(records.values()):
            auth.gearman("-b", "-f", "collect", "-u", f"forged-{i}", data=seal_record(rec, key))
        # A build payload for a run that does not exist, as only the nightly may make one.
        cat = auth.db.catalog_text(auth.db.get_run("forgery").catalog_sha256)  # type: ignore[union-attr]
        assert cat is not None
        src = json.loads(ArtifactStore(auth.cfg.s3).get_bytes(keys.source_manifest(real.rev)))
        payload = make_payload(JobId("forged-run-2", T, "build"),
                               source=Source("auth", real.rev, src["sha256"], catalog_mod.digest(cat)),
                               deadline=time.time() + 3600, suites=["good"])
        auth.gearman("-b", "-f", f"build:{T}", "-u", payload.unique, data=sign(payload, key))

        digests = {r.digest for r in records.values()}
        wait_for("the collector to answer every forged record",
                 lambda: len([d for d in auth.db.deliveries("forgery") if d.digest in digests]) == len(records), 120)
        wait_for("a worker to refuse the forged payload", lambda: "REJECTED job" in auth.logs(), 120)
        out, _ = nightly.communicate(timeout=300)
    finally:
        if nightly.poll() is None:
            nightly.kill()
    outcomes = [(d.outcome, d.reason) for d in auth.db.deliveries("forgery") if d.digest in digests]
    assert [o for o, _ in outcomes] == ["rejected"] * len(records), outcomes
    reasons = " | ".join(r for _, r in outcomes)
    assert "attempt 100 of forgery:linux-x86_64:test-broken was never submitted" in reasons
    assert "attempt 1 of forgery:linux-x86_64:test-broken is leased to host" in reasons
    assert "registered for test on linux-x86_64, not test on linux-aarch64" in reasons
    assert "registered for test on linux-x86_64, not build on linux-x86_64" in reasons
    assert auth.starts("forged-run-2:") == 0
    assert "REJECTED job" in auth.logs() and "not one this verifier trusts" in auth.logs()
    # The run as if nothing had been sent: the broken test failed, everything else passed.
    assert nightly.returncode == 1, out
    final = {r.step: (r.status, r.attempt) for r in auth.db.jobs("forgery")}
    assert final == {"build": ("passed", 1), "test-good": ("passed", 1), "test-broken": ("failed", 1),
                     "test-slow": ("passed", 1)}, final


def test_a_cookie_signed_with_what_a_worker_host_holds_does_not_log_in(auth: Farm, tmp_path: Path) -> None:
    """The dashboard's session key is its own (<state>/web-secret), never a worker host's: a
    cookie signed with every secret of the test-only host, carrying a matching CSRF token, is
    refused, and even one signed with the dashboard's own key logs in no one (sessions live on
    the server)."""
    import urllib.error
    import urllib.request

    from flask import Flask
    from flask.sessions import SecureCookieSessionInterface
    from flask_wtf.csrf import generate_csrf

    from gearfarm.hosts import process

    rogue = config_mod.load(auth.rogue)
    held = [Path(str(rogue.farm.host_key)).read_text(), rogue.farm.nightly_keys[0], rogue.s3.secret_key]
    assert auth.nightly("cookie-run", "--suites", "good").returncode == 0

    def forge(secret: str) -> tuple[str, str]:
        app = Flask("forger")
        app.secret_key = secret
        with app.test_request_context():
            from flask import session

            session["sid"] = "f" * 64
            token = generate_csrf()
            cookie = SecureCookieSessionInterface().get_signing_serializer(app).dumps(dict(session))  # type: ignore[union-attr]
        return cookie, token

    def cancel(cookie: str, token: str) -> int:
        req = urllib.request.Request(f"{url}/run/cookie-run/cancel", data=f"csrf_token={token}".encode(),
                                     headers={"Cookie": f"session={cookie}",
                                              "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    proc, url = start_web(auth.farm.config_path, tmp_path / "web.log")
    try:
        codes = [cancel(*forge(s)) for s in held]
        own = cancel(*forge((auth.farm.state / "web-secret").read_text().strip()))
    finally:
        process.stop(proc, timeout=10)
    # The host's secrets do not even sign a cookie the dashboard reads (the form's CSRF check
    # refuses it); with the dashboard's key, which no worker host has, no session is the cookie's.
    assert codes == [403] * len(held) and own == 403
    assert auth.db.cancellations("cookie-run") == []


def test_the_run_page_links_each_build_with_its_sha256_and_provenance_for_accounts(auth: Farm,
                                                                                  tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from gearfarm.formats import provenance
    from gearfarm.hosts import process

    assert auth.nightly("page-run", "--suites", "good").returncode == 0
    build = auth.db.job(str(JobId("page-run", T, "build")))
    assert build is not None and build.artifact_sha256
    token = add_user(auth.farm.config_path, "reader")

    def get(path: str, bearer: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    proc, url = start_web(auth.farm.config_path, tmp_path / "web.log")
    try:
        code, page = get("/run/page-run")
        anonymous = get(f"/run/page-run/provenance/{T}")[0], get(f"/run/page-run/artifact/{T}/build")[0]
        prov_code, prov = get(f"/run/page-run/provenance/{T}", token)
        art_code, archive = get(f"/run/page-run/artifact/{T}/build", token)
    finally:
        process.stop(proc, timeout=10)
    assert code == 200 and build.artifact_sha256.encode() in page
    assert f"/run/page-run/provenance/{T}".encode() in page and f"/run/page-run/artifact/{T}/build".encode() in page
    assert anonymous == (403, 403)
    assert (prov_code, art_code) == (200, 200)
    stmt, kid = provenance.open_envelope(prov, Registry(auth.db).public_key)
    assert provenance.subject(stmt, provenance.ARCHIVE) == build.artifact_sha256 == hashlib.sha256(archive).hexdigest()
    assert provenance.builder_host(stmt) == auth.cfg.host_name()
    assert provenance.parameters(stmt) == {"project": "auth", "revision": auth.revs[0], "target": T}


def _replace_build(auth: Farm, rev: str, manifest_too: bool) -> tuple[str, str]:
    """With the build role's keys only, put a build of the attacker's at the key of ``rev``'s
    stored build (a plain PutObject: put-if-absent is a client's courtesy); (key, its sha256)."""
    good = auth.db.signed_builds("auth", rev, T)[0]
    assert good.artifact_key is not None
    builder = auth.cfg.model_copy(update={"s3": auth.cfg.s3.for_role("build")})
    s3 = s3_client(builder)
    work = auth.farm.state.parent / f"attack-{rev[:8]}-{int(manifest_too)}"
    (work / "out").mkdir(parents=True)
    (work / "out" / "check.sh").write_text(f"#!/bin/sh\necho 'ok 1 - {MARKER}'\n")
    (work / "out" / "check.sh").chmod(0o755)
    manifest_key = good.artifact_key.replace("artifact.tar.zst", "manifest.json")
    original = json.loads(s3.get_object(Bucket=auth.cfg.s3.bucket, Key=manifest_key)["Body"].read())
    meta = {k: v for k, v in original.items() if k not in ("files", "archive_sha256", "archive_size")}
    packed = artifact.pack(work / "out", ["check.sh"], meta, work / "artifact.tar.zst")
    s3.put_object(Bucket=auth.cfg.s3.bucket, Key=good.artifact_key, Body=(work / "artifact.tar.zst").read_bytes())
    if manifest_too:
        s3.put_object(Bucket=auth.cfg.s3.bucket, Key=manifest_key, Body=artifact.canonical_json(packed))
    return good.artifact_key, packed["archive_sha256"]


def _marker_anywhere(auth: Farm) -> list[str]:
    store = ArtifactStore(auth.cfg.s3)
    found = [k for k in store.list("runs/") if k.endswith((".txt", ".xml")) and MARKER.encode() in store.get_bytes(k)]
    found += [str(p) for p in (auth.farm.state / "runs").rglob("*") if p.is_file() and p.suffix in (".txt", ".xml")
              and MARKER in p.read_text(errors="replace")]
    found += [name for name, data in carried_files(auth.cfg.database.url).items() if MARKER.encode() in data]
    return found


def _moved_aside(auth: Farm, run_id: str, key: str, planted: str, good_sha: str) -> str:
    """The night ``run_id`` after ``key`` was replaced (by an archive of sha256 ``planted``): its
    build did not run the planted archive, moved it aside (kept byte for byte under quarantine/),
    stored the farm's build again, and the night is green, its report and mail naming both
    places; where it is kept."""
    jobs = {r.step: r for r in auth.db.jobs(run_id)}
    assert (jobs["build"].status, jobs["test-good"].status) == ("passed", "passed"), jobs["build"].message
    assert jobs["build"].artifact_sha256 == good_sha and not jobs["build"].reused_artifact
    (alarm,) = jobs["build"].alarms
    aside = alarm.split(f"{key} -> ", 1)[1].split(",")[0].split(";")[0]
    assert aside.startswith("quarantine/") and aside.endswith(key), alarm
    assert "replaced in S3 outside the farm" in alarm and planted in alarm
    assert hashlib.sha256(ArtifactStore(auth.cfg.s3).get_bytes(aside)).hexdigest() == planted  # kept
    report = (auth.farm.state / "runs" / run_id / "report.txt").read_text()
    assert "ALARMS" in report and key in report and aside in report, report
    mail = email.message_from_bytes((auth.farm.state / "runs" / run_id / "report.eml").read_bytes(),
                                    policy=email.policy.default)
    assert "(1 alarm)" in str(mail["Subject"]), mail["Subject"]
    assert aside in mail.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    return aside


def test_a_build_replaced_in_s3_is_moved_aside_and_the_next_night_is_green(auth: Farm, tmp_path: Path) -> None:
    """Issue #76, case 10: a build replaced in S3 with the build role's keys costs one alarm, not
    the target. Before: with the archive replaced, every later night reused the build and its
    tests refused the archive (`test: infra`, "artifact sha256 is X, expected Y"); with archive
    and manifest replaced, every later night ended `build: infra` ("remove it (mc rm), and build
    again")."""
    rev = auth.revs[1]
    first = auth.nightly("replace-1", "--suites", "good", rev=1)
    assert first.returncode == 0, first.stdout + first.stderr
    good = auth.db.job(str(JobId("replace-1", T, "build")))
    assert good is not None and good.artifact_sha256
    # The archive alone: the next build checks the stored archive before it reuses the build
    # (its one download kept in this host's cache, for its tests). This host kept the genuine
    # archive from the first night (gearfarm/hosts/cache.py): a host without it is shown.
    key, planted = _replace_build(auth, rev, manifest_too=False)
    shutil.rmtree(auth.farm.state / "cache" / "artifacts")
    p = auth.nightly("replace-2", "--suites", "good", rev=1)
    assert p.returncode == 0, p.stdout + p.stderr
    _moved_aside(auth, "replace-2", key, planted, good.artifact_sha256)
    # Archive and manifest together: the build does not reuse it, builds, and finds at its key
    # an object no signed build has.
    key, planted = _replace_build(auth, rev, manifest_too=True)
    p = auth.nightly("replace-3", "--suites", "good", rev=1)
    assert p.returncode == 0, p.stdout + p.stderr
    aside = _moved_aside(auth, "replace-3", key, planted, good.artifact_sha256)
    # The dashboard's run page says it too.
    import html
    import urllib.request

    from gearfarm.hosts import process

    proc, url = start_web(auth.farm.config_path, tmp_path / "web.log")
    try:
        with urllib.request.urlopen(f"{url}/run/replace-3", timeout=30) as r:
            page = html.unescape(r.read().decode())
    finally:
        process.stop(proc, timeout=10)
    assert "Alarms: done to the farm from outside" in page and aside in page
    # The next night reuses the build stored in its place, with nothing to say.
    p = auth.nightly("replace-4", "--suites", "good", rev=1)
    assert p.returncode == 0, p.stdout + p.stderr
    jobs = {r.step: r for r in auth.db.jobs("replace-4")}
    assert jobs["build"].reused_artifact and jobs["build"].alarms == [] and jobs["test-good"].status == "passed"
    assert "ALARMS" not in (auth.farm.state / "runs" / "replace-4" / "report.txt").read_text()
    assert _marker_anywhere(auth) == []


def test_a_cancel_marker_the_nightly_did_not_sign_is_ignored(auth: Farm) -> None:
    """The test role cannot write a cancel marker at all; and where a marker does get written
    without the nightly (the farm's own S3 keys stand for a leaked key or a store with looser
    policies), a marker signed by a worker host's key, or a genuine one of another run copied
    here, is ignored, said in the log, and the job completes. A worker looks at the markers
    only when the ledger does not answer its heartbeat (otherwise the answer says whether the
    job was cancelled), so the collector is stopped for a few beats meanwhile."""
    rogue = config_mod.load(auth.rogue)
    s3, farm_s3 = s3_client(rogue), s3_client(auth.cfg)
    nightly = auth.start_nightly("uncancelled", "--suites", "slow")
    try:
        slow = JobId("uncancelled", T, "test-slow")
        wait_for("the slow suite to start", lambda: auth.starts(str(slow)) == 1, 120)
        body = json.dumps({"who": "intruder", "at": time.time()}).encode()
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=rogue.s3.bucket, Key=keys.cancel("uncancelled", T, "test-slow"), Body=body)
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        # Where markers were before (the job's own prefix): no role may write a name the layout
        # does not give (tests/s3/test_role_matrix.py), and one put there with the farm's keys is
        # not read.
        old_place = f"runs/uncancelled/{T}/test-slow/cancel.json"
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=rogue.s3.bucket, Key=old_place, Body=body)
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        farm_s3.put_object(Bucket=rogue.s3.bucket, Key=old_place, Body=body)
        forged = sealed(rogue.host_signer(), Marker("cancel", "uncancelled", T, "test-slow", "intruder", 1.0))
        farm_s3.put_object(Bucket=rogue.s3.bucket, Key=keys.cancel("uncancelled", T, "test-slow"), Body=forged)
        copied = sealed(auth.cfg.nightly_signer(), Marker("cancel", "another-run", who="carol", at=1.0))
        farm_s3.put_object(Bucket=rogue.s3.bucket, Key=keys.cancel("uncancelled"), Body=copied)
        collector = auth.farm.procs["collector"].pid  # type: ignore[attr-defined]
        os.killpg(collector, signal.SIGSTOP)
        try:
            wait_for("a heartbeat's look at the markers", lambda: "IGNORED cancel marker" in auth.logs(), 60)
        finally:
            os.killpg(collector, signal.SIGCONT)
        out, _ = nightly.communicate(timeout=300)
    finally:
        if nightly.poll() is None:
            nightly.kill()
    assert nightly.returncode == 0, out
    assert auth.db.job(str(slow)).status == "passed"  # type: ignore[union-attr]
    logs = auth.logs()
    assert "was cancelled" not in logs and "cancelled by" not in logs
    assert f"IGNORED cancel marker {keys.cancel('uncancelled', T, 'test-slow')} for job {slow}: marker signed " \
           "by key" in logs, logs[-3000:]
    assert f"IGNORED cancel marker {keys.cancel('uncancelled')} for job {slow}: a cancel of another-run lies " \
           "at the key of uncancelled: copied, not obeyed" in logs, logs[-3000:]


def test_artifact_get_checks_a_build_and_verify_names_the_check_a_flipped_byte_fails(
        auth: Farm, tmp_path: Path) -> None:
    p = auth.nightly("downloadable", "--suites", "good", rev=2)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "dl"
    got = gearfarm("artifact", "get", "--project", "auth", "--target", T, "--last-good", "-o", str(out),
                   "--config", str(auth.farm.config_path))
    assert got.returncode == 0, got.stdout + got.stderr
    build = auth.db.job(str(JobId("downloadable", T, "build")))
    assert build is not None
    assert f"archive sha256 {build.artifact_sha256} = the signed build record of downloadable:{T}:build" in got.stdout
    assert f"provenance signed by host {auth.cfg.host_name()}" in got.stdout
    unpacked = out / f"auth-{T}-{auth.revs[2][:12]}" / "check.sh"
    assert subprocess.run([unpacked, "x"], capture_output=True, text=True).stdout == "ok 1 - x\n"

    def verify_cli(path: Path) -> subprocess.CompletedProcess[str]:
        return gearfarm("artifact", "verify", str(path), "--config", str(auth.farm.config_path))

    assert verify_cli(out / "artifact.tar.zst").returncode == 0
    for name, check in (("artifact.tar.zst", "archive check failed"), ("provenance.intoto.json",
                                                                       "provenance check failed")):
        copy = tmp_path / f"flipped-{name}"
        shutil.copytree(out, copy, ignore=shutil.ignore_patterns("auth-*"))
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        bad = verify_cli(copy / "artifact.tar.zst")
        assert bad.returncode == 1 and check in bad.stderr, (name, bad.stdout + bad.stderr)


def test_a_rogue_worker_holding_a_job_with_work_status_loses_it_within_its_lease(tmp_path: Path) -> None:
    """A libgearman worker with nothing of the farm's takes a test job and sends WORK_STATUS every
    second for five minutes: it never holds the job's lease, so the nightly submits the job again
    once the lease time has passed, and the run ends within that time plus a minute."""
    holder = tmp_path / "gearman_holder"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", str(holder),
                    str(ROOT / "tests" / "gearman_holder.c"), "-lgearman"], check=True)
    repo = tmp_path / "held"
    _init(repo, {"jobs/catalog.toml": CATALOG})
    (tmp_path / "none").mkdir()
    farm = EmbeddedFarm(tmp_path / "state", tmp_path / "none", projects=[ProjectConfig(name="held", repo=str(repo))],
                        slots=1)
    rogue_proc = None
    try:
        # Builds only at first: the test job waits in gearmand, where the rogue takes it.
        farm.start(catalog_mod.parse(CATALOG, "held"), [T], roles=("build",))
        cfg = config_mod.load(farm.config_path)
        cfg.farm.lease_timeout = 20.0
        config_mod.dump(cfg, farm.config_path)
        assert farm.gearmand is not None
        host, port = farm.gearmand.address
        taken = tmp_path / "taken"
        rogue_proc = subprocess.Popen([str(holder), host, str(port), f"test:{T}", "300", str(taken)],
                                      stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "gearfarm.cli", "nightly", "--config", str(farm.config_path),
                              "--benchmarks", "none", "--suites", "good", "--run-id", "held"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for("the rogue to take the test job", lambda: taken.exists() and taken.stat().st_size > 0, 120)
        held_at = time.monotonic()
        payload = verify(taken.read_bytes(), cfg.nightly_lookup(), cfg.farm.payload_max_age)
        assert payload.job_id == f"held:{T}:test-good"
        farm.spawn("tests", ["worker", "--role", "test", "--targets", T])
        out, _ = p.communicate(timeout=300)
        ended = time.monotonic()
        assert rogue_proc.poll() is None, "the rogue let go of the job: the test proves nothing"
    finally:
        if rogue_proc is not None:
            rogue_proc.kill()
        farm.stop()
    assert p.returncode == 0, out
    row = ResultsDB(cfg.database.url).job(f"held:{T}:test-good")
    assert row is not None and (row.status, row.attempt) == ("passed", 2)
    assert "by a worker that never claimed it" in out, out
    print(f"\nrogue holder: took the job {held_at - t0:.1f}s after start; run ended {ended - held_at:.1f}s later "
          f"(lease {cfg.farm.lease_timeout:.0f}s)")
    assert ended - held_at <= cfg.farm.lease_timeout + 60
