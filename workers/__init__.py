"""Worker roles: build, test, perf and the collector, each a Gearman worker."""
