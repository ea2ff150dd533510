"""Performance annotations: a change a user marked as expected stops being reported.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "perf_annotations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("benchmark", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("rev", sa.String(40), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("benchmark", "metric", "target", "rev", name="uq_perf_annotation"),
    )
    op.create_index("ix_samples_series", "samples", ["target", "benchmark", "metric"])


def downgrade() -> None:
    op.drop_index("ix_samples_series", "samples")
    op.drop_table("perf_annotations")
