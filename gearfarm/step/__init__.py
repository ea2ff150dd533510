"""Running one catalog step of a job: the command in its sandbox under its reaper, its own wine
prefix, and reading what it says (test cases, metrics, JUnit)."""
