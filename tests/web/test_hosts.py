"""/hosts: every host with its registered key, the workers it has connected to a real gearmand
now (their roles and targets, from the functions they registered) and the step each is running
(from the host's open lease), and how its recent jobs ended. (In Chromium on a running farm:
tests/web/test_web_live.py.)"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gearfarm.config import Config, DatabaseConfig, FarmConfig, GearmanConfig, S3Config
from gearfarm.db.registry import Registry
from gearfarm.db.results import LeaseRow, ResultsDB
from gearfarm.formats.seal import Signer
from gearfarm.gearman import admin
from gearfarm.gearman.worker import Worker
from gearfarm.hosts import tls
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.net import free_port
from gearfarm.web.app import create_app
from tests.farmkit import bench_module, wait_for


def test_hosts_shows_each_hosts_key_connected_workers_and_running_step(tmp_path: Path, gearmand: Gearmand) -> None:
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    rid = bench_module("web_speed").populate(db, 2)[-1]
    key = Registry(db).add("testhost", Signer.generate().public_text, ["build", "test"], ["linux-t00"])
    now = time.time()
    with db.writing() as conn:
        conn.execute(LeaseRow.__table__.insert().values(
            job_id=f"{rid}:linux-t00:test-unit", attempt=1, kid=key.kid, host="testhost", worker="testhost-test-4242",
            run_id=rid, claimed_at=now - 5, beat_at=now, beats=2, done=False))
    host, port = gearmand.address
    stop = threading.Event()
    workers = []
    for client_id in ("testhost-build+test-4242", "testhost-build+test-4243"):
        w = Worker([gearmand.address], client_id, poll_interval=0.2)
        for fn in ("build:linux-t00", "test:linux-t00"):
            w.register(fn, lambda job: b"")
        workers.append(w)
        threading.Thread(target=w.work, args=(stop,), daemon=True).start()
    try:
        wait_for("both workers to register", lambda: len([w for w in admin.workers(host, port)
                                                          if w.client_id.startswith("testhost-")]) == 2)
        cfg = Config(gearman=GearmanConfig(servers=[f"{host}:{port}"]),
                     database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'results.db'}"),
                     s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"), farm=FarmConfig(state_dir=str(tmp_path)))
        client = create_app(cfg, db).test_client()
        data = client.get("/api/hosts").get_json()
        (h,) = [h for h in data["hosts"] if h["host"] == "testhost"]
        assert h["keys"][0]["kid"] == key.kid and h["keys"][0]["roles"] == ["build", "test"]
        by_id = {w["worker"]: w for w in h["workers"]}
        assert set(by_id) == {"testhost-build+test-4242", "testhost-build+test-4243"}
        busy, idle = by_id["testhost-build+test-4242"], by_id["testhost-build+test-4243"]
        assert busy["roles"] == ["build", "test"] and busy["targets"] == ["linux-t00"]
        assert busy["running"][0]["step"] == {"run_id": rid, "target": "linux-t00", "step": "test-unit"}
        assert idle["running"] == []
        html = client.get("/hosts").get_data(as_text=True)
        assert f'href="/run/{rid}/step/linux-t00/test-unit">linux-t00/test-unit</a>' in html
        assert 'data-worker="testhost-build+test-4243"' in html and "idle" in html
    finally:
        stop.set()
        for w in workers:
            w.wake()
            w.close()


def test_hosts_says_when_gearmand_does_not_answer(tmp_path: Path) -> None:
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{free_port()}"]),
                 database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'results.db'}"),
                 s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"), farm=FarmConfig(state_dir=str(tmp_path)))
    html = create_app(cfg, db).test_client().get("/hosts").get_data(as_text=True)
    assert "is the farm running?" in html and "No host has served this farm" in html


def test_hosts_shows_each_hosts_tls_certificate_from_the_farm_ca(tmp_path: Path) -> None:
    """A host's TLS identity is the client certificate the farm CA issued in its name: its common
    name, serial and expiry, and its revocation, read from the CA's index beside tls_ca."""
    ca = tls.create_ca(tmp_path / "ca")
    first = tls.issue_client(tmp_path / "ca", "testhost")
    tls.issue_client(tmp_path / "ca", "oldhost")
    tls.revoke(ca, "oldhost")
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    Registry(db).add("testhost", Signer.generate().public_text, ["test"], ["linux-t00"])
    cfg = Config(gearman=GearmanConfig(servers=[f"127.0.0.1:{free_port()}"], tls_ca=str(ca.cert),
                                       tls_cert=str(first.cert), tls_key=str(first.key)),
                 database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'results.db'}"),
                 s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"), farm=FarmConfig(state_dir=str(tmp_path)))
    client = create_app(cfg, db).test_client()
    hosts = {h["host"]: h for h in client.get("/api/hosts").get_json()["hosts"]}
    (cert,) = hosts["testhost"]["certificates"]
    serial = next(c.serial for c in tls.issued(tmp_path / "ca") if c.name == "testhost")
    assert cert["common_name"] == "testhost" and cert["serial"] == f"{serial:x}" and cert["revoked"] is None
    (old,) = hosts["oldhost"]["certificates"]  # issued, never seen: still listed, as revoked
    assert old["revoked"]
    html = client.get("/hosts").get_data(as_text=True)
    assert f"CN=<code>testhost</code>, serial <code>{serial:x}</code>" in html and "(revoked " in html
    # A dashboard on a host that has the CA certificate but not the CA: says where to look.
    (tmp_path / "ca" / tls.INDEX_FILE).unlink()
    html = create_app(cfg, db).test_client().get("/hosts").get_data(as_text=True)
    assert "No index of the farm CA" in html
