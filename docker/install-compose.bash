#!/usr/bin/env bash
# Builds the Docker Compose CLI (docker/compose v2, the `docker compose` plugin, which also runs
# on its own as `docker-compose`) from the Go module proxy at a pinned version into the cache,
# for tests/farm/test_compose.py's check that Docker Compose accepts docker/compose.yaml as
# podman-compose does. Optional: no registry here serves Docker, and the build is not cheap
# (about 10 minutes on 2 cores, a 96 MB binary, about 1 GB of modules), so `make setup` does not
# run it; the test skips its Docker part, saying so, when no Docker Compose CLI is there.
# Needs a Go >= 1.24: $GEARFARM_GO, else the one s3/install-minio.bash keeps in the cache, else
# `go` on PATH. Prints the binary's path.
set -euo pipefail

COMPOSE_PIN="${COMPOSE_PIN:-v2.40.3}"
CACHE="${GEARFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gearfarm}"
dir="$CACHE/tools/docker-compose-$COMPOSE_PIN"
if [ -x "$dir/bin/docker-compose" ]; then
  echo "$dir/bin/docker-compose"
  exit 0
fi
go="${GEARFARM_GO:-}"
if [ -z "$go" ]; then
  go=$(ls -d "$CACHE"/tools/go-*/bin/go 2>/dev/null | sort -V | tail -1 || true)
fi
if [ -z "$go" ]; then
  go=$(command -v go || true)
fi
if [ -z "$go" ]; then
  echo "error: Go >= 1.24 is needed to build Docker Compose: run 'make setup' (it fetches one) or set GEARFARM_GO" >&2
  exit 2
fi
echo "setup: building Docker Compose $COMPOSE_PIN from the Go module proxy (about 10 minutes; cached in $dir)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# `go install module@version` refuses docker/compose: its go.mod has exclude directives. A
# throwaway main module that requires it builds the same package at the same version.
cat > "$work/go.mod" <<EOF
module gearfarm.local/compose

go 1.24
EOF
cat > "$work/tools.go" <<'EOF'
//go:build tools

package tools

import _ "github.com/docker/compose/v2/cmd"
EOF
mkdir -p "$dir"
rm -rf "$dir/bin.tmp"
(cd "$work" && "$go" get "github.com/docker/compose/v2/cmd@$COMPOSE_PIN" >&2 &&
  GOFLAGS="-trimpath -buildvcs=false" "$go" build -o "$dir/bin.tmp/docker-compose" github.com/docker/compose/v2/cmd >&2)
mv "$dir/bin.tmp" "$dir/bin"
echo "$dir/bin/docker-compose"
