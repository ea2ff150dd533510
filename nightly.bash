#!/usr/bin/env bash
# Runs one whole nightly: sets up what is missing (the shared `make setup` step), then builds,
# tests and reports every target. With no config it starts an embedded farm on loopback;
# with --config FILE or $GEARFARM_CONFIG it submits to the configured lab farm.
# Exit status: 0 all passed, 1 some build or test failed, 2 the farm itself could not run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! make -s -C "$here" setup >&2; then
  echo "error: setup failed (see above); fix it and run ./nightly.bash again" >&2
  exit 2
fi
cd "$here"
exec "$here/.venv/bin/gearfarm" nightly "$@"
