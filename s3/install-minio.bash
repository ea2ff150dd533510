#!/usr/bin/env bash
# Builds the MinIO server and the mc client from the Go module proxy at pinned
# pseudo-versions into a cache directory shared by every checkout on this machine.
# MinIO ships source only now, and a cold build takes ~7 minutes on 2 cores, so a
# binary is rebuilt only when its pin changes (the pin is part of the cache path).
set -euo pipefail

MINIO_PIN="${MINIO_PIN:-v0.0.0-20260212201848-7aac2a2c5b7c}"
MC_PIN="${MC_PIN:-v0.0.0-20250313080218-cf909e1063a9}"
CACHE="${GEARFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gearfarm}"

go_bin() {
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go; return; fi
  echo "error: Go >= 1.24 is needed to build MinIO; install it (e.g. apt-get install golang-1.24-go, or /usr/local/go)" >&2
  exit 2
}

build() { # name module pin
  local name=$1 module=$2 pin=$3
  local dir="$CACHE/tools/$name-$pin"
  if [ -x "$dir/bin/$name" ]; then
    echo "$dir/bin/$name"
    return
  fi
  local go; go=$(go_bin)
  echo "setup: building $name $pin from the Go module proxy (cold build takes minutes; cached in $dir)" >&2
  mkdir -p "$dir"
  # Build into a temporary dir and rename, so an interrupted build never looks finished.
  rm -rf "$dir/bin.tmp"
  GOBIN="$dir/bin.tmp" GOFLAGS="-trimpath" "$go" install "$module@$pin" >&2
  mv "$dir/bin.tmp" "$dir/bin"
  echo "$dir/bin/$name"
}

minio=$(build minio github.com/minio/minio "$MINIO_PIN")
mc=$(build mc github.com/minio/mc "$MC_PIN")
mkdir -p "$CACHE/bin"
ln -sf "$minio" "$CACHE/bin/minio"
ln -sf "$mc" "$CACHE/bin/mc"
