"""Projects: every run belongs to one project (the runs made before belong to "engine"), and
records the job catalog it ran with, stored once per content (sha256) in its own table.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "catalogs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    # The literal, not gearfarm.db.results.DEFAULT_PROJECT: a migration stays what it was when written.
    # The server default is what marks every existing run as the engine's.
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("project", sa.String(64), nullable=False, server_default="engine"))
        b.add_column(sa.Column("catalog_sha256", sa.String(64), nullable=True))
        b.create_index("ix_runs_project", ["project"])
        b.create_foreign_key("fk_runs_catalog_sha256_catalogs", "catalogs", ["catalog_sha256"], ["sha256"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_constraint("fk_runs_catalog_sha256_catalogs", type_="foreignkey")
        b.drop_index("ix_runs_project")
        b.drop_column("catalog_sha256")
        b.drop_column("project")
    op.drop_table("catalogs")
