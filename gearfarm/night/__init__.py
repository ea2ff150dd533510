"""The night: its sequence from the first check to the exit status, and what follows it (bisection
of what the reports found, the follow-up mail)."""
