"""One night's run: planning and submitting its jobs, watching them (the ledger applies every
record), source snapshots, the order slots take jobs, retention, and the embedded farm."""
