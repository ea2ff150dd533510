"""The run ledger: precedence columns on jobs (prio, digest), the run's report time and
deadline, late results, and the delivery log.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("prio", sa.Integer, nullable=False, server_default="0"))
        b.add_column(sa.Column("digest", sa.String(64), nullable=False, server_default=""))
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("reported_at", sa.Float, nullable=True))
        b.add_column(sa.Column("deadline", sa.Float, nullable=True))
    # Rows written before the ledger: product results rank above farm-made ones, as now.
    op.execute("UPDATE jobs SET prio = 1 WHERE status IN ('passed', 'failed', 'timed_out')")
    op.execute("UPDATE runs SET reported_at = finished_at WHERE finished_at IS NOT NULL")
    op.create_table(
        "late_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(200), nullable=False, index=True),
        sa.Column("run_id", sa.String(96), nullable=False, index=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("arrived_at", sa.Float, nullable=False),
        sa.UniqueConstraint("job_id", "digest", name="uq_late_result"),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False, index=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False, index=True),
        sa.Column("job_id", sa.String(200), nullable=True, index=True),
        sa.Column("run_id", sa.String(96), nullable=True, index=True),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("status", sa.String(16), nullable=True),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deliveries")
    op.drop_table("late_results")
    with op.batch_alter_table("runs") as b:
        b.drop_column("deadline")
        b.drop_column("reported_at")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("digest")
        b.drop_column("prio")
