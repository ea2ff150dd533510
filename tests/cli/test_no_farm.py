"""Commands run with the farm's services down (issue #36): each one that needs gearmand or S3
stops within 5 s with one message naming what is down and how to start it -- for a lab's config,
the systemd units -- and nothing else; those that read only the database work. Logging is
quiet by default: the libraries' INFO lines only with -v. `gearfarm --version` is the installed
package's. (The same for the embedded farm, after a real nightly that stopped:
tests/farm/test_nightly.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from gearfarm.hosts.net import free_port
from tests.farmkit import ROOT

# What "fails fast" means here: the bound, for a command's whole run (Python's start,
# its imports and the probe), on this 2-core machine also while other tests run.
FAST = 5.0


def gearfarm_timed(*args: str | Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gearfarm.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    return p, time.monotonic() - start


def lab_config(where: Path, gearmand: str, s3: str, tls: bool = False) -> Path:
    """A lab's config whose gearmand and S3 are at these addresses, with its results database a
    SQLite file beside it."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "farm.toml"
    tls_lines = f'tls_ca = "{where / "ca.crt"}"\n' if tls else ""
    path.write_text(f'[gearman]\nservers = ["{gearmand}"]\n{tls_lines}\n'
                    f'[s3]\nendpoint = "{s3}"\nsecret_key = "x"\n\n'
                    f'[database]\nurl = "sqlite:///results.db"\n\n[farm]\nstate_dir = "state"\n')
    return path


@pytest.fixture(scope="module")
def stopped_lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lab config whose gearmand and MinIO are down: loopback ports nothing listens on."""
    return lab_config(tmp_path_factory.mktemp("lab"), f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")


def one_error(p: subprocess.CompletedProcess[str]) -> str:
    """The one line a command that could not run printed, checked to be all it printed."""
    assert p.returncode == 2, p
    assert p.stdout == "", p.stdout
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


@pytest.mark.parametrize("args", [("status",), ("status", "--job-servers")], ids=["status", "job-servers"])
def test_status_with_no_gearmand_says_so_once_naming_the_unit(stopped_lab: Path, args: tuple[str, ...]) -> None:
    p, took = gearfarm_timed(*args, "--config", stopped_lab)
    line = one_error(p)
    assert took < FAST, f"{args} took {took:.1f}s"
    assert line.startswith("error: gearmand at 127.0.0.1:") and "does not answer" in line, line
    assert "gearfarm-gearmand.service" in line and "sudo systemctl start gearfarm-gearmand" in line, line
    print(f"{' '.join(args)}: {took:.2f}s: {line}")


@pytest.mark.parametrize("args", [("store", "usage"), ("store", "prune"), ("store", "prune", "--dry-run"),
                                  ("artifact", "get", "--target", "linux-x86_64", "-o", "out")],
                         ids=["usage", "prune", "dry-run", "artifact-get"])
def test_store_commands_with_no_s3_say_so_once_at_once(stopped_lab: Path, args: tuple[str, ...]) -> None:
    p, took = gearfarm_timed(*args, "--config", stopped_lab)
    line = one_error(p)
    assert took < FAST, f"{args} took {took:.1f}s (S3 retried?)"
    assert line.startswith("error: S3 (MinIO) at http://127.0.0.1:") and "does not answer" in line, line
    assert "start MinIO" in line and "gearmand" not in line, line
    print(f"{' '.join(args)}: {took:.2f}s: {line}")


def test_bisect_needs_both_and_names_both(stopped_lab: Path) -> None:
    p, took = gearfarm_timed("bisect", "a..b", "--test", "unit/x", "--target", "linux-x86_64",
                             "--config", stopped_lab)
    line = one_error(p)
    assert took < FAST, f"bisect took {took:.1f}s"
    assert "gearmand at" in line and "S3 (MinIO) at" in line and "do not answer" in line, line
    assert "gearfarm-gearmand.service" in line and "start MinIO" in line, line


def test_an_address_that_never_answers_costs_the_probe_s_timeout_not_a_retry_storm(tmp_path: Path) -> None:
    """192.0.2.1 (TEST-NET-1) drops or refuses every connection: the probe waits its connect
    timeout once, for every address at once. Through stunnel (tls_ca) the message names its
    unit too."""
    config = lab_config(tmp_path, "192.0.2.1:4731", "https://192.0.2.1:9000", tls=True)
    p, took = gearfarm_timed("status", "--config", config)
    line = one_error(p)
    assert took < FAST, f"status took {took:.1f}s"
    assert "gearfarm-gearmand.service and gearfarm-stunnel.service" in line, line
    p, took = gearfarm_timed("store", "usage", "--config", config)
    assert took < FAST and "S3 (MinIO) at https://192.0.2.1:9000 does not answer" in one_error(p), p.stderr


def test_commands_that_read_the_database_work_and_log_quietly(stopped_lab: Path) -> None:
    """history on a database that has no result: its own one message, not a farm's; the
    libraries' INFO lines (alembic's at every open of the database) only with -v."""
    p, took = gearfarm_timed("history", "unit/x", "--config", stopped_lab)
    assert one_error(p) == "error: no results for test 'unit/x'" and took < FAST, (p.stderr, took)
    p, took = gearfarm_timed("report", "nope", "--config", stopped_lab)
    assert one_error(p).startswith("error: no run 'nope' in sqlite:///") and took < FAST, (p.stderr, took)
    loud = subprocess.run([sys.executable, "-m", "gearfarm.cli", "-v", "history", "unit/x", "--config",
                           str(stopped_lab)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert loud.returncode == 2 and " alembic.runtime.migration INFO " in loud.stderr, loud.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "192.0.2.1"])
def test_a_lab_whose_postgresql_is_down_says_so_once_for_every_database_command(tmp_path: Path, host: str) -> None:
    """The results database opens deep inside many commands: PostgreSQL refusing (nothing on the
    port) or never answering (TEST-NET-1) is one line naming it, without its password, and how to
    start it, within the bound; not SQLAlchemy's traceback, not the kernel's TCP timeout."""
    port = free_port() if host == "127.0.0.1" else 5432
    config = lab_config(tmp_path, f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    config.write_text(config.read_text().replace(
        'url = "sqlite:///results.db"', f'url = "postgresql+psycopg://gearfarm:sekret@{host}:{port}/gearfarm"'))
    for args in (("history", "unit/x"), ("report", "nope"), ("keys", "list")):
        p, took = gearfarm_timed(*args, "--config", config)
        line = one_error(p)
        assert took < FAST, f"{args} took {took:.1f}s"
        assert f"the results database postgresql+psycopg://gearfarm:***@{host}:{port}/gearfarm does not answer" \
            in line and "start PostgreSQL" in line, line
        assert "sekret" not in p.stderr


def test_the_default_embedded_state_s_hint_is_the_bare_command(tmp_path: Path) -> None:
    """The embedded farm's own state ($GEARFARM_STATE, else the checkout's state/): the way to
    start it is `./nightly.bash --keep` as it stands, no --state-dir."""
    state, gearmand = tmp_path / "state", f"127.0.0.1:{free_port()}"
    config = lab_config(state, gearmand, f"http://127.0.0.1:{free_port()}")  # its farm.toml, as the farm writes it
    config.write_text(config.read_text().replace('state_dir = "state"', f'state_dir = "{state}"'))
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gearfarm.cli", "status"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "GEARFARM_STATE": str(state), "GEARFARM_CONFIG": ""})
    took = time.monotonic() - start
    assert one_error(p) == (f"error: the embedded farm in {state} is not running (gearmand at {gearmand} does not "
                            "answer): start it with './nightly.bash --keep' (a nightly that leaves the farm running; "
                            "'gearfarm farm stop' stops it)"), p.stderr
    assert took < FAST, f"status took {took:.1f}s"


def test_version_is_the_installed_packages() -> None:
    p, _ = gearfarm_timed("--version")
    assert (p.returncode, p.stdout, p.stderr) == (0, f"gearfarm {metadata.version('gearfarm')}\n", ""), p
