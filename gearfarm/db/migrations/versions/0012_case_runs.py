"""An index of test cases by name and run: a test's page reads one case in the newest 200 runs;
through the name index alone it read the case in every night (10,000 rows at 1,000 nights for
the 2,000 it shows).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_cases_name_run", "cases", ["name", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_cases_name_run", table_name="cases")
