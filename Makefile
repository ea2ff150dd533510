# gearfarm build file: one idempotent setup step shared by `./nightly.bash` and `make test`,
# plus the test, lint and engine targets. Stamps make a second `make setup` a no-op.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(or $(GEARFARM_CACHE),$(HOME)/.cache/gearfarm)

# Setup by role (docs/lab.md, "Hosts and roles"). Each role installs only what its host runs:
#   make setup            the developer machine: every role, the lab's images' tools, the tests
#   make setup-embedded   the embedded default farm (./nightly.bash with no config): gearmand,
#                         MinIO, workers for every target; no podman, chromium or PostgreSQL
#   make setup-nightly    a lab's nightly host (./nightly.bash --config): git and the package
#   make setup-worker     a lab worker host: TARGETS' toolchains and runners, bubblewrap
#   make setup-dashboard  the dashboard host: the package with its web extra
# Debian packages are checked every time (dpkg-query, well under a second) and apt runs only for
# what is missing; Python packages come from pyproject.toml's extras, pinned by requirements.txt.
TARGETS ?= linux-x86_64 linux-i686 linux-aarch64 windows-x86_64
ALL_TARGETS := linux-x86_64 linux-i686 linux-aarch64 windows-x86_64
PKG_BASE := python3-venv ca-certificates procps
# Each target's toolchain and runner: the packages jobs/catalog.toml's tools and runner come from
# (the cross libcs named: the worker image installs without recommended packages).
PKG_TARGET_linux-x86_64 := build-essential zlib1g-dev
PKG_TARGET_linux-i686 := gcc-i686-linux-gnu libc6-dev-i386-cross
PKG_TARGET_linux-aarch64 := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
PKG_TARGET_windows-x86_64 := mingw-w64 libz-mingw-w64-dev wine wine64
# A worker confines each job with bubblewrap, builds CMake projects with ccache, counts
# instructions with valgrind (perf role).
PKG_WORKER := build-essential make bubblewrap cmake ccache valgrind
# sqlite3: gearmand's queue is put in WAL mode before gearmand opens it (gearfarm/hosts/gearmand.py).
PKG_FARM := gearman-job-server stunnel4 sqlite3
# Only the developer machine (the test suite and the lab's images): interop peers, PostgreSQL,
# the browser, systemd-analyze, network namespaces, the container tools.
PKG_DEV := gearman-tools libgearman-dev postgresql postgresql-client chromium systemd iproute2 libxml2-utils \
	podman runc podman-compose debootstrap
# What fetches the pinned Go toolchain that builds MinIO (s3/install-minio.bash).
PKG_FETCH := curl ca-certificates unzip

targets_pkgs = $(foreach t,$(1),$(PKG_TARGET_$(t)))
PKGS_dev := $(PKG_BASE) git $(PKG_FARM) $(PKG_WORKER) $(call targets_pkgs,$(ALL_TARGETS)) $(PKG_DEV)
PKGS_embedded := $(PKG_BASE) git $(PKG_FARM) $(PKG_WORKER) $(call targets_pkgs,$(ALL_TARGETS))
PKGS_nightly := $(PKG_BASE) git
PKGS_worker := $(PKG_BASE) $(PKG_WORKER) $(call targets_pkgs,$(TARGETS))
PKGS_dashboard := $(PKG_BASE)
# pyproject.toml's extras per role (the runtime alone for workers and the embedded farm).
EXTRAS_dev := [dev]
EXTRAS_embedded :=
EXTRAS_nightly := [lab]
EXTRAS_worker :=
EXTRAS_dashboard := [dashboard,lab]
# Roles whose hosts run the cross targets' static zlib and MinIO.
CROSS_ZLIB_dev := $(ALL_TARGETS)
CROSS_ZLIB_embedded := $(ALL_TARGETS)
CROSS_ZLIB_worker := $(TARGETS)
MINIO_dev := .setup/minio.stamp
MINIO_embedded := .setup/minio.stamp
ROLES := dev embedded nightly worker dashboard

.PHONY: setup test test-fast lint engine engine-test clean farm-stop screenshots images
setup: setup-dev
# In parallel where the stamps allow it: on a fresh machine MinIO's Go build (minutes on 2
# cores) runs while apt installs the Debian packages, instead of after them.
setup-%:
	@$(if $(filter $*,$(ROLES)),,echo "error: no setup role '$*'; the roles are: $(ROLES)" >&2; exit 2)
	@$(if $(filter-out $(ALL_TARGETS),$(TARGETS)),echo "error: unknown target in TARGETS: $(filter-out $(ALL_TARGETS),$(TARGETS)); the targets are: $(ALL_TARGETS)" >&2; exit 2)
	@$(MAKE) --no-print-directory -j3 $(call setup_parts,$*)
setup_parts = debian-$(1) $(MINIO_$(1)) .setup/venv.$(1).stamp $(if $(filter dev,$(1)),.setup/junit-xsd.stamp)

# The packages missing from this host, then apt for them alone, so a ready host downloads
# nothing. Root installs; otherwise sudo, but only where someone can answer it: never from a
# systemd unit ($$INVOCATION_ID) and never a password prompt without a terminal. Recommended
# packages are kept: wine and qemu were tested with them.
define apt_ensure
missing=""; \
for a in $(2); do dpkg --print-foreign-architectures | grep -qx $$a || missing="$$missing arch:$$a"; done; \
for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ]; then SUDO=""; \
  elif [ -z "$$INVOCATION_ID" ] && { [ -t 0 ] || sudo -n true 2>/dev/null; }; then SUDO=sudo; \
  else echo "error: this host lacks Debian packages:$$missing. Install them as root once (sudo make $(3) in $(CURDIR)); gearfarm does not call sudo from a service or without a terminal" >&2; exit 2; fi; \
  echo "setup: installing Debian packages:$$missing"; \
  for a in $(2); do $$SUDO dpkg --add-architecture $$a; done; \
  $$SUDO apt-get update -q || echo "setup: warning: apt-get update reported errors; trying the install anyway" >&2; \
  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $(1) \
    || { echo "error: apt-get install failed; run 'make $(3)' again as root or with sudo" >&2; exit 2; }; \
fi
endef

# Foreign architectures only so `apt-get download` can fetch their zlib (see cross-zlib).
zlib_archs = $(if $(filter linux-i686,$(1)),i386) $(if $(filter linux-aarch64,$(1)),arm64)
# The fetch tools go first (apt holds one lock), so MinIO's build overlaps the main install.
.SECONDEXPANSION:
debian-%: $$(if $$(MINIO_$$*),fetch-tools)
	@$(call apt_ensure,$(PKGS_$*),$(call zlib_archs,$(CROSS_ZLIB_$*)),setup-$*)
	@$(if $(strip $(call zlib_archs,$(CROSS_ZLIB_$*))),$(MAKE) --no-print-directory cross-zlib ZLIB_ARCHS="$(strip $(call zlib_archs,$(CROSS_ZLIB_$*)))")
fetch-tools:
	@$(call apt_ensure,$(PKG_FETCH),,setup)

# Installing zlib1g-dev:i386/arm64 through multiarch drags in conflicting foreign libc
# packages, so the static libz and its headers are unpacked into the cross compilers' own
# sysroots, where i686-linux-gnu-gcc and aarch64-linux-gnu-gcc find them with no flags.
ZLIB_ARCHS ?= $(call zlib_archs,$(TARGETS))
.PHONY: cross-zlib fetch-tools
cross-zlib:
	@for arch in $(ZLIB_ARCHS); do \
	  case $$arch in i386) tri=i686-linux-gnu;; arm64) tri=aarch64-linux-gnu;; esac; \
	  test -f /usr/$$tri/lib/libz.a && test -f /usr/$$tri/include/zlib.h && continue; \
	  echo "setup: unpacking zlib1g-dev:$$arch into /usr/$$tri"; \
	  tmp=$$(mktemp -d); chmod 755 $$tmp; \
	  (cd $$tmp && apt-get download -q zlib1g-dev:$$arch >/dev/null) || { echo "error: cannot download zlib1g-dev:$$arch; run 'apt-get update' and 'make setup' again" >&2; exit 2; }; \
	  dpkg -x $$tmp/zlib1g-dev_*.deb $$tmp/x && \
	  cp $$tmp/x/usr/include/zlib.h $$tmp/x/usr/include/zconf.h /usr/$$tri/include/ && \
	  cp $$tmp/x/usr/lib/*/libz.a /usr/$$tri/lib/ && rm -rf $$tmp || exit 2; \
	done

.setup/minio.stamp: s3/install-minio.bash | fetch-tools
	@mkdir -p .setup
	@GEARFARM_CACHE=$(CACHE) bash s3/install-minio.bash
	@touch $@

# An interrupted install can leave a virtualenv pip cannot repair: then start it afresh once.
# setuptools first: the package itself installs without build isolation (no index needed twice).
PIP = $(PY) -m pip install -q --disable-pip-version-check -c requirements.txt
PIP_INSTALL = $(PIP) setuptools && $(PIP) --no-build-isolation -e ".$(EXTRAS_$*)"
.setup/venv.%.stamp: requirements.txt pyproject.toml | debian-%
	@mkdir -p .setup
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP_INSTALL) || { echo "setup: the virtualenv is broken; recreating $(VENV)" >&2; \
	  rm -rf $(VENV) && python3 -m venv $(VENV) && $(PIP_INSTALL); }
	@touch $@

# The schema Jenkins' xUnit plugin validates JUnit files against (junit-10.xsd), for the test
# that the farm's JUnit loads in Jenkins. pytest's source release carries a copy for its own
# tests: fetched from PyPI at a pinned version and sha256 into the cache, never committed.
JUNIT_XSD_FROM := pytest==9.0.1
JUNIT_XSD_SHA256 := 3e9c069ea73583e255c3b21cf46b8d3c56f6e3a1a8f6da94ccb0fcf57b9d73c8
.setup/junit-xsd.stamp: .setup/venv.dev.stamp
	@mkdir -p .setup $(CACHE)
	@test -s $(CACHE)/junit-10.xsd || { tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  $(PY) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$$tmp" $(JUNIT_XSD_FROM) && \
	  echo "$(JUNIT_XSD_SHA256)  $$(ls "$$tmp"/*.tar.gz)" | sha256sum -c --quiet && \
	  tar -xzf "$$tmp"/*.tar.gz -C "$$tmp" --wildcards '*/testing/example_scripts/junit-10.xsd' && \
	  cp "$$tmp"/*/testing/example_scripts/junit-10.xsd $(CACHE)/junit-10.xsd.tmp && \
	  mv $(CACHE)/junit-10.xsd.tmp $(CACHE)/junit-10.xsd; } \
	  || { echo "error: cannot fetch Jenkins' JUnit schema from PyPI ($(JUNIT_XSD_FROM)); run make setup again" >&2; exit 2; }
	@touch $@

# Container images of the lab's roles (docs/lab.md, "Images"), built with podman. No registry is
# reachable here, so the debian:bookworm base is made locally with debootstrap (its root
# filesystem is cached, so a second machine sharing the cache imports it in seconds).
PODMAN ?= podman
export CONTAINERS_CONF ?= $(CURDIR)/docker/containers.conf
DEBIAN_MIRROR ?= http://deb.debian.org/debian
BASE_TAR := $(CACHE)/debian-bookworm-minbase.tar
# The host's CA bundle, lent to build steps that fetch over HTTPS (an egress proxy's CA).
HOST_CA ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt))
# Docker format: OCI images drop HEALTHCHECK.
BUILD = $(PODMAN) build -q --format docker --network host $(if $(HOST_CA),-v $(HOST_CA):/run/host-ca.crt:ro)
# Split so `make -j` overlaps them: the base after apt, the Debian-only images while MinIO's
# Go build still runs, the MinIO image once its binaries are there.
.PHONY: images-base images-debian images-minio
images: images-debian images-minio
	@$(PODMAN) images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep gearfarm

images-base: debian-dev
	@command -v $(PODMAN) >/dev/null || { echo "error: $(PODMAN) not found: apt-get install podman runc debootstrap" >&2; exit 2; }
	@if ! $(PODMAN) image exists docker.io/library/debian:bookworm; then \
	  if [ ! -s $(BASE_TAR) ]; then \
	    echo "images: making the debian:bookworm base with debootstrap (no registry needed)"; \
	    mkdir -p $(CACHE) && root=$$(mktemp -d) && trap 'rm -rf "$$root"' EXIT && \
	    debootstrap --variant=minbase bookworm "$$root" $(DEBIAN_MIRROR) >/dev/null && \
	    tar -C "$$root" -cf $(BASE_TAR).tmp . && mv $(BASE_TAR).tmp $(BASE_TAR) || exit 2; \
	  fi; \
	  $(PODMAN) import -q $(BASE_TAR) docker.io/library/debian:bookworm >/dev/null || exit 2; \
	fi

images-debian: images-base
	@$(BUILD) -t localhost/gearfarm-gearmand -f docker/Dockerfile.gearmand . >/dev/null
	@$(BUILD) -t localhost/gearfarm-postgres -f docker/Dockerfile.postgres . >/dev/null
	@$(BUILD) -t localhost/gearfarm-base -f docker/Dockerfile.base . >/dev/null
	@$(BUILD) -t localhost/gearfarm-worker -f docker/Dockerfile.worker . >/dev/null

images-minio: images-base .setup/minio.stamp
	@ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && cp -L $(CACHE)/bin/minio $(CACHE)/bin/mc "$$ctx"/ && \
	  $(BUILD) -t localhost/gearfarm-minio -f docker/Dockerfile.minio "$$ctx" >/dev/null

# The whole suite: engine suites natively, lint, then every Python test (integration included).
# The lab's images are made here, beside setup (the lab's tests would otherwise make them in
# the middle of the run, minutes on a new machine, after MinIO's build instead of during it).
test:
	@$(MAKE) --no-print-directory -j3 $(call setup_parts,dev) images
	$(MAKE) -s lint
	$(MAKE) -C engine test
	$(PY) -m pytest -q --durations=40 tests

lint: setup
	$(VENV)/bin/ruff check gearfarm workers s3 tests bench docs docker

# The dashboard's screenshots in docs/screenshots/, from six real nightlies (~2 minutes).
screenshots: setup
	$(PY) docs/screenshots/take.py

engine:
	$(MAKE) -C engine

farm-stop: setup
	$(VENV)/bin/gearfarm farm stop

clean:
	rm -rf .setup $(VENV) engine/build

# The Debian packages of a role, one per line (docs and tests read them from here).
packages-%:
	@$(if $(filter $*,$(ROLES)),,echo "error: no setup role '$*'; the roles are: $(ROLES)" >&2; exit 2)
	@printf '%s\n' $(sort $(PKGS_$*))
