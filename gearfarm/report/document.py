"""The run report: one document (JSON, HTML, text, JUnit) per run, i.e. per project of a
nightly, with its project, a headline, the matrix, the test cases classified against history
(new failures with their log tail and a reproducer, fixed, flaky, known), links to each job's log
(gearfarm.report.links: the dashboard, or the copies on disk), and
per-stage timings so the farm's own overhead shows. Written beside the run on disk and in S3.
The nightly's one mail is made from the reports of all its runs (mail_subject, render_mail_*):
for one run it is that run's report, for several one section per run, in the order given."""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader
from jinja2.bccache import Bucket
from markupsafe import Markup, escape
from pydantic import BaseModel, ConfigDict

from gearfarm.bisection import search as bisect
from gearfarm.db.cases import RunCases
from gearfarm.db.history import CaseVerdict
from gearfarm.db.results import NOT_RUN, Run
from gearfarm.formats.job import JobId
from gearfarm.formats.result import PRODUCT_FAILURES, ResultRecord
from gearfarm.formats.words import counted
from gearfarm.hosts import process
from gearfarm.perf import trend
from gearfarm.report.links import Links
from gearfarm.s3 import keys
from gearfarm.s3.store import ArtifactStore
from gearfarm.step import junit

STAGES = ("queue_wait", "export", "lookup", "build", "upload", "download", "verify", "test")
# The farm's own cost per job: moving and checking bytes. Queue wait is shown apart: it is
# mostly jobs waiting for a busy worker, i.e. capacity, not overhead.
OVERHEAD = ("export", "lookup", "upload", "download", "verify")
log = logging.getLogger(__name__)


class _CompiledTemplates(FileSystemBytecodeCache):
    """The templates' compiled code kept in the farm's cache (as the job supervisor's binary):
    compiling them was half of a 100-job night's report, 0.09 of 0.18 s, and every nightly is a
    new process (docs/speed.md, thirty-first round). Jinja's own cache, keyed by each template's
    name and checked against its source's checksum, so an edited template is compiled anew.
    Jinja raises where the directory cannot be written or a kept file is damaged; a report is
    never lost for its cache, so here the template is compiled as without one."""

    def __init__(self) -> None:
        super().__init__(str(process.cache_dir() / "templates"))

    def load_bytecode(self, bucket: Bucket) -> None:
        self.directory = str(process.cache_dir() / "templates")  # as the environment says now
        try:
            super().load_bytecode(bucket)
        except Exception as e:  # pickle and marshal of a damaged file raise many kinds
            log.warning("compiled template %s unreadable (%s): compiling it", bucket.key, e)
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError as e:
            log.warning("cannot keep compiled templates in %s (%s): each report compiles them", self.directory, e)


_env = Environment(loader=FileSystemLoader(Path(__file__).parents[1] / "templates"),
                   autoescape=lambda name: bool(name and name.endswith(".html.j2")),
                   trim_blocks=True, lstrip_blocks=True, bytecode_cache=_CompiledTemplates())
_env.filters["utc"] = lambda t: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
CASE_ORDER = ("passed", "failed", "error", "skipped")


def case_summary(counts: dict[str, int]) -> str:
    """Test cases by status, as a reader counts them: "162 passed, 1 skipped"."""
    return ", ".join(f"{counts[s]} {s}" for s in CASE_ORDER if counts.get(s))


_env.filters["cases"] = case_summary
_env.filters["counted"] = counted


Item = dict[str, Any]  # one row of a section (a failure, a classified test, a change): JSON as written


class Report(BaseModel):
    """One run's report, as written to report.json and read by the templates, the mail and the
    dashboard. Frozen: the parts added after the run's own (performance, bisections, late
    results, the farm's problems) make a new report (``with_*``), so no reader sees one change.
    The JSON holds the fields that were set: a report nobody added bisections to has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    project: str
    rev: str
    created_at: float
    finished_at: float
    wall_seconds: float
    headline: str
    all_green: bool
    counts: dict[str, int]
    targets: list[str]
    steps: list[str]
    matrix: dict[str, dict[str, Item]]  # target -> step -> its cell
    failures: list[Item]
    infra: list[Item]
    cancelled: list[Item]
    classified: bool
    new: list[Item]
    known: list[Item]
    fixed: list[Item]
    flaky: list[Item]
    links_base: str | None
    dashboard: str | None
    missing: list[str]
    stage_seconds: dict[str, float]
    target_seconds: dict[str, float]
    overhead_seconds: float
    queue_wait_seconds: float
    work_seconds: float
    jobs: list[Item]
    reruns: list[Item]
    subject: str = ""  # its own mail's subject and its HTML title
    summary: str = ""  # its part of a nightly mail's subject: "engine passed"
    performance: list[Item] | None = None
    perf_figures: list[Item] | None = None
    bisections: list[Item] | None = None
    late: list[Item] | None = None
    problems: list[str] | None = None
    # Why the project could not run at all tonight (its revision, its catalog, its snapshot:
    # gearfarm.run.nightly.ProjectError); set only for such a run, which has no jobs.
    not_run: str | None = None
    # Done to the farm from outside and undone (a queue limit a peer set, a build replaced in
    # S3): named first in the report and the mail, though the run may pass.
    alarms: list[str] = []

    def absent(self, target: str, step: str) -> str:
        """What a matrix cell without a result means: "missing" (the job was expected and has no
        result) or "n/a" (the step is not one of this target's)."""
        return "missing" if str(JobId(self.run_id, target, step)) in self.missing else "n/a"

    def titled(self) -> Report:
        """The report with its one-line titles made from its headline."""
        fixed = len(self.fixed)
        green = "passed" + (f", {fixed} fixed" if fixed else "")
        # (a project that could not run is one short part of a night's subject: its section says why)
        state = "could not run" if self.not_run else green if self.all_green else self.headline
        alarmed = f" ({counted(len(self.alarms), 'alarm')})" if self.alarms else ""
        return self.model_copy(update={
            "subject": f"[gearfarm] {self.project} {self.run_id} at {self.rev[:12]}: {self.headline}{alarmed}",
            "summary": f"{self.project} {state}{alarmed}"})

    def with_performance(self, entries: list[Item], figures: Sequence[Item] = ()) -> Report:
        """The performance section: the changes (``entries``; regressions also go into the
        headline) and the night's figures (gearfarm.perf.analysis.figures)."""
        rep = self.model_copy(update={"performance": entries, "perf_figures": list(figures)})
        regressions = sum(1 for e in entries if e["direction"] == "regression")
        if not regressions:
            return rep
        return rep.model_copy(update={
            "headline": f"{counted(regressions, 'performance regression')}, "
                        + self.headline.removeprefix("all green: "),
            "all_green": False}).titled()

    def with_late(self, late: list[tuple[float, ResultRecord]]) -> Report:
        """Results that arrived after the report was made: shown apart and marked, never mixed
        into the matrix the report and the mail were made from."""
        return self.model_copy(update={"late": [
            {"job_id": r.job_id, "target": r.target, "step": r.step, "status": r.status, "attempt": r.attempt,
             "worker": r.worker, "arrived_at": at, "message": r.message} for at, r in late]})

    def with_bisections(self, rows: Sequence[Any]) -> Report:
        """The bisections of the regressions the run found (gearfarm.db.results.Bisection rows,
        one per failure), each with its culprit, confidence and the evidence per revision, oldest
        revision first, and its group's: the failures of one range bisected together, with every
        failure's verdict at each revision the group judged."""
        rows = sorted(rows, key=lambda b: b.id)
        groups: dict[int, list[Any]] = {}
        for b in rows:
            groups.setdefault(b.group_id, []).append(b)
        evidence = {g: bisect.group_evidence([("/".join(str(v) for v in b.subject.values()), b.detail or {})
                                              for b in members]) for g, members in groups.items()}
        return self.model_copy(update={"bisections": [_bisection(b, len(groups[b.group_id]), evidence[b.group_id])
                                                      for b in rows]})

    def with_problems(self, problems: list[str]) -> Report:
        return self.model_copy(update={"problems": problems})

    def as_dict(self) -> dict[str, Any]:
        """The fields that were set (report.json, the dashboard's JSON)."""
        return self.model_dump(exclude_unset=True)


def image_cid(section: int, index: int) -> str:
    """The content id of a plot in the mail: the ``index``-th performance entry of the
    ``section``-th run, unique across the runs one message covers."""
    return f"perf{section}-{index}"


_env.globals["image_cid"] = image_cid
_env.globals["spark"] = trend.blocks
_env.globals["trend_svg"] = trend.svg


def build(run: Run, records: list[ResultRecord], links: Links | None = None,
          verdicts: list[CaseVerdict] | None = None, reruns: list[ResultRecord] | None = None,
          cases: RunCases | None = None) -> Report:
    """The report document. ``verdicts`` (gearfarm.db.history.classify_run) add the classified
    sections and the classified headline; ``reruns`` are the records of the run's re-run;
    ``links`` says where the logs are read (default: the copies beside the report); ``cases``
    the run's test cases as the database counts them (default: the records' own)."""
    links = links or Links()
    cases = cases or RunCases.of_records(records)

    by_target: dict[str, dict[str, ResultRecord]] = {}
    for r in records:
        by_target.setdefault(r.target, {})[r.step] = r
    recorded = {r.job_id for r in records}  # once: made per expected job, it cost jobs² on a big night
    missing = [j for j in run.expected if j not in recorded]
    # The matrix has a row for every target and a column for every step the run expected or
    # ran: a job whose result never came shows as "missing" in its cell (Report.absent), even
    # when no target has a result for its step.
    gone = [JobId.parse(j) for j in missing]
    steps = [s for _, _, s in sorted({(r.kind != "build", r.kind, r.step) for r in records}
                                     | {(j.kind != "build", j.kind, j.step) for j in gone})]
    matrix = {
        t: {s: {"status": r.status, "duration": r.duration, "log": links.log(r), "worker": r.worker,
                "reused_artifact": r.reused_artifact, "message": r.message,
                **({"cases": counts} if (counts := cases.counts.get(r.job_id)) else {})}
            for s, r in sorted(by_target.get(t, {}).items())}
        for t in sorted(set(by_target) | {j.target for j in gone})
    }
    failures = []
    for r in sorted(records, key=lambda r: r.job_id):
        if r.status in ("passed", "skipped", "cancelled"):
            continue
        bad_cases = cases.failing.get(r.job_id, [])
        failures.append({
            "target": r.target, "step": r.step, "status": r.status, "message": r.message,
            "log_tail": r.log_tail, "log": links.log(r), "artifact": links.artifact(r),
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
    classes = _classes(run, records, verdicts, reruns or [], links, cases) if verdicts is not None else None
    if classes is not None:
        new, known, flaky, fixed = (len(classes[k]) for k in ("new", "known", "flaky", "fixed"))
        lead = [counted(new, "new failure") if new else "", f"{known} still failing" if known else "",
                f"{flaky} flaky" if flaky else ""]
    else:
        lead, fixed = [f"{product_failed} failed" if product_failed else ""], 0
    cancelled = [{"target": r.target, "step": r.step, "message": r.message} for r in records if r.status == "cancelled"]
    green = not (any(lead) or infra or missing or cancelled)
    total: dict[str, int] = {}
    for per_job in cases.counts.values():
        for status, n in per_job.items():
            total[status] = total.get(status, 0) + n
    headline = _headline(green, lead, fixed, infra, missing, len(records), len(by_target), total)
    if cancelled:
        headline = ", ".join(x for x in (headline, f"{len(cancelled)} cancelled") if x)
    # A run whose project could not run (its notes say why): nothing of it ran, and that is its news.
    not_run = run.notes.get("error") if run.state == NOT_RUN and isinstance(run.notes, dict) else None
    if not_run:
        green, headline = False, f"could not run: {_first_line(not_run)}"
    alarms = [str(a) for a in (run.notes or {}).get("alarms", [])] if isinstance(run.notes, dict) else []
    alarms += [f"{r.target} {r.step}: {a}" for r in sorted(records, key=lambda r: r.job_id) for a in r.alarms]
    return Report(**{
        "alarms": alarms,
        "run_id": run.run_id, "project": run.project, "rev": run.rev, "created_at": run.created_at,
        "finished_at": finished, "wall_seconds": round(finished - run.created_at, 3), "headline": headline,
        "all_green": green, "counts": counts,
        "targets": sorted(matrix), "steps": steps, "matrix": matrix, "failures": failures,
        "infra": [f for f in failures if not f["product"]], "cancelled": cancelled,
        "classified": classes is not None,
        "new": classes["new"] if classes else [], "known": classes["known"] if classes else [],
        "fixed": classes["fixed"] if classes else [], "flaky": classes["flaky"] if classes else [],
        "links_base": links.base, "dashboard": links.run(run.run_id),
        "missing": missing, "stage_seconds": stage_totals, "target_seconds": _target_spans(records),
        "overhead_seconds": round(sum(stage_totals[s] for s in OVERHEAD), 3),
        "queue_wait_seconds": stage_totals["queue_wait"],
        "work_seconds": round(stage_totals["build"] + stage_totals["test"], 3),
        # Without their cases (the matrix counts them, junit.xml lists them): 200,000 of them
        # on a 5,000-job night made report.json 60 MB and the dashboard's JSON of the run 7 s.
        "jobs": [r.model_dump(mode="json", exclude={"log_tail", "cases"}) for r in records],
        "reruns": [r.model_dump(mode="json", exclude={"log_tail", "cases"}) for r in reruns or []],
        **({"not_run": not_run} if not_run else {}),
    }).titled()


def _first_line(text: str, most: int = 200) -> str:
    """A headline's part of a message: its first line, cut to ``most`` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= most else line[: most - 1] + "…"


def _target_spans(records: list[ResultRecord]) -> dict[str, float]:
    """Per target, from its build's submission to its last job's end: its wall time."""
    spans: dict[str, float] = {}
    by_target: dict[str, list[ResultRecord]] = {}
    for r in records:  # once, not once per target (targets × jobs)
        by_target.setdefault(r.target, [])
        if r.finished_at is not None:
            by_target[r.target].append(r)
    for t, rs in by_target.items():
        starts = [r.submitted_at or r.started_at for r in rs if (r.submitted_at or r.started_at)]
        if rs and starts:
            spans[t] = round(max(r.finished_at for r in rs if r.finished_at) - min(starts), 3)  # type: ignore[type-var]
    return spans


def _headline(green: bool, lead: list[str], fixed: int, infra: int, missing: list[str], jobs: int,
              targets: int, cases: dict[str, int]) -> str:
    """Headline first: what is broken (``lead``: new, still failing, flaky — or failed when
    the run is not classified), then fixed, then what the farm could not run; ``green`` when
    none of them is there, counting the test cases (what a reader counts), not the jobs."""
    bad = [p for p in lead if p]
    if green:
        where = f"{counted(jobs, 'job')} on {counted(targets, 'target')}"
        text = f"all green: {case_summary(cases)} cases in {where}" if cases else f"all green: {where} passed"
        return text + (f"; {fixed} fixed" if fixed else "")
    parts = bad + ([f"{fixed} fixed"] if fixed else [])
    parts += [f"{infra} not run by the farm (infrastructure)"] if infra else []
    parts += [f"{len(missing)} missing"] if missing else []
    return ", ".join(parts)


def _classes(run: Run, records: list[ResultRecord], verdicts: list[CaseVerdict], reruns: list[ResultRecord],
             links: Links, cases: RunCases) -> dict[str, list[dict[str, Any]]]:
    by_job = {r.job_id: r for r in records}
    rerun_of = {(r.target, r.step): r for r in reruns}
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in ("new", "known", "fixed", "flaky")}
    for v in verdicts:
        if v.kind not in out:
            continue
        rec = by_job.get(v.job_id)
        job_level = v.name.startswith("[")
        # A failing case's message; a passing one (fixed) says nothing, and the job speaks only
        # for itself ("[step]").
        case = next((c for c in cases.failing.get(rec.job_id, []) if c.name == v.name), None) if rec else None
        item = v.as_dict()
        item.update({
            "step": rec.step if rec else "", "status": rec.status if rec else "",
            "message": (case.message if case else (rec.message if rec and job_level else ""))[:2000],
            "worker": rec.worker if rec else "", "log": links.log(rec) if rec else None,
            "artifact": links.artifact(rec) if rec else None,
            "reproducer": reproducer(rec, run, None if job_level else v.name) if rec else "",
        })
        if v.kind in ("new", "flaky"):
            item["log_tail"] = rec.log_tail if rec else ""
        rr = rerun_of.get((v.target, rec.step)) if rec else None
        if rr is not None:
            # The test's own result on the re-run; the suite as a whole may fail for others.
            item["rerun_record"] = {"status": v.rerun or rr.status, "job_status": rr.status,
                                    "worker": rr.worker, "log": links.log(rr),
                                    "other_worker": bool(rr.worker) and rr.worker != item["worker"]}
        out[v.kind].append(item)
    return out


def reproducer(r: ResultRecord, run: Run, test: str | None = None) -> str:
    """One line that names everything needed to run the failure again."""
    if r.kind == "build":
        return f"gearfarm nightly --project {run.project} --rev {run.rev[:12]} --targets {r.target} --suites none"
    seed = run.notes.get("seed") if isinstance(run.notes, dict) else None
    line = f"target={r.target} artifact={r.artifact_key} sha256={r.artifact_sha256} suite={r.name}"
    if test:
        line += f" test={test}"
    return line + (f" seed={seed}" if seed is not None else "")


def _run_html(report: Report, mail: bool, section: int, prefix: str) -> Markup:
    base = (report.links_base or "") if mail else ""
    return Markup(_env.get_template("run.html.j2").render(r=report, mail=mail, section=section, pre=prefix,
                                                           base=base))


def render_html(report: Report, mail: bool = False) -> str:
    """The HTML report of one run; ``mail`` refers to plots as inline PNG parts (mail_images),
    since mail clients do not show inline SVG, while the file embeds the SVG itself."""
    return _env.get_template("report.html.j2").render(title=report.subject, heading=None,
                                                      sections=[_run_html(report, mail, 0, "")])


def render_text(report: Report) -> str:
    """The text report of one run: the mail's text part and the console summary."""
    return _env.get_template("report.txt.j2").render(r=report)


def mail_subject(reports: Sequence[Report]) -> str:
    """The subject of the message covering ``reports``: a single run's own subject, or every
    project's summary in order ("gearfarm nightly: engine 2 new failures; zlibish passed")."""
    if len(reports) == 1:
        return reports[0].subject
    return "gearfarm nightly: " + "; ".join(r.summary for r in reports)


def render_mail_html(reports: Sequence[Report]) -> str:
    """The message's HTML part: the run's report, or for several runs the subject as heading
    and one section per run (its report, ids prefixed by its project), in the order given."""
    if len(reports) == 1:
        return render_html(reports[0], mail=True)
    subject = mail_subject(reports)
    sections = [_run_html(r, True, i, f"{r.project}-") for i, r in enumerate(reports)]
    return _env.get_template("report.html.j2").render(title=subject, heading=subject, sections=sections)


def render_mail_text(reports: Sequence[Report]) -> str:
    """The message's text part: the run's text report, or for several runs the subject and each
    run's text report after a rule, in the order given."""
    if len(reports) == 1:
        return render_text(reports[0])
    rule = "=" * 72
    return mail_subject(reports) + "\n" + "".join(f"\n{rule}\n{render_text(r)}" for r in reports)


def mail_images(reports: Sequence[Report]) -> dict[str, bytes]:
    """Content id -> PNG of every plot the message's HTML part refers to."""
    return {image_cid(i, j): base64.b64decode(e["png_b64"])
            for i, r in enumerate(reports) for j, e in enumerate(r.performance or [])}


def write(report: Report, records: list[ResultRecord], out_dir: Path, cases: RunCases | None = None
          ) -> dict[str, Path]:
    """The report files on disk; they never depend on S3 or the database being up (``cases``:
    as given to ``build``, read again here for every case of junit.xml)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "html": out_dir / "report.html", "txt": out_dir / "report.txt",
             "junit": out_dir / "junit.xml"}
    plain = report.as_dict()
    plain["performance"] = [{k: v for k, v in e.items() if k not in ("svg", "png_b64")}
                            for e in report.performance or []]
    # Compact: json's C encoder serves no indent, and the pure-Python one took 3 of a 1,000-job
    # report's 7 seconds (40,000 cases; docs/speed.md). `jq .` indents it for a reader.
    paths["json"].write_text(json.dumps(plain, sort_keys=True, default=str, separators=(",", ":")))
    paths["html"].write_text(render_html(report))
    paths["txt"].write_text(render_text(report))
    junit.write_run(records, paths["junit"], (cases or RunCases.of_records(records)).every(),
                    (report.project, report.not_run) if report.not_run else None)
    return paths


def upload(report: Report, paths: dict[str, Path], store: ArtifactStore) -> None:
    for ext, ctype in (("json", "application/json"), ("html", "text/html; charset=utf-8"),
                       ("txt", "text/plain; charset=utf-8")):
        store.put_file(keys.report(report.run_id, ext), paths[ext], ctype)


def _bisection(b: Any, group_size: int, group_evidence: list[Item]) -> Item:
    d = b.detail or {}
    return {
        "id": b.id, "group": b.group_id, "group_size": group_size, "group_evidence": group_evidence,
        "kind": b.kind, "target": b.target, "what": "/".join(str(v) for v in b.subject.values()),
        "state": b.state, "good_rev": b.good_rev, "bad_rev": b.bad_rev,
        "commits": max(len(d.get("revs", [])) - 1, 0),
        "culprit": b.culprit_rev, "culprit_subject": d.get("subject", ""), "author": d.get("author", ""),
        "confidence": d.get("confidence"), "message": d.get("message", ""), "builds": d.get("builds", 0),
        "jobs": d.get("jobs", 0), "suspects": d.get("suspects", []),
        "evidence": [{"rev": e["rev"], "verdict": e["verdict"], "built": bool(e.get("built")),
                      "figures": bisect.evidence_line(e)}
                     for e in bisect.ordered_evidence(d)],
    }


def bisection_subject(reports: Sequence[Report]) -> str:
    """The follow-up message's subject: the culprits found, each with its test or benchmark (or
    how many failures of its group it broke) and target."""
    culprits: dict[tuple[int, str], list[Item]] = {}
    for b in (b for r in reports for b in r.bisections or []):
        if b["culprit"]:
            culprits.setdefault((b["group"], b["culprit"]), []).append(b)
    found = [f"{bs[0]['what'] if len(bs) == 1 else counted(len(bs), 'failure')} on {bs[0]['target']}: {c[:10]}"
             for (_, c), bs in culprits.items()]
    done = len({b["group"] for r in reports for b in r.bisections or []})
    runs = ", ".join(r.run_id for r in reports)
    return f"gearfarm bisection ({runs}): " + ("; ".join(found) or f"no culprit in {counted(done, 'bisection')}")


def render_bisection_text(reports: Sequence[Report]) -> str:
    """The follow-up message's text: each run's bisections, under its project and run."""
    return bisection_subject(reports) + "\n" + "".join(
        f"\n{r.project}: run {r.run_id} at {r.rev[:12]}\n" + _env.get_template("bisection.txt.j2").render(r=r)
        for r in reports if r.bisections)


def render_bisection_html(reports: Sequence[Report]) -> str:
    subject = bisection_subject(reports)
    sections = [Markup(f"<h2>{escape(r.project)}: run {escape(r.run_id)}</h2>")
                + Markup(_env.get_template("bisection.html.j2").render(r=r, pre=f"{r.project}-", base=""))
                for r in reports if r.bisections]
    return _env.get_template("report.html.j2").render(title=subject, heading=subject, sections=sections)
