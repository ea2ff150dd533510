"""`gearfarm web`: the dashboard, a Flask application served by waitress. Pages are rendered on
the server from gearfarm.web.dashboard's dicts, and the same dicts are the JSON under /api/.
Reading needs no account; triage (and, with them, cancel and self-service runs) needs one:
a browser logs in with a name and token (a signed session cookie, every form CSRF-protected
by Flask-WTF), a script sends the token as a bearer header (no cookie, so no CSRF to fear).
Logs stream from the artifact store, or from the copies on disk when the store is gone (the
embedded default's MinIO stops with its farm), so the dashboard works with no farm running.

What a job wrote is a project author's bytes, and the dashboard's readers are logged in: every
job file is served as plain text or a download, never sniffed, under a sandboxing CSP, and
every page under a CSP that runs only the dashboard's own script (one file, served here). A
session lives on the server (gearfarm.db.account), so logging out ends it for any copy of the
cookie; a login returns only to a path on this dashboard."""

from __future__ import annotations

import gc
import logging
import os
import secrets
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from flask import Flask, Response, abort, g, jsonify, redirect, render_template, request, session, url_for
from flask.json.provider import DefaultJSONProvider
from flask_wtf.csrf import CSRFError, CSRFProtect, generate_csrf
from jinja2 import ChoiceLoader, FileSystemLoader
from markupsafe import Markup

from gearfarm.config import Config, write_private
from gearfarm.db import account, triage
from gearfarm.db.results import ResultsDB
from gearfarm.formats.words import counted
from gearfarm.hosts import process
from gearfarm.perf import trend
from gearfarm.report import joblog
from gearfarm.report.document import Report
from gearfarm.report.publisher import run_dir
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore, StoreError
from gearfarm.web import dashboard, selfservice
from gearfarm.web.pagecache import PageCache

log = logging.getLogger(__name__)
TEMPLATES = Path(__file__).parents[1] / "templates" / "web"
# The dashboard's pages: only their own origin's script and stylesheet (no inline script, so an
# injected <script> does not run), no plugins, no <base> rewriting, forms post only here, and
# no framing (clickjacking). style-src needs no 'unsafe-inline': the pages carry no style
# attribute or element (the tip's position is set through the CSSOM, which a CSP allows).
PAGE_CSP = "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
# What a job wrote: a unique origin with nothing allowed, should any browser render it anyway.
JOB_OUTPUT_CSP = "sandbox; default-src 'none'; frame-ancestors 'none'"
# The newest ended runs of each project whose pages `gearfarm web` makes ahead, and how often it
# looks for new ones (a look at what is kept already costs a count per run).
WARM_RUNS = 3
WARM_SECONDS = 20.0
# The dashboard's own stylesheet and script, rendered from templates/web/<name>.j2.
STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}


def _secret(cfg: Config) -> str:
    """The key that signs session cookies and CSRF tokens: [web] secret, else one of the
    dashboard's own, made once and kept 0600 in the state directory. Never derived from the
    farm's signing keys: every worker host holds those, and a key derived from them let a host
    sign a session cookie (issue #33)."""
    if cfg.web.secret:
        return cfg.web.secret
    path = cfg.path(cfg.farm.state_dir) / "web-secret"
    try:
        if not path.parent.is_dir():
            raise OSError("no state directory")
        if not path.exists():
            # Written whole, then linked into place: a dashboard starting beside this one reads
            # either no file or the whole key, and the first link wins.
            tmp = path.with_name(f".web-secret-{os.getpid()}")
            write_private(tmp, (secrets.token_hex(32) + "\n").encode())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        kept = path.read_text().strip()
        if len(kept) < 32:
            raise OSError(f"{path} holds no key of 32 characters or more")
        return kept
    except OSError as e:
        log.warning("cannot keep the dashboard's session key in %s (%s): sessions last until it restarts; "
                    "set [web] secret to keep them", path, e)
        return secrets.token_hex(32)


class _OrJSON(DefaultJSONProvider):
    """The API's JSON written by orjson, keys sorted as Flask's own writer sorts them: a big
    night's run is 7 MB of it, 0.1 s in the standard library's encoder; and a part kept as JSON
    text (an orjson.Fragment: a run's records, gearfarm.web.pagecache) goes out without being read.
    What orjson cannot write itself goes through Flask's default (dates, dataclasses)."""

    def _encode(self, obj: Any, option: int = 0) -> bytes:
        return orjson.dumps(obj, default=self.default, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | option)

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return self._encode(obj).decode()

    def response(self, *args: Any, **kwargs: Any) -> Response:
        """As Flask's, but the body stays the bytes orjson wrote: Flask's own makes them text
        and back, two more copies of a big night's 7 MB. Compact also in debug mode."""
        body = self._encode(self._prepare_response_obj(args, kwargs), orjson.OPT_APPEND_NEWLINE)
        return self._app.response_class(body, mimetype=self.mimetype)


def create_app(cfg: Config, db: ResultsDB | None = None, store: ArtifactStore | None = None) -> Flask:
    app = Flask("gearfarm.web.app", template_folder=str(TEMPLATES), static_folder=None)
    app.json = _OrJSON(app)
    # The dashboard's own pages first, then the report's partials it shares (bisection.html.j2).
    app.jinja_loader = ChoiceLoader([FileSystemLoader(TEMPLATES), FileSystemLoader(TEMPLATES.parent)])
    app.config.update(SECRET_KEY=_secret(cfg), WTF_CSRF_CHECK_DEFAULT=False, WTF_CSRF_TIME_LIMIT=None,
                      SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
                      SESSION_COOKIE_SECURE=bool(cfg.web.url and cfg.web.url.startswith("https://")))
    csrf = CSRFProtect(app)
    db = db or ResultsDB(cfg.database.url)
    pages = PageCache()
    app.extensions["gearfarm.pages"] = pages  # the pages made once (the warm thread counts what it kept)
    if store is None:
        # One attempt, no waiting: a log the store cannot give now is read from its copy on disk.
        store = ArtifactStore(cfg.s3, retry_for=0.0, attempts=1)
    # Flask escapes only templates named .html/.xml; these are .html.j2 and .atom.j2.
    app.jinja_env.autoescape = True
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True
    app.jinja_env.filters["utc"] = lambda t: time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) if t else ""
    app.jinja_env.filters["short"] = lambda rev: (rev or "")[:10]
    app.jinja_env.filters["secs"] = lambda s: "" if s is None else (f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min")
    app.jinja_env.filters["pct"] = lambda x: "" if x is None else f"{x * 100:+.1f} %"
    app.jinja_env.filters["counted"] = counted
    app.jinja_env.filters["status_word"] = dashboard.status_word
    app.jinja_env.filters["status_mark"] = dashboard.status_mark

    def user() -> str | None:
        """Under /api/ only a bearer token counts, never the session cookie: a third-party page
        can make a browser send the cookie, not the header, so /api/ needs no CSRF token."""
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return account.who(db, auth.removeprefix("Bearer ").strip())
        if request.path.startswith("/api/"):
            return None
        # Only a session the server still has: logging out or removing the account deletes it.
        return account.session_user(db, session.get("sid"))

    def job_output(chunks: Iterator[bytes], download: str | None = None, status: int = 200) -> Response:
        """A file a job wrote, as inert text (or a download named ``download``); the
        after_request hook gives it the sandboxing CSP."""
        g.job_output = True
        if download is None:
            return Response(_closing(chunks), status=status, content_type="text/plain; charset=utf-8")
        return Response(_closing(chunks), content_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{download}"'})

    @app.after_request
    def _security_headers(resp: Response) -> Response:
        """The one place every answer gets its headers: pages, JSON, errors and job files."""
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Referrer-Policy"] = "same-origin"
        if g.get("job_output"):
            resp.headers["Content-Security-Policy"] = JOB_OUTPUT_CSP
            if not resp.headers.get("Content-Disposition", "").startswith("attachment") and \
                    resp.mimetype != "text/plain":
                resp.content_type = "text/plain; charset=utf-8"  # whatever a route meant, never markup
        else:
            resp.headers["Content-Security-Policy"] = PAGE_CSP
        return resp

    def local_path(nxt: str) -> str | None:
        """``nxt`` when it is a path on this dashboard, else None. A browser drops tabs and
        newlines from a Location, reads a backslash as a slash and `//host` as another host, and
        a path may carry any of them percent-encoded: a value with any of them is refused whole,
        and what is left must resolve to this host with a path starting with one '/'."""
        decoded = nxt
        for _ in range(3):  # doubly encoded too
            decoded = urllib.parse.unquote(decoded)
        if not nxt or len(nxt) > 2000 or any(c.isspace() or c < " " or c in "\x7f\\" for c in decoded):
            return None
        if not decoded.startswith("/") or decoded.startswith("//"):
            return None
        parts = urllib.parse.urlsplit(nxt)
        if parts.scheme or parts.netloc:
            return None
        here = urllib.parse.urlsplit(request.host_url)
        there = urllib.parse.urlsplit(urllib.parse.urljoin(request.host_url, nxt))
        if (there.scheme, there.netloc) != (here.scheme, here.netloc) or not there.path.startswith("/"):
            return None
        return nxt

    @app.before_request
    def _csrf() -> None:
        if request.method == "POST" and not request.path.startswith("/api/"):
            csrf.protect()

    @app.errorhandler(CSRFError)
    def _csrf_failed(e: CSRFError) -> tuple[str, int]:
        # 403, not Flask-WTF's 400: the request is well formed, but nothing in it says a logged-in
        # user of this dashboard sent it (no session it signed, or no token of that session).
        return page("error.html.j2", {"status": 403, "message": f"The form was refused: {e.description} Reload "
                                      "the page and send it again."}), 403

    @app.context_processor
    def _globals() -> dict[str, Any]:
        return {"user": user(), "csrf_token": generate_csrf, "series_charts": dashboard.series_charts,
                "curve_charts": dashboard.curve_charts,
                "trend_svg": trend.svg, "timing_rows": dashboard.TIMING_ROWS,
                "tests_columns": dashboard.TESTS_COLUMNS}

    def page(template: str, data: dict[str, Any] | Report) -> str:
        if isinstance(data, dashboard.RunPage) and data.version:
            # A kept run page's parts made from its records alone are kept as HTML too: 5,000
            # cells took 0.1 s to render, its failures most of what was left.
            root = url_for("status")
            matrix = pages.text(("run-matrix", data.run_id, root), data.version,
                                lambda: render_template("run_matrix.html.j2", d=data.whole()))
            results = pages.text(("run-results", data.run_id, root), data.version,
                                 lambda: render_template("run_results.html.j2", d=data))
            return render_template(template, d=data, matrix_html=Markup(matrix), results_html=Markup(results))
        return render_template(template, d=data)

    def both(path: str, endpoint: str, template: str) -> Callable[..., Any]:
        """Register ``path`` as an HTML page and ``/api`` + path as its JSON, from one function."""
        def wrap(fn: Callable[..., dict[str, Any] | Report | None]) -> Callable[..., Any]:
            def html(**kw: Any) -> Any:
                data = fn(**kw)
                if data is None:
                    abort(404)
                return page(template, data)

            def api(**kw: Any) -> Any:
                data = fn(**kw)
                if data is None:
                    return jsonify({"error": "not found"}), 404
                return jsonify(data.as_dict() if isinstance(data, Report) else data)

            app.add_url_rule(path, endpoint, html)
            app.add_url_rule("/api" + (path if path != "/" else "/status"), f"api_{endpoint}", api)
            return fn
        return wrap

    @both("/", "status", "status.html.j2")
    def status() -> dict[str, Any]:
        nights = request.args.get("nights", dashboard.NIGHTS, type=int)
        return dashboard.status(db, max(1, min(nights, 100)), cache=pages)

    @both("/runs", "runs", "runs.html.j2")
    def runs() -> dict[str, Any]:
        return dashboard.runs(db, request.args.get("project") or None, cache=pages)

    @both("/run/<run_id>", "run", "run.html.j2")
    def run(run_id: str) -> dashboard.RunPage | None:
        # The HTML page shows the matrix and timings made from the records; the JSON has them too.
        return dashboard.run(db, cfg, run_id, root=url_for("status"), cache=pages,
                             jobs=request.path.startswith("/api/"), timings_of=request.args.get("target"))

    @both("/test", "test", "test.html.j2")
    def test() -> dict[str, Any]:
        name = request.args.get("name", "").strip()
        if not name:
            abort(400, "name the test: /test?name=suite/test")
        return dashboard.test(db, name, request.args.get("project") or None)

    @both("/regressions", "regressions", "regressions.html.j2")
    def regressions() -> dict[str, Any]:
        a = request.args
        return dashboard.regressions(db, a.get("project") or None, a.get("state") or None, a.get("kind") or None)

    @both("/regression/<int:rid>", "regression", "regression.html.j2")
    def regression(rid: int) -> dict[str, Any] | None:
        return dashboard.regression(db, rid)

    def _triage(rid: int) -> tuple[str | None, str | None]:
        who = user()
        if who is None:
            return None, "log in to triage (an account: gearfarm web user add NAME)"
        body = request.get_json(silent=True) if request.is_json else request.form
        state = str((body or {}).get("state", ""))
        note = str((body or {}).get("note", ""))[:2000]
        try:
            triage.set_state(db, rid, state, who, note)
        except triage.TriageError as e:
            return who, str(e)
        return who, None

    @app.post("/regression/<int:rid>")
    def regression_set(rid: int) -> Any:
        who, err = _triage(rid)
        if who is None:
            return page("error.html.j2", {"status": 403, "message": err}), 403
        if err:
            return page("error.html.j2", {"status": 400, "message": err}), 400
        return redirect(url_for("regression", rid=rid), 303)

    @app.post("/api/regression/<int:rid>")
    def api_regression_set(rid: int) -> Any:
        who, err = _triage(rid)
        if who is None:
            return jsonify({"error": err}), 403
        if err:
            return jsonify({"error": err}), 400
        return jsonify(dashboard.regression(db, rid))

    @both("/perf", "perf_index", "perf.html.j2")
    def perf_index() -> dict[str, Any]:
        return dashboard.perf_index(db, request.args.get("project") or None, request.args.get("target") or None,
                                    request.args.get("benchmark") or None)

    @both("/perf/series", "perf_series", "series.html.j2")
    def perf_series() -> dict[str, Any]:
        a = request.args
        missing = [k for k in ("project", "target", "benchmark", "metric") if not a.get(k)]
        if missing:
            abort(400, f"name the series: {', '.join(missing)} missing (the performance page links every series)")
        nights = max(2, min(a.get("nights", dashboard.SERIES_NIGHTS, type=int), 1000))
        return dashboard.perf_series(db, a["project"], a["target"], a.get("host_class", ""), a["benchmark"],
                                     a["metric"], nights, root=url_for("status"))

    @both("/compare", "compare", "compare.html.j2")
    def compare() -> dict[str, Any] | None:
        a, b = request.args.get("a", "").strip(), request.args.get("b", "").strip()
        return dashboard.compare(db, a or None, b or None, cache=pages)

    @both("/tests", "tests", "tests.html.j2")
    def tests() -> dict[str, Any]:
        """Every test of the recent runs, searchable by name: per target its last status, fail rate."""
        return tests_page(request.args.get("q"), request.args.get("project") or None,
                          api=request.path.startswith("/api/"))

    def tests_page(query: str | None, project: str | None, api: bool) -> dict[str, Any]:
        d = dashboard.tests(db, query, project, cache=pages, rows=api)
        if "kept" in d:
            # Its table's HTML is kept too: 500 rows' links, or 500 × targets cells.
            version, parts = d.pop("kept")
            d["table_html"] = Markup(pages.text(
                ("tests-table", d["query"], d["project"] or "", url_for("status")), version,
                lambda: render_template("tests_table.html.j2", d={**d, "tests": parts.load("tests")})))
        return d

    @both("/hosts", "hosts", "hosts.html.j2")
    def hosts() -> dict[str, Any]:
        """Every host: its key, machine, workers connected now and what they run, recent jobs."""
        return dashboard.hosts(db, cfg)

    @both("/live", "live", "live.html.j2")
    def live() -> dict[str, Any]:
        data = dashboard.live(db, cfg)
        data["started_here"] = [s.as_dict() for s in reversed(list(started.values()))]
        return data

    def _cancel(run_id: str, body: Any) -> tuple[int, str]:
        who = user()
        if who is None:
            return 403, "log in to cancel (an account: gearfarm web user add NAME)"
        run = db.get_run(run_id)
        if run is None:
            return 404, f"no run {run_id}"
        if run.state != "running":
            return 409, f"run {run_id} is {run.state}: nothing to cancel"
        job = str((body or {}).get("job") or "") or None
        if job is not None and job not in (run.expected or []):
            return 400, f"run {run_id} has no job {job!r}"
        # Recorded only: the nightly that owns the run signs and writes the marker that stops
        # the running jobs (gearfarm.formats.marker) within its poll; the dashboard holds no key of it.
        db.request_cancel(run_id, job, who)
        return 200, f"cancelled {job or 'run ' + run_id}"

    @app.post("/run/<run_id>/cancel")
    def cancel(run_id: str) -> Any:
        code, msg = _cancel(run_id, request.form)
        if code != 200:
            return page("error.html.j2", {"status": code, "message": msg}), code
        return redirect(url_for("live") + f"#run-{run_id}", 303)

    @app.post("/api/run/<run_id>/cancel")
    def api_cancel(run_id: str) -> Any:
        code, msg = _cancel(run_id, request.get_json(silent=True))
        return jsonify({"ok": code == 200, "message": msg} if code == 200 else {"error": msg}), code

    started: dict[str, Started] = {}

    def _submit(form: Any) -> tuple[int, str]:
        who = user()
        if who is None:
            return 403, "log in to start a run (an account: gearfarm web user add NAME)"
        try:
            argv, run_id = selfservice.command(cfg, form, who,
                                               taken=lambda rid: rid in started or db.get_run(rid) is not None)
        except selfservice.SubmitError as e:
            return 400, str(e)
        # The nightly it starts would fail (after its own wait) with no gearmand or S3 to submit to.
        down = dashboard.farm_down(cfg)
        if down is not None:
            return 503, down
        log_path = cfg.submitted_log(run_id)
        proc = process.spawn(argv, log_path, cwd=Path(__file__).resolve().parents[2])
        _forget_ended(started)
        started[run_id] = Started(run_id, who, time.time(), proc, log_path)
        log.info("%s started run %s: %s", who, run_id, " ".join(argv[3:]))
        return 200, run_id

    @app.route("/submit", methods=["GET", "POST"])
    def submit() -> Any:
        if request.method == "GET":
            return page("submit.html.j2", dashboard.submit_form(db, cfg))
        code, out = _submit(request.form)
        if code != 200:
            return page("error.html.j2", {"status": code, "message": out}), code
        return redirect(url_for("live") + f"#run-{out}", 303)

    @app.post("/api/submit")
    def api_submit() -> Any:
        code, out = _submit(request.get_json(silent=True) or {})
        return jsonify({"run_id": out} if code == 200 else {"error": out}), code

    @app.get("/submitted/<run_id>/log")
    def submitted_log(run_id: str) -> Response:
        s = started.get(run_id)
        if s is None:
            abort(404, f"run {run_id} was not started from this dashboard in its last {counted(STARTED_KEPT, 'run')}")
        try:
            body = s.log_path.read_bytes()
        except FileNotFoundError:
            abort(404, f"the output of run {run_id} was pruned with the run (gearfarm store prune)")
        # The nightly's output quotes what the project's jobs printed: job output too.
        return job_output(iter([body]))

    @app.get("/feed.atom")
    def feed() -> Response:
        data = dashboard.regressions(db)
        updated = max((g["detected_at"] for g in data["regressions"]), default=time.time())
        body = render_template("feed.atom.j2", d=data, updated=updated, root=request.url_root,
                               iso=lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)))
        return Response(body, mimetype="application/atom+xml")

    @app.get("/run/<run_id>/log/<target>/<step>")
    def job_log(run_id: str, target: str, step: str) -> Response:
        name = request.args.get("file", "log.txt")
        try:
            chunks = joblog.stream(db, store, run_dir(cfg, run_id), run_id, target, step, name)
        except ValueError as e:
            abort(400, str(e))
        except joblog.Altered as e:
            # Not the job's file: what was found is not served, and the answer says why.
            return job_output(iter([f"{target}/{step} of run {run_id}: {e}\n".encode()]), status=409)
        if chunks is None:
            abort(404, f"no {name} for {target}/{step} of run {run_id}: not in the results database or the store, "
                       "and no copy on disk")
        # junit.xml as text too: as XML, a browser would run an XHTML or SVG script in it.
        return job_output(chunks)

    @app.get("/run/<run_id>/step/<target>/<step>")
    def step_page(run_id: str, target: str, step: str) -> Any:
        """A step's log as a page: numbered lines to link to, its header, search, the run's other
        steps. The text is the job's and is escaped like every value (the raw log, served inert,
        is a link away)."""
        refused = ""
        try:
            chunks = joblog.stream(db, store, run_dir(cfg, run_id), run_id, target, step, "log.txt")
        except ValueError as e:
            abort(400, str(e))
        except joblog.Altered as e:
            chunks, refused = None, str(e)
        text = b"".join(chunks).decode("utf-8", "replace") if chunks is not None else None
        data = dashboard.step_log(db, run_id, target, step, text, refused)
        if data is None:
            abort(404, f"no step {target}/{step} in run {run_id}")
        return page("step.html.j2", data)

    def build_file(run_id: str, target: str, step: str, provenance: bool = False) -> Response:
        """A build's archive or its provenance, to whoever may download builds: named by the
        record the ledger applied, never by a key the browser chose."""
        if not cfg.web.public_artifacts and user() is None:
            abort(403, "log in to download builds (or set [web] public_artifacts = true)")
        rec = next((r for r in db.jobs(run_id, target) if r.step == step), None)
        if rec is None or not rec.artifact_key:
            abort(404, f"no artifact for {target}/{step} of run {run_id}")
        key = keys.provenance_of(rec.artifact_key) if provenance else rec.artifact_key
        filename = key.rsplit("/", 1)[-1]
        try:
            chunks = store.stream(key)
            if not provenance and rec.artifact_sha256:
                # The archive the record names, or nothing: a build role's keys can replace it. (The
                # provenance is signed; `gearfarm artifact verify` checks it with the archive.)
                chunks = joblog.checked(chunks, rec.artifact_sha256, None, filename, "store")
        except StoreError as e:
            abort(503, f"the artifact store does not answer ({e}); artifacts are not copied to disk")
        except joblog.Altered as e:
            return job_output(iter([f"{target}/{step} of run {run_id}: {e}\n".encode()]), status=409)
        return job_output(chunks, download=f"{target}-{filename}")

    @app.get("/run/<run_id>/artifact/<target>/<step>")
    def job_artifact(run_id: str, target: str, step: str) -> Response:
        return build_file(run_id, target, step)

    @app.get("/run/<run_id>/provenance/<target>")
    def job_provenance(run_id: str, target: str) -> Response:
        return build_file(run_id, target, "build", provenance=True)

    @app.get("/static/<name>")
    def static_file(name: str) -> Response:
        if name not in STATIC:
            abort(404, f"no static file {name!r}")
        # Rendered without the pages' context: nothing in them depends on who asks.
        return Response(app.jinja_env.get_template(f"{name}.j2").render(), content_type=STATIC[name])

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        error = None
        if request.method == "POST":
            name = account.who(db, request.form.get("token", ""))
            if name is not None and name == request.form.get("name", "").strip():
                session.clear()
                session["sid"] = account.start_session(db, name)
                return redirect(local_path(request.form.get("next") or "") or url_for("status"), 303)
            error = "unknown name or token"
        nxt = local_path(request.args.get("next", "")) or ""
        return page("login.html.j2", {"error": error, "next": nxt}), 401 if error else 200

    @app.post("/logout")
    def logout() -> Any:
        account.end_session(db, session.get("sid"))
        session.clear()
        return redirect(url_for("status"), 303)

    @app.get("/api/")
    def api_index() -> Any:
        """The API's own index: every JSON endpoint, its methods, and the page it is the JSON of
        (each is the same function as its page: one definition, two views)."""
        endpoints = []
        for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
            if not rule.rule.startswith("/api/") or rule.endpoint == "api_index":
                continue
            view = app.view_functions[rule.endpoint]
            page_rule = rule.rule.removeprefix("/api") if rule.endpoint.startswith("api_") else None
            endpoints.append({"path": rule.rule, "methods": sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}),
                              "page": "/" if page_rule == "/status" else page_rule,
                              "about": (view.__doc__ or "").strip().split("\n")[0]})
        return jsonify({"endpoints": endpoints,
                        "auth": "reads are open; writes (POST) need an account's token: "
                                "Authorization: Bearer TOKEN (gearfarm web user add NAME)"})

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify({"ok": True})

    @app.errorhandler(400)
    @app.errorhandler(404)
    @app.errorhandler(503)
    def _http_error(e: Any) -> Any:
        if request.path.startswith("/api/"):
            return jsonify({"error": e.description}), e.code
        return page("error.html.j2", {"status": e.code, "message": e.description}), e.code

    def warm() -> int:
        """Make and keep now, before anyone asks, what the first look at each project's newest
        ended runs would make (their pages, the newest two compared, the tests page): a
        5,000-job night's run page took 1.5 s and its tests page 2.5 s to make at that look.
        What is kept already is only checked (its version, one count). How many runs it saw."""
        seen = 0
        with app.test_request_context("/"):
            root = url_for("status")
            for project in db.projects():
                ended = [r for r in db.runs(limit=WARM_RUNS, project=project) if r.finished_at is not None]
                for r in ended:
                    d = dashboard.run(db, cfg, r.run_id, root=root, cache=pages, jobs=False)
                    if d is not None:
                        page("run.html.j2", d)  # keeps its matrix's HTML too
                        seen += 1
                if len(ended) > 1:
                    dashboard.compare(db, ended[1].run_id, ended[0].run_id, cache=pages)
            # Only when it can be kept: with a night running, it would be made anew every round
            # (1.6 s of a 5,000-job night's cases, every 20 s, beside the night itself).
            if all(r.finished_at is not None for r in db.runs(limit=dashboard.TESTS_RUNS)):
                tests_page(None, None, api=False)  # keeps its table's HTML too
            dashboard.status(db, cache=pages)
            dashboard.runs(db, cache=pages)
        return seen

    app.extensions["gearfarm.warm"] = warm
    return app


def _warm_forever(app: Flask, stop: threading.Event) -> None:
    """`gearfarm web`'s own thread: warm() at start and every WARM_SECONDS, so the morning's
    first look at a big night finds it made. A failure is logged and tried again next round."""
    pages: PageCache = app.extensions["gearfarm.pages"]
    first = True
    while not stop.is_set():
        try:
            kept, t0 = pages.kept, time.monotonic()
            seen = app.extensions["gearfarm.warm"]()
            if first or pages.kept > kept:  # said once at start (bench/scale.py waits for it), then when it made any
                log.info("pages made ahead: %d ended runs looked at, %d pages made, in %.1f s", seen,
                         pages.kept - kept, time.monotonic() - t0)
            first = False
        except Exception:
            log.exception("making the newest runs' pages ahead failed; trying again in %d s", WARM_SECONDS)
        stop.wait(WARM_SECONDS)


@dataclass
class Started:
    """A self-service run this dashboard started: its nightly process and log."""

    run_id: str
    who: str
    at: float
    proc: subprocess.Popen[bytes]
    log_path: Path

    def as_dict(self) -> dict[str, Any]:
        code = self.proc.poll()
        return {"run_id": self.run_id, "who": self.who, "at": self.at, "exit_code": code,
                "running": code is None, "log_tail": process.log_tail(self.log_path, 8)}


# Self-service runs whose nightly ended that the dashboard remembers (for /live and their log
# link): each holds its Popen, and a process nobody waits for stays a zombie, so a dashboard
# left open for months kept one per run it started. Each submit reaps the ended ones.
STARTED_KEPT = 100


def _forget_ended(started: dict[str, Started]) -> None:
    ended = [rid for rid, s in list(started.items()) if s.proc.poll() is not None]  # poll() reaps
    for rid in ended[:max(0, len(ended) - STARTED_KEPT)]:
        started.pop(rid, None)


def _closing(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Pass the chunks on and close their source even when the reader goes away mid-way."""
    try:
        yield from chunks
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def serve(cfg: Config, listen: str | None = None, threads: int = 8) -> None:
    """Serve until interrupted (waitress: a production WSGI server in pure Python)."""
    from waitress import serve as waitress_serve

    host, _, port = (listen or cfg.web.listen).rpartition(":")
    # A connection for each serving thread and the warm thread, all open from the start.
    db = ResultsDB(cfg.database.url, connections=threads + 1)
    db.open_pool()
    app = create_app(cfg, db)
    # The modules behind the pages (SQLAlchemy, scipy, Jinja's compiled templates) are ~230,000
    # objects, and a full collection walking them took 120 ms: a random page paid it now and
    # then. Frozen, they are never walked again; only what the pages allocate is.
    from scipy import stats  # noqa: F401  (loaded now, not on the first series page)

    gc.collect()
    gc.freeze()
    stop = threading.Event()
    threading.Thread(target=_warm_forever, args=(app, stop), name="warm", daemon=True).start()
    log.info("dashboard on http://%s:%s/", host, port)
    try:
        waitress_serve(app, host=host, port=int(port), threads=threads, ident="gearfarm")
    finally:
        stop.set()
