"""Where the report's and the mail's links point: to the dashboard when the farm has one
([web] url), else to the copies of the logs on disk beside the report (gearfarm.report.joblog), which
outlive the embedded farm's MinIO. Never to presigned S3 URLs: those die with the MinIO that
signed them (on the embedded default, the next morning) or after their expiry."""

from __future__ import annotations

from pathlib import Path

from gearfarm.formats.result import ResultRecord
from gearfarm.report import joblog


class Links:
    """Links relative to the report's run directory on disk: logs/<target>/<step>/log.txt."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_id = run_dir.name if run_dir is not None else None
        # What a relative link is relative to, for a reader that is not the report file itself
        # (the mail says it as <base href>).
        self.base = run_dir.resolve().as_uri() + "/" if run_dir is not None else None

    def log(self, rec: ResultRecord) -> str | None:
        return joblog.link(rec, self.run_id or rec.run_id) if rec.log_key else None

    def artifact(self, rec: ResultRecord) -> str | None:
        return None  # binaries are not copied to disk; the reproducer names the S3 key

    def run(self, run_id: str) -> str | None:
        return None


class DashboardLinks(Links):
    """Links into the dashboard at ``url`` (absolute, or "/" for its own pages)."""

    def __init__(self, url: str) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.base = None

    def log(self, rec: ResultRecord) -> str | None:
        # The step's page (numbered lines, search, the run around it); the raw log is linked there.
        return f"{self.url}run/{rec.run_id}/step/{rec.target}/{rec.step}" if rec.log_key else None

    def artifact(self, rec: ResultRecord) -> str | None:
        return f"{self.url}run/{rec.run_id}/artifact/{rec.target}/{rec.step}" if rec.artifact_key else None

    def run(self, run_id: str) -> str | None:
        return f"{self.url}run/{run_id}"


def for_run(web_url: str | None, run_dir: Path) -> Links:
    return DashboardLinks(web_url) if web_url else Links(run_dir)
