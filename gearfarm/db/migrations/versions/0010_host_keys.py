"""The registry of worker hosts' public keys (gearfarm.db.registry): who may sign which records; and
the leases of job attempts (gearfarm.formats.lease): which host holds each, and its signed beats.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_keys",
        sa.Column("kid", sa.String(16), primary_key=True),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("roles", sa.JSON, nullable=False),
        sa.Column("targets", sa.JSON, nullable=False),
        sa.Column("added_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
    )
    op.create_index("ix_host_keys_host", "host_keys", ["host"])
    op.create_table(
        "leases",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("kid", sa.String(16), nullable=False),
        sa.Column("host", sa.String(64), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("run_id", sa.String(96), nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.Column("beat_at", sa.Float, nullable=False),
        sa.Column("beats", sa.Integer, nullable=False),
        sa.Column("done", sa.Boolean, nullable=False),
    )
    op.create_index("ix_leases_run_id", "leases", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_leases_run_id", "leases")
    op.drop_table("leases")
    op.drop_index("ix_host_keys_host", "host_keys")
    op.drop_table("host_keys")
