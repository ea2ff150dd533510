"""Bisections: one row per search for the commit that broke a test or moved a benchmark, with
its range, its state, the culprit when found and the evidence (every revision judged).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bisections",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.JSON, nullable=False),
        sa.Column("good_rev", sa.String(40), nullable=False),
        sa.Column("bad_rev", sa.String(40), nullable=False),
        sa.Column("origin_run_id", sa.String(96), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("culprit_rev", sa.String(40), nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index("ix_bisections_origin_run_id", "bisections", ["origin_run_id"])
    op.create_index("ix_bisections_project", "bisections", ["project"])


def downgrade() -> None:
    op.drop_index("ix_bisections_project", "bisections")
    op.drop_index("ix_bisections_origin_run_id", "bisections")
    op.drop_table("bisections")
