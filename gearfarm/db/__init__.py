"""The results database: its tables and queries (results), the registry of host keys, dashboard
accounts, each test's history and people's triage; migrations (Alembic) beside them."""
