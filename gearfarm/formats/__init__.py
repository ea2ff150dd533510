"""What crosses a process boundary, each defined once: the signed envelope (seal), job payloads
(job), result records (result), a project's catalog, the nightly's markers, leases and build
provenance. Lowest of the farm's own packages: it reads no config and starts nothing."""
