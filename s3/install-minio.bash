#!/usr/bin/env bash
# Builds the MinIO server and the mc client from the Go module proxy at pinned
# pseudo-versions into a cache directory shared by every checkout on this machine.
# MinIO ships source only now, and a cold build takes ~7 minutes on 2 cores, so a
# binary is rebuilt only when its pin changes (the pin is part of the cache path).
set -euo pipefail

MINIO_PIN="${MINIO_PIN:-v0.0.0-20260212201848-7aac2a2c5b7c}"
MC_PIN="${MC_PIN:-v0.0.0-20250313080218-cf909e1063a9}"
CACHE="${GEARFARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gearfarm}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The Go that builds them: a pinned toolchain from the same module proxy (the proxy serves Go
# releases as the module golang.org/toolchain), so a plain Debian 12, whose own Go (1.19) is too
# old for MinIO, needs no Go at all, and every machine builds with the same compiler. The zip's
# sha256 is pinned per architecture (measured when the pin was set); the proxy serves no other
# architecture's toolchain here, so elsewhere GEARFARM_GO names a Go >= 1.24 to use instead.
GO_TOOLCHAIN="${GO_TOOLCHAIN:-v0.0.1-go1.24.4}"
GOPROXY_URL="${GOPROXY_URL:-https://proxy.golang.org}"
declare -A GO_SHA256=(
  [v0.0.1-go1.24.4.linux-amd64]=a44b3b07ab40a14e785eb421dc6b09cf6a136eb46c9c8a334f8b752184875866
)

go_bin() {
  if [ -n "${GEARFARM_GO:-}" ]; then echo "$GEARFARM_GO"; return; fi
  local arch
  case "$(uname -m)" in x86_64) arch=amd64;; aarch64) arch=arm64;; *) arch=$(uname -m);; esac
  local version="$GO_TOOLCHAIN.linux-$arch"
  local root="$CACHE/tools/go-$version"
  if [ -x "$root/bin/go" ]; then echo "$root/bin/go"; return; fi
  local sum="${GO_SHA256[$version]:-}"
  if [ -z "$sum" ]; then
    echo "error: no pinned Go toolchain for linux-$arch; set GEARFARM_GO=/path/to/go (Go >= 1.24) and run make setup again" >&2
    exit 2
  fi
  for tool in curl unzip; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed to fetch Go; apt-get install curl unzip ca-certificates" >&2; exit 2; }
  done
  echo "setup: fetching Go $version from $GOPROXY_URL (about 80 MB; cached in $root)" >&2
  local tmp="$work/go"
  mkdir -p "$tmp"
  curl -sSfL --retry 3 -o "$tmp/go.zip" "$GOPROXY_URL/golang.org/toolchain/@v/$version.zip" \
    || { echo "error: cannot fetch Go $version from $GOPROXY_URL; check the network and run make setup again" >&2; exit 2; }
  echo "$sum  $tmp/go.zip" | sha256sum -c --quiet \
    || { echo "error: the Go toolchain from $GOPROXY_URL does not match its pinned sha256; not using it" >&2; exit 2; }
  unzip -q "$tmp/go.zip" -d "$tmp/x"
  local top="$tmp/x/golang.org/toolchain@$version"
  # Module zips carry no file modes: the go command sets them itself when it unpacks a toolchain.
  chmod +x "$top"/bin/* "$top"/pkg/tool/*/*
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  mv "$top" "$root"
  echo "$root/bin/go"
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
  # GOTOOLCHAIN=local: this Go, never another one switched to; CGO_ENABLED=0 as MinIO's own
  # release builds, so no C compiler is needed (apt may still be installing one beside this).
  GOBIN="$dir/bin.tmp" GOFLAGS="-trimpath" GOTOOLCHAIN=local CGO_ENABLED=0 "$go" install "$module@$pin" >&2
  mv "$dir/bin.tmp" "$dir/bin"
  echo "$dir/bin/$name"
}

minio=$(build minio github.com/minio/minio "$MINIO_PIN")
mc=$(build mc github.com/minio/mc "$MC_PIN")
mkdir -p "$CACHE/bin"
ln -sf "$minio" "$CACHE/bin/minio"
ln -sf "$mc" "$CACHE/bin/mc"
