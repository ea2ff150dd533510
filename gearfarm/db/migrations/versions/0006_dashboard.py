"""The dashboard's tables: detected regressions with their triage state and its trail, and
the users allowed to change things from the browser.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(400), nullable=False),
        sa.Column("first_bad_run", sa.String(96), nullable=False),
        sa.Column("first_bad_rev", sa.String(40), nullable=False),
        sa.Column("last_good_rev", sa.String(40), nullable=True),
        sa.Column("detected_at", sa.Float, nullable=False),
        sa.Column("detail", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_by", sa.String(64), nullable=False),
        sa.Column("state_note", sa.Text, nullable=False),
        sa.Column("state_at", sa.Float, nullable=True),
        sa.UniqueConstraint("kind", "project", "target", "subject", "first_bad_rev", name="uq_regression"),
    )
    op.create_index("ix_regressions_project", "regressions", ["project"])
    op.create_index("ix_regressions_first_bad_run", "regressions", ["first_bad_run"])
    op.create_index("ix_regressions_detected_at", "regressions", ["detected_at"])
    op.create_table(
        "triage_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("regression_id", sa.Integer, sa.ForeignKey("regressions.id"), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_triage_events_regression_id", "triage_events", ["regression_id"])
    op.create_table(
        "web_users",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("web_users")
    op.drop_index("ix_triage_events_regression_id", "triage_events")
    op.drop_table("triage_events")
    op.drop_index("ix_regressions_detected_at", "regressions")
    op.drop_index("ix_regressions_first_bad_run", "regressions")
    op.drop_index("ix_regressions_project", "regressions")
    op.drop_table("regressions")
