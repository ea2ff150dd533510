"""The dashboard against a hostile project and a hostile link (issue #32, point 5), on a real
MinIO, a real gearmand, the real `gearfarm web` and Debian's chromium (Playwright), logged in
as a real account:

- files a job wrote (a JUnit file carrying an XHTML script, an SVG "JUnit" file with a script,
  an HTML log) are served as inert text: their scripts do not run in the user's session, and
  each answer carries nosniff and a sandboxing CSP; the dashboard's own pages carry a CSP that
  allows no inline script and still render and work under it;
- a login link whose `next` points off-site (a tab, a backslash, `//`, a scheme, encoded
  slashes) lands on the dashboard, never on another host;
- logging out ends the session on the server: a copy of the cookie taken before is worthless
  after, and so is one of an account that was removed and made again;
- two self-service runs submitted in the same second get two run ids, each running its own
  revision.

No workers run: the self-service nightlies submit to gearmand and record their jobs as
"no worker" after a second, which is all the run-id test needs."""

from __future__ import annotations

import hashlib
import http.cookiejar
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gearfarm import config as config_mod
from gearfarm.config import Config
from gearfarm.db.results import ResultsDB
from gearfarm.formats.job import JobId
from gearfarm.formats.result import FileSum, ResultRecord
from gearfarm.hosts import process
from gearfarm.hosts.gearmand import Gearmand
from gearfarm.hosts.minio_server import MinioServer
from gearfarm.hosts.net import free_port
from gearfarm.run.ledger import Ledger
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from tests.farmkit import GIT, add_user, api_call, browser_login, commit, gearfarm, keyed, start_web

TARGET = "linux-x86_64"
RUN = "hostile-1"
CATALOG = """schema = 2

[build]
argv = ["true"]
outputs = ["jobs"]
timeout = 60

[targets.linux-x86_64]
tools = []
suites = []
"""

# What each hostile file's script does when it runs: mark the page (window.name survives into
# what the test reads), then what the issue saw: read the CSRF token from the submit form and
# start a self-service run in the logged-in user's name.
ATTACK = ("window.name='ran';document.title='ran';"
          "fetch('/submit').then(function(r){return r.text()}).then(function(t){"
          "var m=t.match(/name=\"csrf_token\" value=\"([^\"]+)\"/);"
          "return fetch('/submit',{method:'POST',headers:{'Content-Type':'application/x-www-form-urlencoded'},"
          "body:'csrf_token='+encodeURIComponent(m[1])+'&project=calc&rev=main'})"
          "}).then(function(){window.name='submitted'});")
_XML_ATTACK = ATTACK.replace("&", "&amp;")  # well-formed XML, or the browser shows a parse error instead
XHTML_JUNIT = (f'<?xml version="1.0"?>\n<testsuites xmlns:h="http://www.w3.org/1999/xhtml">'
               f'<testsuite name="unit" tests="1"><testcase name="a"/></testsuite>'
               f'<h:script>{_XML_ATTACK}</h:script></testsuites>\n').encode()
SVG_JUNIT = f'<svg xmlns="http://www.w3.org/2000/svg"><script>{_XML_ATTACK}</script></svg>\n'.encode()
HTML_LOG = f"<!DOCTYPE html><html><body><h1>build ok</h1><script>{ATTACK}</script></body></html>\n".encode()
# (step, file, bytes, where): the SVG and XHTML come from MinIO, the HTML log from the copy on
# the nightly host's disk (the dashboard's fallback), so both ways out are covered.
HOSTILE = [("test-xhtml", "junit.xml", XHTML_JUNIT, "s3"), ("test-svg", "junit.xml", SVG_JUNIT, "s3"),
           ("test-html", "log.txt", HTML_LOG, "disk")]


@dataclass
class Site:
    url: str
    config: Path
    cfg: Config
    repo: Path
    revs: list[str]
    tokens: dict[str, str] = field(default_factory=dict)

    def call(self, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
        return api_call(self.url, path, body, token)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None  # the 303 itself is the answer under test


class Client:
    """A browser-like HTTP client: a cookie jar, forms with their CSRF token, no redirects followed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def request(self, path: str, form: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with self.opener.open(self.url + path, data=data, timeout=30) as r:
                return r.status, dict(r.headers.items()), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers.items()), e.read().decode()

    def csrf(self, path: str) -> str:
        code, _, body = self.request(path)
        m = re.search(r'name="csrf_token" value="([^"]+)"', body)
        assert m, f"no CSRF token on {path} ({code})"
        return m.group(1)

    def login(self, name: str, token: str, nxt: str = "") -> tuple[int, dict[str, str]]:
        code, headers, _ = self.request("/login", {"csrf_token": self.csrf("/login"), "name": name, "token": token,
                                                   "next": nxt})
        return code, headers


def _repo(dest: Path) -> list[str]:
    dest.mkdir()
    (dest / "jobs").mkdir()
    (dest / "jobs" / "catalog.toml").write_text(CATALOG)
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    revs = [commit(dest, "one")]
    (dest / "n.txt").write_text("2\n")
    revs.append(commit(dest, "two"))
    return revs


@pytest.fixture(scope="module")
def site(minio: MinioServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    base = tmp_path_factory.mktemp("hostile")
    revs = _repo(base / "calc")
    with Gearmand(base / "gearmand") as gm:
        host, port = gm.address
        cfg = Config.model_validate({
            "projects": [{"name": "calc", "repo": str(base / "calc")}],
            "gearman": {"servers": [f"{host}:{port}"]},
            "s3": minio.s3_config().model_dump(), "database": {"url": f"sqlite:///{base / 'results.db'}"},
            "farm": {"state_dir": str(base / "state"), "no_worker_wait": 1.0, "run_deadline": 120.0,
                     "reference_nights": 0, **keyed(base / "state", f"sqlite:///{base / 'results.db'}")}})
        config_mod.dump(cfg, base / "farm.toml")
        cfg = config_mod.load(base / "farm.toml")
        _hostile_run(cfg)
        tokens = {name: add_user(base / "farm.toml", name) for name in ("alice", "erin")}
        proc, url = start_web(base / "farm.toml", base / "web.log")
        s = Site(url, base / "farm.toml", cfg, base / "calc", revs, tokens)
        try:
            yield s
        finally:
            _wait_started_runs(s)
            process.stop(proc, timeout=10)


def _hostile_run(cfg: Config) -> None:
    """A run whose jobs wrote the hostile files, as a worker would have stored them (and as the
    publisher copies them to disk), and whose build's artifact is an HTML page."""
    db, store = ResultsDB(cfg.database.url), ArtifactStore(cfg.s3, retry_for=10)
    store.ensure_bucket()
    steps = ["build"] + [step for step, _, _, _ in HOSTILE]
    db.create_run(RUN, "0" * 40, [TARGET], [str(JobId(RUN, TARGET, s)) for s in steps], project="calc")
    art = f"artifacts/{'0' * 40}/{TARGET}/tc0123456789abcd/artifact.tar.zst"
    store.put_bytes(art, HTML_LOG)
    now = time.time()
    Ledger(db).apply(ResultRecord(job_id=str(JobId(RUN, TARGET, "build")), run_id=RUN, target=TARGET, kind="build",
                                  step="build", rev="0" * 40, status="passed", started_at=now, finished_at=now + 1,
                                  artifact_key=art, artifact_sha256=hashlib.sha256(HTML_LOG).hexdigest()), "collect")
    for step, name, body, where in HOSTILE:
        if where == "s3":
            # As a test worker leaves a JUnit file too large for its record: in S3 at its
            # content's key, named with its sha256 by the job's record (the dashboard reads no
            # file that no record names).
            sha = hashlib.sha256(body).hexdigest()
            key = keys.job_file(RUN, TARGET, step, name, sha)
            store.put_bytes(key, body)
            applied = Ledger(db).apply(ResultRecord(
                job_id=str(JobId(RUN, TARGET, step)), run_id=RUN, target=TARGET, kind="test", step=step, name=step[5:],
                rev="0" * 40, status="passed", started_at=now, finished_at=now + 1, junit_key=key,
                file_sums={name: FileSum(sha256=sha, size=len(body))}), "nightly")  # no lease: no worker ran it
            assert applied == "applied", applied
        else:
            path = cfg.runs_dir() / RUN / "logs" / TARGET / step / name
            path.parent.mkdir(parents=True)
            path.write_bytes(body)


def _wait_started_runs(site: Site, timeout: float = 120) -> None:
    """Self-service nightlies run in their own sessions: wait for them to end (no workers, so
    their jobs are recorded as such after a second), so none outlives the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, live = site.call("/api/live")
        if code == 200 and not any(s["running"] for s in live.get("started_here", [])):
            return
        time.sleep(0.5)



def login(page, site: Site, name: str) -> None:  # type: ignore[no-untyped-def]
    browser_login(page, site.url, name, site.tokens[name])


def _started(site: Site) -> list[str]:
    code, live = site.call("/api/live")
    assert code == 200
    return [s["run_id"] for s in live["started_here"]]


# ------------------------------------------------------------------ job output is inert text

@pytest.mark.parametrize(("step", "name", "body", "where"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_job_file_with_a_script_does_not_run_in_a_logged_in_browser(site: Site, browser, step: str, name: str,  # type: ignore[no-untyped-def]
                                                                       body: bytes, where: str) -> None:
    ctx = browser.new_context()
    page = ctx.new_page()
    login(page, site, "alice")
    before = _started(site)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(f"{r.method} {r.url}"))
    path = f"/run/{RUN}/log/{TARGET}/{step}" + ("?file=junit.xml" if name == "junit.xml" else "")
    resp = page.goto(site.url + path)
    assert resp is not None and resp.status == 200
    page.wait_for_timeout(1500)  # the script's two fetches have long finished by now, had it run
    assert page.evaluate("window.name") == "", f"the job's script ran: window.name={page.evaluate('window.name')!r}"
    assert requests == [f"GET {site.url}{path}"], requests
    assert _started(site) == before  # no run started in alice's name
    # Served as text, never sniffed into anything else, sandboxed even if a browser renders it.
    h = resp.all_headers()
    assert h["content-type"] == "text/plain; charset=utf-8"
    assert h["x-content-type-options"] == "nosniff"
    csp = [d.strip() for d in h["content-security-policy"].split(";")]
    assert "sandbox" in csp and "default-src 'none'" in csp
    # The bytes are the job's own, shown as text.
    assert page.evaluate("document.contentType") == "text/plain"
    assert "<script>" in page.inner_text("body") or "<h:script>" in page.inner_text("body")
    ctx.close()


def test_a_step_page_shows_a_hostile_log_as_text_in_a_logged_in_browser(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    """The step's page puts the job's log into the dashboard's own HTML: every line escaped, so
    the script is text on the page and never runs with alice's session."""
    ctx = browser.new_context()
    page = ctx.new_page()
    login(page, site, "alice")
    before = _started(site)
    resp = page.goto(f"{site.url}/run/{RUN}/step/{TARGET}/test-html")
    assert resp is not None and resp.status == 200
    page.wait_for_timeout(1500)
    assert page.evaluate("window.name") == "", f"the job's script ran: window.name={page.evaluate('window.name')!r}"
    assert page.title() != "ran" and _started(site) == before
    # Its log is the HTML page: shown as its text, line by line.
    assert "<script>window.name='ran'" in page.locator("#L1 td.lc").inner_text()
    assert page.locator("#log script, #log h1").count() == 0
    ctx.close()


def test_an_artifact_is_a_sandboxed_download(site: Site) -> None:
    req = urllib.request.Request(f"{site.url}/run/{RUN}/artifact/{TARGET}/build",
                                 headers={"Authorization": f"Bearer {site.tokens['alice']}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.read() == HTML_LOG
        assert r.headers["Content-Disposition"].startswith("attachment;")
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in [d.strip() for d in r.headers["Content-Security-Policy"].split(";")]


def test_every_page_carries_a_csp_without_inline_script_and_still_works_under_it(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    for path in ("/", "/login", "/runs", "/submit", f"/run/{RUN}", "/api/status", "/nope", "/feed.atom"):
        h = _headers(site.url + path)
        assert "Content-Security-Policy" in h, f"{path}: no CSP"
        csp = {d.strip().split(" ", 1)[0]: d.strip() for d in h["Content-Security-Policy"].split(";")}
        assert csp["default-src"] == "default-src 'self'", (path, csp)
        assert "'unsafe-inline'" not in csp.get("script-src", "") and "'unsafe-eval'" not in str(csp), (path, csp)
        assert csp["frame-ancestors"] == "frame-ancestors 'none'", path
        assert h.get("X-Content-Type-Options") == "nosniff" and h.get("X-Frame-Options") == "DENY", path
        assert h.get("Referrer-Policy") == "same-origin", path
    # In chromium the pages render with their stylesheet and script and the CSP refuses nothing.
    ctx = browser.new_context()
    page = ctx.new_page()
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    login(page, site, "alice")
    for path in ("/", "/runs", "/submit", "/live", f"/run/{RUN}"):
        page.goto(site.url + path)
        assert page.locator("header").evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(34, 51, 68)", path
    page.goto(f"{site.url}/run/{RUN}")
    page.locator("body").evaluate("b => { const s = document.createElement('span'); s.setAttribute('data-tip', 'hi');"
                                  " s.id = 'probe'; s.textContent = 'x'; b.appendChild(s); }")
    page.hover("#probe")
    page.locator("#tip").wait_for(state="visible")  # the dashboard's own script runs
    assert page.inner_text("#tip") == "hi"
    assert refused == [], refused
    ctx.close()


def _headers(url: str) -> dict[str, str]:
    """The answer's headers, whatever its status (a 404 page is a page too)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return dict(r.headers.items())
    except urllib.error.HTTPError as e:
        return dict(e.headers.items())


# ------------------------------------------------------------------------- open redirects

OFF_SITE = ["/\t/evil.example/phish", "/%09/evil.example/phish", "//evil.example/phish", "/\\evil.example/phish",
            "\\\\evil.example/phish", "https://evil.example/phish", "http:evil.example", "/%2F%2Fevil.example/phish",
            "/%5Cevil.example", " //evil.example", "/\n/evil.example", "javascript:alert(1)", "///evil.example"]


def _lands(base: str, location: str) -> urllib.parse.SplitResult:
    """Where a browser goes for ``location``: the WHATWG URL parser drops tabs and newlines and
    reads a backslash as a slash in http(s) URLs; urllib does neither, so do it first."""
    cleaned = re.sub(r"[\t\n\r]", "", location).strip(" ").replace("\\", "/")
    return urllib.parse.urlsplit(urllib.parse.urljoin(base, cleaned))


@pytest.mark.parametrize("nxt", OFF_SITE)
def test_login_never_redirects_off_site(site: Site, nxt: str) -> None:
    c = Client(site.url)
    code, headers = c.login("alice", site.tokens["alice"], nxt)
    assert code == 303
    there = _lands(site.url + "/login", headers["Location"])
    ours = urllib.parse.urlsplit(site.url)
    assert (there.scheme, there.netloc) == (ours.scheme, ours.netloc), f"next={nxt!r} -> {headers['Location']!r}"
    assert there.path == "/", f"next={nxt!r} -> {headers['Location']!r}: not the status page"


def test_login_still_returns_to_the_page_it_came_from(site: Site) -> None:
    c = Client(site.url)
    code, headers = c.login("alice", site.tokens["alice"], f"/run/{RUN}?x=1#matrix")
    assert code == 303 and _lands(site.url, headers["Location"]).path == f"/run/{RUN}"
    assert urllib.parse.urlsplit(headers["Location"]).query == "x=1"


def test_a_phishing_login_link_lands_on_the_dashboard_in_chromium(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    hits: list[str] = []

    class Phish(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"phished")

        def log_message(self, *args: object) -> None:
            pass

    phish = ThreadingHTTPServer(("127.0.0.1", free_port()), Phish)
    t = threading.Thread(target=phish.serve_forever, daemon=True)
    t.start()
    try:
        other = f"127.0.0.1:{phish.server_address[1]}"
        ctx = browser.new_context()
        page = ctx.new_page()
        page.goto(f"{site.url}/login?next=/%09/{other}/phish")
        page.fill("input[name=name]", "alice")
        page.fill("input[name=token]", site.tokens["alice"])
        page.click("button[type=submit]")
        page.wait_for_load_state()
        assert page.url.startswith(site.url + "/"), page.url
        assert page.locator("header .me").inner_text().startswith("alice")
        assert hits == []
        ctx.close()
    finally:
        phish.shutdown()
        phish.server_close()


# ------------------------------------------------------------------- logout ends the session

def test_a_cookie_copied_before_logout_is_worthless_after_it(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    ctx = browser.new_context()
    page = ctx.new_page()
    login(page, site, "alice")
    copied = ctx.cookies()
    assert copied
    page.goto(site.url + "/submit")
    page.click("header form button")  # log out
    page.wait_for_load_state()
    assert page.locator("header .me").inner_text() == "log in"
    thief = browser.new_context()
    thief.add_cookies(copied)
    tp = thief.new_page()
    tp.goto(site.url + "/submit")
    assert tp.locator("header .me").inner_text() == "log in", "the copied cookie is still logged in"
    assert tp.locator("#error").inner_text().startswith("Log in")
    # Nor does it start anything with a form token it can still read (the login form's).
    before = _started(site)
    tp.goto(site.url + "/login")
    tp.evaluate("""async () => {
        const t = document.querySelector('input[name=csrf_token]').value;
        await fetch('/submit', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},
                                body: 'csrf_token=' + encodeURIComponent(t) + '&project=calc'});
    }""")
    assert _started(site) == before
    thief.close()
    ctx.close()


def test_a_removed_and_remade_account_does_not_inherit_old_sessions(site: Site, browser) -> None:  # type: ignore[no-untyped-def]
    ctx = browser.new_context()
    page = ctx.new_page()
    login(page, site, "erin")
    assert gearfarm("web", "--config", str(site.config), "user", "remove", "erin").returncode == 0
    site.tokens["erin"] = add_user(site.config, "erin")  # someone else, under the same name
    page.goto(site.url + "/submit")
    assert page.locator("header .me").inner_text() == "log in", "the old session belongs to the new account"
    ctx.close()


# --------------------------------------------------------------- run ids of the same second

def test_two_submits_in_the_same_second_get_two_run_ids_each_with_its_own_revision(site: Site) -> None:
    token = site.tokens["alice"]
    for _ in range(20):
        # Start just after a second begins so both submits fall in it.
        time.sleep(1 - time.time() % 1 + 0.02)
        t0 = int(time.time())
        a = site.call("/api/submit", {"project": "calc", "rev": site.revs[0]}, token=token)
        b = site.call("/api/submit", {"project": "calc", "rev": site.revs[1]}, token=token)
        if int(time.time()) == t0:
            break
    else:
        pytest.fail("could not make two submits within one second")
    assert a[0] == 200 and b[0] == 200, (a, b)
    ids = [a[1]["run_id"], b[1]["run_id"]]
    assert ids[0] != ids[1], f"both submits got run id {ids[0]}"
    assert sorted(ids) == sorted(set(_started(site)) & set(ids))  # both started, each its own nightly
    # Each run, once its nightly has submitted it, is of the revision it was asked for.
    deadline = time.monotonic() + 90
    for run_id, rev in zip(ids, site.revs, strict=True):
        while True:
            code, run = site.call(f"/api/run/{run_id}")
            if code == 200:
                break
            log = site.cfg.path(site.cfg.farm.state_dir) / "web" / f"{run_id}.log"
            assert time.monotonic() < deadline, f"run {run_id} never reached the results database: {log.read_text()}"
            time.sleep(0.5)
        assert run["rev"] == rev, f"run {run_id} asked for {rev[:12]} runs {run['rev'][:12]}"
    _wait_started_runs(site)


def test_the_session_key_is_the_dashboards_own_not_derived_from_a_workers_key(tmp_path: Path) -> None:
    """Every worker host holds the farm's signing keys: a session key derived from them let a
    host sign a dashboard cookie (issue #33). The dashboard makes a key of its own, kept 0600 in
    the state directory, the same across restarts."""
    import hashlib
    import hmac

    from gearfarm.config import FarmConfig
    from gearfarm.web.app import create_app

    (tmp_path / "state").mkdir()
    farm = keyed(tmp_path / "state", f"sqlite:///{tmp_path / 'r.db'}")
    cfg = Config(farm=FarmConfig(state_dir=str(tmp_path / "state"), **farm))  # type: ignore[arg-type]
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    key = create_app(cfg, db=db).config["SECRET_KEY"]
    for held in (Path(str(farm["host_key"])).read_text(), Path(str(farm["signing_key"])).read_text()):
        derived = hmac.new(held.encode(), b"gearfarm web session", hashlib.sha256).hexdigest()
        assert key != derived and key not in held and held not in key
    kept = tmp_path / "state" / "web-secret"
    assert kept.read_text().strip() == key and kept.stat().st_mode & 0o777 == 0o600
    assert create_app(cfg, db=db).config["SECRET_KEY"] == key  # sessions outlive a restart
