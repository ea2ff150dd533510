"""Hosts (the fingerprint a job ran on), re-runs linked to their run, and the indexes history
reads by (runs by time, a case on a target across runs).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("host_id", sa.String(64), primary_key=True),
        sa.Column("hostname", sa.String(200), nullable=False),
        sa.Column("host_class", sa.String(64), nullable=False),
        sa.Column("cpu_model", sa.String(200), nullable=False),
        sa.Column("cores", sa.Integer, nullable=False),
        sa.Column("memory_gib", sa.Integer, nullable=False),
        sa.Column("kernel", sa.String(200), nullable=False),
        sa.Column("machine", sa.String(64), nullable=False),
        sa.Column("compiler", sa.String(300), nullable=False),
        sa.Column("first_seen", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )
    op.create_index("ix_hosts_host_class", "hosts", ["host_class"])
    # Batch mode: SQLite cannot add a foreign key to an existing table, so alembic rebuilds it.
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("parent_run_id", sa.String(96), nullable=True))
        b.create_index("ix_runs_parent_run_id", ["parent_run_id"])
        b.create_index("ix_runs_created_at", ["created_at"])
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("host_id", sa.String(64), nullable=True))
        b.create_foreign_key("fk_jobs_host_id_hosts", "hosts", ["host_id"], ["host_id"])
    op.create_index("ix_cases_target_suite_name", "cases", ["target", "suite", "name"])


def downgrade() -> None:
    op.drop_index("ix_cases_target_suite_name", "cases")
    with op.batch_alter_table("jobs") as b:
        b.drop_constraint("fk_jobs_host_id_hosts", type_="foreignkey")
        b.drop_column("host_id")
    with op.batch_alter_table("runs") as b:
        b.drop_index("ix_runs_created_at")
        b.drop_index("ix_runs_parent_run_id")
        b.drop_column("parent_run_id")
    op.drop_index("ix_hosts_host_class", "hosts")
    op.drop_table("hosts")
