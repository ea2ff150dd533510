"""The exit status of `gearfarm nightly`, `nightly.bash` and the other commands that judge a run:
cron, CI and the systemd units read it, so it is defined once."""

EXIT_OK = 0  # every job passed
EXIT_FAILED = 1  # a job failed, an expected job has no result, or a project could not run (its catalog)
EXIT_FARM = 2  # the farm itself had a problem (unreachable, misconfigured, a report not written)
