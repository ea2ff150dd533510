"""The run report: one document (JSON, HTML, JUnit) with the matrix, every failure with its
log tail and a reproducer, presigned links, and per-stage timings so the farm's own overhead
shows. Written beside the run on disk and in S3."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader

from gearfarm import junit
from gearfarm.result import PRODUCT_FAILURES, ResultRecord
from gearfarm.store import Run
from s3 import keys
from s3.store import ArtifactStore

STAGES = ("queue_wait", "export", "lookup", "build", "upload", "download", "verify", "test")
OVERHEAD = ("queue_wait", "export", "lookup", "upload", "download", "verify")
_env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                   autoescape=lambda name: bool(name and name.endswith(".html.j2")), trim_blocks=True, lstrip_blocks=True)


def build(run: Run, records: list[ResultRecord], store: ArtifactStore | None) -> dict[str, Any]:
    def link(key: str | None) -> str | None:
        return store.presign(key) if (store and key) else None

    by_target: dict[str, dict[str, ResultRecord]] = {}
    for r in records:
        by_target.setdefault(r.target, {})[r.step] = r
    steps: list[str] = []
    for r in sorted(records, key=lambda r: (r.kind != "build", r.kind, r.step)):
        if r.step not in steps:
            steps.append(r.step)
    missing = [j for j in run.expected if j not in {r.job_id for r in records}]
    matrix = {
        t: {s: {"status": r.status, "duration": r.duration, "log": link(r.log_key), "worker": r.worker,
                "reused_artifact": r.reused_artifact, "message": r.message}
            for s, r in sorted(cells.items())}
        for t, cells in sorted(by_target.items())
    }
    failures = []
    for r in sorted(records, key=lambda r: r.job_id):
        if r.status == "passed" or r.status == "skipped":
            continue
        bad_cases = [c for c in r.cases if c.status in ("failed", "error")]
        failures.append({
            "target": r.target, "step": r.step, "status": r.status, "message": r.message,
            "log_tail": r.log_tail, "log": link(r.log_key), "artifact": link(r.artifact_key),
            "cases": [{"name": c.name, "classname": c.classname, "message": c.message[:2000]} for c in bad_cases],
            "reproducer": reproducer(r, run),
            "product": r.status in PRODUCT_FAILURES,
        })
    stage_totals = {s: round(sum(r.timings.get(s, 0.0) for r in records), 3) for s in STAGES}
    finished = run.finished_at or time.time()
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    product_failed = sum(1 for f in failures if f["product"])
    infra = len(failures) - product_failed
    if not failures and not missing:
        headline = f"all green: {len(records)} jobs passed or skipped on {len(by_target)} targets"
    else:
        parts = []
        if product_failed:
            parts.append(f"{product_failed} failed")
        if infra:
            parts.append(f"{infra} not run by the farm (infrastructure)")
        if missing:
            parts.append(f"{len(missing)} missing")
        headline = ", ".join(parts)
    return {
        "run_id": run.run_id, "rev": run.rev, "created_at": run.created_at, "finished_at": finished,
        "wall_seconds": round(finished - run.created_at, 3), "headline": headline, "counts": counts,
        "targets": sorted(by_target), "steps": steps, "matrix": matrix, "failures": failures,
        "missing": missing, "stage_seconds": stage_totals,
        "overhead_seconds": round(sum(stage_totals[s] for s in OVERHEAD), 3),
        "work_seconds": round(stage_totals["build"] + stage_totals["test"], 3),
        "jobs": [r.model_dump(mode="json", exclude={"log_tail"}) for r in records],
    }


def reproducer(r: ResultRecord, run: Run) -> str:
    if r.kind == "build":
        return f"gearfarm nightly --rev {run.rev[:12]} --targets {r.target} --suites none"
    seed = run.notes.get("seed", 1) if isinstance(run.notes, dict) else 1
    return (f"target={r.target} artifact={r.artifact_key} sha256={r.artifact_sha256} suite={r.name} "
            f"seed={seed}")


def render_html(report: dict[str, Any]) -> str:
    return _env.get_template("report.html.j2").render(r=report)


def render_text(report: dict[str, Any]) -> str:
    return _env.get_template("report.txt.j2").render(r=report)


def write(report: dict[str, Any], records: list[ResultRecord], out_dir: Path,
          store: ArtifactStore | None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html", "txt": out_dir / "report.txt",
             "junit": out_dir / "junit.xml"}
    paths["json"].write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    paths["html"].write_text(render_html(report))
    paths["txt"].write_text(render_text(report))
    junit.write_run(records, paths["junit"])
    if store is not None:
        for ext, ctype in (("json", "application/json"), ("html", "text/html; charset=utf-8"),
                           ("txt", "text/plain; charset=utf-8")):
            store.put_file(keys.report(report["run_id"], ext), paths[ext], ctype)
    return paths
