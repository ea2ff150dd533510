"""The nightly's mail against a real SMTP server on loopback (aiosmtpd): one multipart message
with a text and an HTML part, parsed back for its subject, headline and sections; one message
for the runs of several projects, a section each; STARTTLS and implicit TLS with login (the
password never shows in logs or the message); and a server that cannot be reached: retried,
reported on the console and in the run's record, report kept."""

from __future__ import annotations

import email
import json
import logging
import subprocess
from collections.abc import Iterator
from email import policy
from pathlib import Path

import pytest

from gearfarm.config import Config, DatabaseConfig, FarmConfig, MailConfig, S3Config, dump
from gearfarm.db import history
from gearfarm.db.results import ResultsDB
from gearfarm.hosts.net import free_port
from gearfarm.report import document as report
from gearfarm.report import mail, publisher
from tests.db.test_history import SMTPSink, T, add_run
from tests.farmkit import gearfarm

PASSWORD = "pa55-never-shown"


@pytest.fixture
def sink() -> Iterator[SMTPSink]:
    s = SMTPSink()
    s.controller.start()
    yield s
    s.controller.stop()


def make_report(tmp_path: Path) -> tuple[ResultsDB, dict]:  # type: ignore[type-arg]
    db = ResultsDB(f"sqlite:///{tmp_path / 'results.db'}")
    add_run(db, "r1", 1.0, {T: {"lim": "passed", "crud": "passed", "old": "failed", "fix": "failed"}})
    recs = add_run(db, "r2", 2.0, {T: {"lim": "failed", "crud": "failed", "old": "failed", "fix": "passed"}},
                   reruns={T: {"lim": "failed", "crud": "passed", "old": "failed", "fix": "passed"}})
    run = db.get_run("r2")
    assert run is not None
    return db, report.build(run, db.jobs("r2"), None, history.classify_run(db, run, recs), db.jobs("r2.rerun"))


def check_message(msg: email.message.EmailMessage, rep: report.Report) -> None:
    assert msg["Subject"] == (f"[gearfarm] engine r2 at {rep.rev[:12]}: "
                              "1 new failure, 1 still failing, 1 flaky, 1 fixed")
    assert msg["X-Gearfarm-Run"] == "r2"
    assert msg.get_content_type() == "multipart/alternative"
    parts = [p.get_content_type() for p in msg.iter_parts()]
    assert parts == ["text/plain", "text/html"]  # the last alternative is the preferred one
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert text.splitlines()[0] == f"engine: {rep.headline}"  # the project's headline first
    sections = ["MATRIX", "NEW FAILURES (1)", "FIXED (1)", "FLAKY (1)", "KNOWN FAILURES (1)"]
    pos = [text.index(s) for s in sections]
    assert pos == sorted(pos)
    new = text[text.index("NEW FAILURES"):text.index("FIXED (1)")]
    assert "lim" in new and "FAIL limits" in new and "reproduce: target=linux-x86_64" in new and "seed=7" in new
    known = text[text.index("KNOWN FAILURES"):]
    assert known.count("\n* ") == 1 and "old: failing since run r1" in known  # collapsed to one line
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert f'<h1 id="headline">engine: {rep.headline}</h1>' in html
    assert html.index('id="new"') < html.index('id="fixed"') < html.index('id="flaky"') < html.index('id="known"')


def test_the_report_mail_reaches_a_real_smtp_server_as_one_multipart_message(tmp_path: Path, sink: SMTPSink) -> None:
    _db, rep = make_report(tmp_path)
    cfg = MailConfig(host="127.0.0.1", port=sink.port, sender="farm@example.org", recipients=["a@example.org"])
    d = deliver(rep, tmp_path / "out", cfg)
    assert d.sent and d.error is None and d.attempts == 1
    assert len(sink.messages) == 1 and sink.envelopes == [("farm@example.org", ["a@example.org"])]
    check_message(sink.messages[0], rep)
    # The same message is kept beside the report.
    saved = email.message_from_bytes(Path(d.eml).read_bytes(), policy=policy.default)
    check_message(saved, rep)  # type: ignore[arg-type]


def _two_projects(tmp_path: Path, mail_cfg: MailConfig) -> tuple[ResultsDB, Config]:
    """The engine as in make_report (r1, r2) and a second project, zlibish, passing (z1, z2)."""
    db, _rep = make_report(tmp_path)
    add_run(db, "z1", 1.5, {T: {"lim": "passed", "inflate": "passed"}}, project="zlibish")
    add_run(db, "z2", 2.5, {T: {"lim": "passed", "inflate": "passed"}}, project="zlibish")
    cfg = Config(database=DatabaseConfig(url=db.url), mail=mail_cfg,
                 farm=FarmConfig(state_dir=str(tmp_path / "state")))
    return db, cfg


def _runs(db: ResultsDB, *run_ids: str) -> list:  # type: ignore[type-arg]
    runs = [db.get_run(r) for r in run_ids]
    assert all(runs)
    return runs


def test_one_message_covers_every_project_of_the_nightly_a_section_each(tmp_path: Path, sink: SMTPSink) -> None:
    db, cfg = _two_projects(tmp_path, MailConfig(host="127.0.0.1", port=sink.port, sender="farm@example.org",
                                                 recipients=["a@example.org"]))
    runs = _runs(db, "r2", "z2")
    pub = publisher.publish(cfg, db, None, runs, {r.run_id: db.jobs(r.run_id) for r in runs})
    assert pub.problems == [] and pub.delivery is not None and pub.delivery.sent

    assert len(sink.messages) == 1
    msg = sink.messages[0]
    subject = "gearfarm nightly: engine 1 new failure, 1 still failing, 1 flaky, 1 fixed; zlibish passed"
    assert msg["Subject"] == subject
    assert msg["X-Gearfarm-Run"] == "r2, z2" and sink.for_run("z2") == [msg]
    text = msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert text.splitlines()[0] == subject
    engine, zlibish = text.index("\nengine: 1 new failure"), text.index("\nzlibish: all green")
    assert engine < zlibish  # in the order given
    assert text.count("MATRIX") == 2 and text.index("NEW FAILURES (1)") < zlibish
    assert "NEW FAILURES (0)" in text[zlibish:] and "run z2 at" in text[zlibish:]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert f'<h1 id="headline">{subject}</h1>' in html
    order = [html.index(f'id="{i}"') for i in ("engine-headline", "engine-matrix", "engine-new", "engine-known",
                                                 "zlibish-headline", "zlibish-matrix", "zlibish-new")]
    assert order == sorted(order) and 'id="new"' not in html  # ids stay unique across sections

    # Each run's own report, as for a run on its own; the message beside the first run only.
    state = tmp_path / "state" / "runs"
    assert list(pub.reports) == ["r2", "z2"] and pub.report is pub.reports["r2"]
    assert pub.paths is pub.paths_by_run["r2"] and pub.paths["eml"] == state / "r2" / "report.eml"
    for rid, project in (("r2", "engine"), ("z2", "zlibish")):
        assert json.loads((state / rid / "report.json").read_text())["project"] == project
        assert (state / rid / "report.html").read_text().count('id="headline"') == 1
        run = db.get_run(rid)
        assert run is not None and run.notes["mail"]["sent"] is True and run.notes["mail"]["runs"] == ["r2", "z2"]
    assert not (state / "z2" / "report.eml").exists()
    saved = email.message_from_bytes((state / "r2" / "report.eml").read_bytes(), policy=policy.default)
    assert saved["Subject"] == subject


def test_without_mail_settings_the_nightly_message_is_written_beside_the_first_run(tmp_path: Path) -> None:
    db, cfg = _two_projects(tmp_path, MailConfig())
    runs = _runs(db, "z2", "r2")
    pub = publisher.publish(cfg, db, None, runs, {r.run_id: db.jobs(r.run_id) for r in runs})
    state = tmp_path / "state" / "runs"
    assert pub.delivery is not None and not pub.delivery.sent and pub.problems == []
    assert pub.paths["eml"] == state / "z2" / "report.eml" and not (state / "r2" / "report.eml").exists()
    msg = email.message_from_bytes((state / "z2" / "report.eml").read_bytes(), policy=policy.default)
    assert msg["Subject"].startswith("gearfarm nightly: zlibish passed; engine 1 new failure")


def test_the_plots_of_every_run_are_inline_parts_the_html_names(tmp_path: Path) -> None:
    import base64

    _db, rep = make_report(tmp_path)
    other = rep.model_copy(update={"run_id": "z2", "project": "zlibish"})
    entry = {"benchmark": "iibench", "metric": "rate", "target": T, "host_class": "c", "direction": "regression",
             "higher_is_better": True, "change": -0.2, "ci_low": -0.25, "ci_high": -0.15, "p_value": 0.001,
             "before": 100.0, "after": 80.0, "first_bad_rev": "b" * 40, "last_good_rev": "a" * 40,
             "first_bad_run": "r2", "nights": 9, "svg": "<svg></svg>",
             "png_b64": base64.b64encode(b"\x89PNG not really").decode()}
    rep = rep.with_performance([entry])
    other = other.with_performance([entry, entry])
    assert other.subject.startswith("[gearfarm] zlibish z2")
    assert other.summary.startswith("zlibish 2 performance regressions")
    msg = mail.compose(publisher.letter([rep, other]), MailConfig())
    cids = sorted(p["Content-ID"] for p in msg.walk() if p.get_content_type() == "image/png")
    assert cids == ["<perf0-0>", "<perf1-0>", "<perf1-1>"]
    html = msg.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert all(f'src="cid:{c.strip("<>")}"' in html for c in cids)


def _cert(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
@pytest.mark.parametrize("security", ["starttls", "tls"])
def test_starttls_and_tls_with_login_never_show_the_password(tmp_path: Path, security: str,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    cert, key = _cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client verifies the server as usual
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    logins: list[tuple[bytes, bytes]] = []

    def auth(server, session, envelope, mechanism, data):  # type: ignore[no-untyped-def]
        logins.append((data.login, data.password))
        # handled=False: aiosmtpd then answers 535 itself on a wrong password.
        return AuthResult(success=data.password == PASSWORD.encode(), handled=False)

    sink = SMTPSink()
    # aiosmtpd does not count implicit TLS as TLS for AUTH; the socket is encrypted all the same.
    tls = ({"tls_context": ctx, "require_starttls": True} if security == "starttls"
           else {"ssl_context": ctx, "auth_require_tls": False})
    sink.controller = Controller(sink, hostname="127.0.0.1", port=sink.port, authenticator=auth,
                                 auth_required=True, server_hostname="127.0.0.1", **tls)
    sink.controller.start()
    try:
        _db, rep = make_report(tmp_path)
        cfg = MailConfig(host="127.0.0.1", port=sink.port, security=security, username="farm", password=PASSWORD,
                         recipients=["a@example.org"])
        caplog.set_level(logging.DEBUG)
        d = deliver(rep, tmp_path / "out", cfg)
        assert d.sent, d.error
        assert logins == [(b"farm", PASSWORD.encode())] and len(sink.messages) == 1
        check_message(sink.messages[0], rep)
        wrong = cfg.model_copy(update={"password": "wrong-" + PASSWORD})
        d = deliver(rep, tmp_path / "out2", wrong, sleep=lambda _s: None, timeout=10)
        assert not d.sent and "Authentication" in (d.error or "")
        assert d.attempts == 1  # a refused login is not retried: waiting will not fix it
    finally:
        sink.controller.stop()
    for text in (caplog.text, str(d.as_dict()), (tmp_path / "out" / "report.eml").read_text()):
        assert PASSWORD not in text


def test_an_unreachable_server_is_retried_and_the_report_is_kept(tmp_path: Path) -> None:
    _db, rep = make_report(tmp_path)
    dead = free_port()
    pauses: list[float] = []
    cfg = MailConfig(host="127.0.0.1", port=dead, recipients=["a@example.org"], retries=2)
    d = deliver(rep, tmp_path / "out", cfg, sleep=pauses.append, backoff=0.5)
    assert not d.sent and d.attempts == 3 and pauses == [0.5, 1.0]
    assert f"127.0.0.1:{dead}" in (d.error or "") and "after 3 attempt(s)" in (d.error or "")
    assert (tmp_path / "out" / "report.eml").stat().st_size > 0


def test_without_mail_settings_the_message_is_an_eml_beside_the_report(tmp_path: Path) -> None:
    _db, rep = make_report(tmp_path)
    d = deliver(rep, tmp_path / "out", MailConfig())
    assert not d.sent and d.error is None and d.attempts == 0
    check_message(email.message_from_bytes(Path(d.eml).read_bytes(), policy=policy.default), rep)  # type: ignore[arg-type]


def _lab_config(tmp_path: Path, mail_cfg: MailConfig) -> Path:
    cfg = Config(s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}", secret_key="x"),
                 database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'results.db'}"), mail=mail_cfg,
                 farm=FarmConfig(state_dir=str(tmp_path / "state")))
    dump(cfg, tmp_path / "lab.toml")
    return tmp_path / "lab.toml"


def test_report_send_resends_and_records_a_failed_mail_in_the_run(tmp_path: Path, sink: SMTPSink) -> None:
    db, _rep = make_report(tmp_path)
    path = _lab_config(tmp_path, MailConfig(host="127.0.0.1", port=sink.port, recipients=["a@example.org"]))
    p = gearfarm("report", "r2", "--config", str(path), timeout=120)
    assert p.returncode == 0, p.stderr
    assert sink.messages == []  # re-render only
    assert (tmp_path / "state" / "runs" / "r2" / "report.html").exists()
    p = gearfarm("report", "r2", "--config", str(path), "--send", timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(sink.messages) == 1 and "mail sent to a@example.org" in p.stdout
    run = db.get_run("r2")
    assert run is not None and run.notes["mail"]["sent"] is True

    dead = free_port()
    path = _lab_config(tmp_path, MailConfig(host="127.0.0.1", port=dead, recipients=["a@example.org"], retries=1))
    p = gearfarm("report", "r2", "--config", str(path), "--send", timeout=120)
    assert p.returncode == 2
    assert "mail not sent" in p.stderr and f"127.0.0.1:{dead}" in p.stderr
    run = db.get_run("r2")
    assert run is not None and run.notes["mail"]["sent"] is False
    assert f"127.0.0.1:{dead}" in run.notes["mail"]["error"] and run.notes["mail"]["attempts"] == 2
    assert json_ok(tmp_path / "state" / "runs" / "r2" / "report.json")
    assert (tmp_path / "state" / "runs" / "r2" / "report.eml").exists()


def json_ok(path: Path) -> bool:
    return json.loads(path.read_text())["run_id"] == "r2"


def deliver(rep: report.Report, out: Path, cfg: MailConfig, **kw: object) -> mail.Delivery:
    return mail.deliver(publisher.letter([rep]), out, cfg, **kw)  # type: ignore[arg-type]
