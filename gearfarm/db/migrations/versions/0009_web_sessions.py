"""The dashboard's sessions, kept on the server: a logged-in browser's cookie carries a random
id whose sha256 is a row here, so logging out (deleting the row) ends the session for every
copy of the cookie.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(64), sa.ForeignKey("web_users.name"), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_web_sessions_user", "web_sessions", ["user"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_user", "web_sessions")
    op.drop_table("web_sessions")
