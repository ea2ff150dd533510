"""The schema as it was before migrations: runs, jobs, cases, samples. A database created then
(by create_all) is stamped with this revision and upgraded from it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(96), primary_key=True),
        sa.Column("rev", sa.String(40), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("expected", sa.JSON, nullable=False),
        sa.Column("targets", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("notes", sa.JSON, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(96), sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("step", sa.String(80), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("record", sa.JSON, nullable=False),
    )
    op.create_index("ix_jobs_run_id", "jobs", ["run_id"])
    op.create_table(
        "cases",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(200), sa.ForeignKey("jobs.job_id"), nullable=False),
        sa.Column("run_id", sa.String(96), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("suite", sa.String(64), nullable=False),
        sa.Column("classname", sa.String(200), nullable=False),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_cases_job_id", "cases", ["job_id"])
    op.create_index("ix_cases_run_id", "cases", ["run_id"])
    op.create_index("ix_cases_name", "cases", ["name"])
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(200), sa.ForeignKey("jobs.job_id"), nullable=False),
        sa.Column("run_id", sa.String(96), nullable=False),
        sa.Column("rev", sa.String(40), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("host_class", sa.String(64), nullable=False),
        sa.Column("benchmark", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("variant", sa.String(16), nullable=False),
        sa.Column("repetition", sa.Integer, nullable=False),
        sa.Column("value", sa.Float, nullable=False),
    )
    op.create_index("ix_samples_job_id", "samples", ["job_id"])
    op.create_index("ix_samples_run_id", "samples", ["run_id"])


def downgrade() -> None:
    for t in ("samples", "cases", "jobs", "runs"):
        op.drop_table(t)
