#!/usr/bin/env bash
# Runs one whole nightly: sets up what is missing for this host's role (the shared `make setup-*`
# step), then builds, tests and reports every target. With no config it starts an embedded farm
# on loopback (role: embedded); with --config FILE or $GEARFARM_CONFIG it submits to the
# configured lab farm, and this host needs only git and the package (role: nightly).
# Exit status: 0 all passed, 1 some build or test failed, 2 the farm itself could not run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
role=embedded
[ -n "${GEARFARM_CONFIG:-}" ] && role=nightly
for arg in "$@"; do
  case "$arg" in --config|--config=*) role=nightly;; esac
done
if ! command -v make >/dev/null; then
  echo "error: make is missing; install it (as root: apt-get install make) and run ./nightly.bash again" >&2
  exit 2
fi
if ! make -s -C "$here" "setup-$role" >&2; then
  echo "error: setup failed (see above); fix it and run ./nightly.bash again" >&2
  exit 2
fi
cd "$here"
exec "$here/.venv/bin/gearfarm" nightly "$@"
