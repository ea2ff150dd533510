"""Alembic migrations of the results database (configured in code by gearfarm.db.results)."""
