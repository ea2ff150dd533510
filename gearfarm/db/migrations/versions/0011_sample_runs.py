"""Indexes of samples by run and series, and of runs by project (or parent) and time: the
dashboard's run and compare pages read each series' last nights by run id (perf_series); through
the series index alone they read every night of the series: at 1,000 nights a run page took 4.7 s.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_samples_run_series", "samples", ["run_id", "target", "benchmark", "metric"])
    # ... and a project's runs newest first, so that reading stops at the window's LIMIT.
    op.create_index("ix_runs_project_created_at", "runs", ["project", "created_at"])
    # ... and the nightly runs (parent_run_id IS NULL) newest first: the status, runs and hosts pages.
    op.create_index("ix_runs_parent_created_at", "runs", ["parent_run_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_parent_created_at", table_name="runs")
    op.drop_index("ix_runs_project_created_at", table_name="runs")
    op.drop_index("ix_samples_run_series", table_name="samples")
