"""A partial index of the failing test cases by run: classifying a night reads the failing cases
of each of its 100 earlier runs; through the run index it read every case of them (200,000 a
night for a 5,000-job night, 20 million for its history).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
# As gearfarm.db.results.FAILING_SQL was when this revision was made (a revision never changes).
FAILING_SQL = "status IN ('failed', 'error')"


def upgrade() -> None:
    op.create_index("ix_cases_failing", "cases", ["run_id"], postgresql_where=sa.text(FAILING_SQL),
                    sqlite_where=sa.text(FAILING_SQL))


def downgrade() -> None:
    op.drop_index("ix_cases_failing", table_name="cases")
