"""The dashboard's compare on a history of bench/web_speed.py's shape: a run against itself is
"same" everywhere with no colour; a planted 10 % slowdown is "different", red, with its
interval; runs are picked from lists (B the latest, A the one before it) or named by revision."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gearfarm.config import Config, DatabaseConfig, FarmConfig, S3Config
from gearfarm.db.results import JobRow, ResultsDB
from gearfarm.hosts.net import free_port
from gearfarm.web.app import create_app
from tests.farmkit import bench_module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[str], ResultsDB]:
    where = tmp_path_factory.mktemp("compare")
    url = f"sqlite:///{where / 'results.db'}"
    db = ResultsDB(url)
    run_ids = bench_module("web_speed").populate(db, 12)
    # Plant a 10 % slowdown of one figure in the last run: oltp tps on one target.
    with db.writing() as conn:
        jid = f"{run_ids[-1]}:linux-t00:perf-oltp"
        record = conn.execute(JobRow.__table__.select().where(JobRow.job_id == jid)).one().record
        for s in record["samples"]:
            if s["metric"] == "tps" and s["variant"] == "new":
                s["value"] = s["value"] * 0.9 / (1.05 if len(run_ids) * 0.8 < len(run_ids) - 1 else 1.0)
        conn.execute(JobRow.__table__.update().where(JobRow.job_id == jid).values(record=record))
    cfg = Config(database=DatabaseConfig(url=url), s3=S3Config(endpoint=f"http://127.0.0.1:{free_port()}"),
                 farm=FarmConfig(state_dir=str(where / "state")))
    return create_app(cfg, db).test_client(), run_ids, db


def test_a_run_compared_with_itself_is_the_same_everywhere_and_uncoloured(site: tuple[Any, list[str], Any]) -> None:
    client, run_ids, _db = site
    last = run_ids[-1]
    data = client.get(f"/api/compare?a={last}&b={last}").get_json()
    assert data["figures"] and {f["verdict"] for f in data["figures"]} == {"same"}
    assert all(f["better"] is None and f["change"] == 0 for f in data["figures"])
    html = client.get(f"/compare?a={last}&b={last}").get_data(as_text=True)
    figures = html[html.index('id="figures"'):html.index("</table>", html.index('id="figures"'))]
    assert "regression" not in figures and "improvement" not in figures and "= same" in figures


def test_a_planted_slowdown_is_different_and_red_with_its_interval(site: tuple[Any, list[str], Any]) -> None:
    client, run_ids, _db = site
    a, b = run_ids[-2], run_ids[-1]
    data = client.get(f"/api/compare?a={a}&b={b}").get_json()
    tps = next(f for f in data["figures"] if (f["target"], f["benchmark"], f["metric"]) == ("linux-t00", "oltp", "tps"))
    assert tps["verdict"] == "different" and tps["better"] is False
    assert tps["ci_low"] < tps["change"] < tps["ci_high"] < -0.02 and -0.16 < tps["change"] < -0.04
    html = client.get(f"/compare?a={a}&b={b}").get_data(as_text=True)
    row = re.search(r'<tr data-verdict="different">(?:(?!</tr>).)*?linux-t00</td><td>oltp</td><td>tps</td>.*?</tr>',
                    html, re.S)
    assert row is not None, html
    assert 'class="regression interval"' in row.group(0) and "▼ worse: different" in row.group(0)
    # Noise alone between two ordinary nights: never coloured unless the interval says so.
    for f in data["figures"]:
        if f["verdict"] != "different":
            assert f["better"] is None


def test_compare_picks_runs_from_lists_and_takes_a_revision(site: tuple[Any, list[str], ResultsDB]) -> None:
    client, run_ids, db = site
    page = client.get("/compare")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert re.search(rf'<select name="b" id="pick-b">.*?<option value="{run_ids[-1]}" selected>', html, re.S)
    assert re.search(rf'<select name="a" id="pick-a">.*?<option value="{run_ids[-2]}" selected>', html, re.S)
    picked = client.get("/api/compare").get_json()
    assert picked["picking"] and picked["b"]["run_id"] == run_ids[-1] and picked["a"]["run_id"] == run_ids[-2]
    rev = db.get_run(run_ids[3]).rev  # type: ignore[union-attr]
    by_rev = client.get(f"/api/compare?a={rev[:10]}&b={run_ids[-1]}").get_json()
    assert by_rev["a"]["run_id"] == run_ids[3] and not by_rev["picking"]
    assert client.get("/api/compare?a=nosuch&b=nosuch").status_code == 404
