"""The results database: its tables and queries (results), the registry of host keys, dashboard
accounts, each test's history and people's triage; migrations (Alembic) beside them."""


class DatabaseUnavailable(RuntimeError):
    """The results database (a lab's PostgreSQL) did not answer; the message says which and how
    to start it. Here, not in results.py, so the command line can catch it without importing
    SQLAlchemy for every command."""
