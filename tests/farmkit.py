"""Test helpers for whole-farm tests: a temporary git repository of the engine and catalog,
and running the real `gearfarm` command against it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from gearfarm.config import Config
    from gearfarm.formats.seal import Signer
    from gearfarm.run.farm import EmbeddedFarm
    from gearfarm.run.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
GIT = ["git", "-c", "user.name=gearfarm-test", "-c", "user.email=test@gearfarm.local"]


def keyed(state: Path, db_url: str, host: str = "farmhost", roles: tuple[str, ...] = ("build", "test", "perf"),
          targets: tuple[str, ...] = ("*",)) -> dict[str, object]:
    """[farm] settings of a host that is both the nightly's and a worker host, as the embedded
    farm is: the nightly's key and the host's in ``state``/keys (made once), and the host's key
    registered in the results database at ``db_url`` for ``roles`` on ``targets``."""
    from gearfarm.config import write_private
    from gearfarm.db.registry import Registry
    from gearfarm.db.results import ResultsDB
    from gearfarm.formats.seal import Signer

    paths = {}
    for name in ("nightly", host):
        path = state / "keys" / f"{name}.key"
        if not path.exists():
            write_private(path, Signer.generate().pem())
        paths[name] = path
    db = ResultsDB(db_url)
    Registry(db).add(host, Signer.load(paths[host]).public_text, roles, targets)
    db.engine.dispose()
    return {"nightly_keys": [Signer.load(paths["nightly"]).public_text], "signing_key": str(paths["nightly"]),
            "host_key": str(paths[host]), "host_name": host}


def key_secrets(cfg: Config) -> list[str]:
    """The private key material a config names (the nightly's and the host's key files' base64
    bodies): what must never reach a log, an object or a command line."""
    out = []
    for name in (cfg.farm.signing_key, cfg.farm.host_key):
        if name:
            out += [line for line in cfg.path(name).read_text().splitlines() if not line.startswith("-----")]
    return out


def claim(ledger: Ledger, signer: Signer, job_id: str, attempt: int, host: str, worker: str = "w") -> str:
    """A worker's claim of an attempt, as the collector hands it to the ledger: its answer word."""
    from gearfarm.formats.lease import Lease, seal_lease

    word, _ = ledger.lease(seal_lease(Lease(job_id=job_id, attempt=attempt, host=host, worker=worker, beat=0), signer))
    return word


def make_repo(dest: Path) -> Path:
    """A git repository holding this checkout's engine/ and jobs/ (working tree, not HEAD, so
    the tests test the code as it is)."""
    dest.mkdir(parents=True)
    for part in ("engine", "jobs"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("build", "*.o"))
    subprocess.run(GIT + ["init", "-q", "-b", "main"], cwd=dest, check=True)
    commit(dest, "engine import")
    return dest


def commit(repo: Path, message: str) -> str:
    subprocess.run(GIT + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(GIT + ["commit", "-q", "--allow-empty", "-m", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def wait_for(what: str, check: Callable[[], T], timeout: float = 30.0) -> T:
    """``check()``'s first true answer, asked every 0.2 s; fails naming ``what`` after ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return got


def bench_module(name: str) -> Any:
    """bench/<name>.py, loaded as module ``name`` (bench/ is scripts, not a package); its
    dataclasses find it in sys.modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def descriptors(pid: int) -> list[str]:
    """What a process of ours holds open: its /proc/PID/fd entries' targets, sorted."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed between the listing and the look
            pass
    return sorted(out)


def settled_descriptors(pid: int) -> list[str]:
    """Its descriptors once they hold still for half a second (a client's socket is closed by
    a server just after its answer)."""
    import time

    seen, deadline = descriptors(pid), time.monotonic() + 15
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = descriptors(pid)
        if now == seen:
            return now
        seen = now
    return seen


def gearfarm(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gearfarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def edit_catalog(repo: Path, old: str, new: str, message: str) -> str:
    """Change the repository's job catalog (``old`` must be in it, so a catalog that moved on
    fails loudly instead of testing nothing) and commit; returns the new revision."""
    cat = repo / "jobs" / "catalog.toml"
    text = cat.read_text()
    assert old in text, f"{old!r} is not in {cat}"
    cat.write_text(text.replace(old, new))
    return commit(repo, message)


def counted_iibench(rows: int, repetitions: int) -> str:
    """A catalog entry for iiBench measured in instructions (callgrind): the same count on any
    host, so a change of the code is certain to show and nothing else can."""
    return f"""
[benchmarks.iibench-quick]
argv = ["{{root}}/engine/build/{{target}}/gfe-bench{{exe}}", "iibench", "--rows", "{rows}", "--cache-mb", "64",
        "--index", "betree", "--seed", "{{seed}}", "--dir", "{{scratch}}"]
timeout = 300
repetitions = {repetitions}
counter = "instructions"
metrics = {{ instructions = "lower" }}
units = {{ instructions = "instructions" }}
curves = [{{ title = "insert rate by rows inserted", x = "rows", y = "interval_rate" }}]
"""


# Extra hashing over every row: about a fifth more work per insert (iiBench costs ~13,000
# instructions a row here), so the insert path gets ~20 % slower on any host.
SLOW_ANCHOR = "            gfe_batch_clear(b);\n        }"
SLOWDOWN = """            gfe_batch_clear(b);
        }
        {
            volatile uint64_t h = 0;
            for (int z = 0; z < 160; z++) h = h * 31u + row[z % (int)sizeof row];
        }"""


def slow_down_inserts(repo: Path) -> None:
    """Make iiBench's insert path ~20 % slower in the repository's engine (not committed)."""
    bench = repo / "engine" / "tools" / "bench.c"
    head, sep, body = bench.read_text().partition("static int iibench(")
    assert sep and SLOW_ANCHOR in body, "engine/tools/bench.c changed: update tests/farmkit.py's SLOW_ANCHOR"
    bench.write_text(head + sep + body.replace(SLOW_ANCHOR, SLOWDOWN, 1))


# ------------------------------------------------------------------ the dashboard's history

TARGET = "linux-x86_64"
BREAK_OLD = 'CHECK(mkidx(db, "", GFE_BTREE, 0, 0, 0) == GFE_EINVAL, "empty index name accepted");'
BREAK_NEW = 'CHECK(mkidx(db, "", GFE_BTREE, 0, 0, 0) == GFE_OK, "empty index name accepted");'


def six_nights(base: Path) -> tuple[EmbeddedFarm, Path, dict[str, str]]:
    """Six real nightlies (w1..w6: build, unit suite, a counted iiBench) of an engine repository
    whose fifth commit breaks a unit test and makes inserts ~20 % slower. Returns the farm,
    still running (the caller stops it), the repository and each run's revision."""
    from gearfarm.formats import catalog as catalog_mod
    from gearfarm.run.farm import EmbeddedFarm

    repo = make_repo(base / "repo")
    cat = repo / "jobs" / "catalog.toml"
    cat.write_text(cat.read_text() + counted_iibench(rows=4000, repetitions=3))
    commit(repo, "a quick iibench for the nightly perf job")
    suite = repo / "engine" / "tools" / "suite.c"
    assert BREAK_OLD in suite.read_text(), "engine/tools/suite.c changed: update tests/farmkit.py's BREAK_OLD"
    farm = EmbeddedFarm(base / "state", repo)
    revs: dict[str, str] = {}
    try:
        farm.start(catalog_mod.load_file(cat), [TARGET], perf=True)
        for night in range(1, 7):
            if night == 5:
                suite.write_text(suite.read_text().replace(BREAK_OLD, BREAK_NEW))
                slow_down_inserts(repo)
                revs[f"w{night}"] = commit(repo, "night 5: break limits_and_bad_arguments, slow down inserts")
            else:
                revs[f"w{night}"] = commit(repo, f"night {night}: no change that matters")
            p = gearfarm("nightly", "--config", str(farm.config_path), "--targets", TARGET, "--suites", "unit",
                         "--benchmarks", "iibench-quick", "--run-id", f"w{night}", timeout=600)
            assert p.returncode in (0, 1), p.stdout + p.stderr
    except BaseException:
        farm.stop()
        raise
    return farm, repo, revs


def api_call(url: str, path: str, body: dict | None = None,  # type: ignore[type-arg]
             token: str | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    """A JSON request to the dashboard at ``url`` (a POST when ``body`` is given), with a bearer
    token when given; (HTTP status, the answer's JSON), errors included."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def add_user(config: Path, name: str) -> str:
    """A dashboard account; its token."""
    p = gearfarm("web", "--config", str(config), "user", "add", name)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().rsplit(" ", 1)[-1]


def start_web(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`gearfarm web` on a free loopback port, answering; (its process, its URL)."""
    import time
    import urllib.request

    from gearfarm.hosts import process
    from gearfarm.hosts.net import free_port

    port = free_port()
    proc = process.spawn([sys.executable, "-m", "gearfarm.cli", "web", "--config", str(config), "--listen",
                          f"127.0.0.1:{port}"], log, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2).read()
            return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                process.stop(proc, timeout=5)
                raise RuntimeError("the dashboard did not start: " + log.read_text()[-2000:]) from None
            time.sleep(0.2)


def browser_login(page, url: str, name: str, token: str) -> None:  # type: ignore[no-untyped-def]
    """Log ``name`` in to the dashboard at ``url`` in a Playwright page, through its form."""
    page.goto(url + "/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert page.locator("header .me").inner_text().startswith(name)


def carried_files(db_url: str) -> dict[str, bytes]:
    """Every job file the results database keeps (those the records carried), by "<job id>/<name>":
    where a job's files are beside S3 (gearfarm.formats.result.ResultRecord.files), for the scans
    of what a job left behind."""
    from sqlalchemy import select

    from gearfarm.db.results import JobRow, ResultsDB
    from gearfarm.formats.result import unpack_file

    db = ResultsDB(db_url)
    with db.engine.connect() as conn:
        rows = conn.execute(select(JobRow.job_id, JobRow.files).where(JobRow.files.is_not(None))).all()
    return {f"{job}/{name}": unpack_file(text) for job, files in rows for name, text in (files or {}).items()}


def descendants(roots: Iterable[int]) -> dict[int, list[str]]:
    """The live processes below ``roots`` (their children, theirs, ...), roots excluded, with
    their command lines: what a test started, found from its own pids, never from every
    process of the machine by name."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] not in (b"Z", b"X"):
                parent[int(name)] = int(fields[1])
    below: dict[int, list[str]] = {}
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier and pid not in below}
        for pid in frontier:
            try:
                below[pid] = [a.decode(errors="replace") for a in
                              Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
            except OSError:
                below[pid] = []
    return below
