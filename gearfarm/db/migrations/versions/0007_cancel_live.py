"""Cancel requests (a run or one job, by whom) and the live state of unfinished jobs as the
nightly sees them (waiting, queued, running), for the dashboard's live page.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cancellations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(96), nullable=False),
        sa.Column("job_id", sa.String(200), nullable=True),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "job_id", name="uq_cancellation"),
    )
    op.create_index("ix_cancellations_run_id", "cancellations", ["run_id"])
    op.create_table(
        "live_jobs",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(96), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )
    op.create_index("ix_live_jobs_run_id", "live_jobs", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_live_jobs_run_id", "live_jobs")
    op.drop_table("live_jobs")
    op.drop_index("ix_cancellations_run_id", "cancellations")
    op.drop_table("cancellations")
