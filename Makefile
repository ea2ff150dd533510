# gearfarm build file: one idempotent setup step shared by `./nightly.bash` and `make test`,
# plus the test, lint and engine targets. Stamps make a second `make setup` a no-op.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CACHE ?= $(or $(GEARFARM_CACHE),$(HOME)/.cache/gearfarm)

# Debian packages the farm and its four targets need (issue: setup installs them idempotently).
DEB_PACKAGES := gearman-job-server gearman-tools libgearman-dev build-essential git \
	zlib1g-dev gcc-i686-linux-gnu gcc-aarch64-linux-gnu mingw-w64 libz-mingw-w64-dev \
	qemu-user wine wine64 stunnel4 postgresql postgresql-client python3-venv valgrind \
	procps iproute2 cmake ccache chromium systemd bubblewrap libxml2-utils \
	podman runc podman-compose debootstrap
# Foreign architectures only so `apt-get download` can fetch their zlib (see cross-zlib).
FOREIGN_ARCHS := i386 arm64

.PHONY: setup setup-parts test test-fast lint engine engine-test clean farm-stop screenshots images
SETUP_STAMPS := .setup/debian.stamp .setup/cross-zlib.stamp .setup/minio.stamp .setup/venv.stamp .setup/junit-xsd.stamp
# In parallel where the stamps allow it: on a fresh machine MinIO's Go build (minutes on 2
# cores) runs while apt installs the Debian packages, instead of after them.
setup:
	@$(MAKE) --no-print-directory -j3 setup-parts
setup-parts: $(SETUP_STAMPS)

# Checks first and calls apt only for what is missing, so a ready machine downloads nothing.
# Recommended packages are kept: wine and qemu were tested with them.
.setup/debian.stamp: Makefile
	@mkdir -p .setup
	@missing=""; \
	for a in $(FOREIGN_ARCHS); do dpkg --print-foreign-architectures | grep -qx $$a || missing="$$missing arch:$$a"; done; \
	for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  for a in $(FOREIGN_ARCHS); do $$SUDO dpkg --add-architecture $$a; done; \
	  $$SUDO apt-get update -q || echo "setup: warning: apt-get update reported errors; trying the install anyway" >&2; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $(DEB_PACKAGES) \
	    || { echo "error: apt-get install failed; run 'make setup' again as root or with sudo" >&2; exit 2; }; \
	fi
	@touch $@

# Installing zlib1g-dev:i386/arm64 through multiarch drags in conflicting foreign libc
# packages, so the static libz and its headers are unpacked into the cross compilers' own
# sysroots, where i686-linux-gnu-gcc and aarch64-linux-gnu-gcc find them with no flags.
.setup/cross-zlib.stamp: .setup/debian.stamp
	@for pair in i386:i686-linux-gnu arm64:aarch64-linux-gnu; do \
	  arch=$${pair%%:*}; tri=$${pair##*:}; \
	  test -f /usr/$$tri/lib/libz.a && test -f /usr/$$tri/include/zlib.h && continue; \
	  echo "setup: unpacking zlib1g-dev:$$arch into /usr/$$tri"; \
	  tmp=$$(mktemp -d); chmod 755 $$tmp; \
	  (cd $$tmp && apt-get download -q zlib1g-dev:$$arch >/dev/null) || { echo "error: cannot download zlib1g-dev:$$arch; run 'apt-get update' and 'make setup' again" >&2; exit 2; }; \
	  dpkg -x $$tmp/zlib1g-dev_*.deb $$tmp/x && \
	  cp $$tmp/x/usr/include/zlib.h $$tmp/x/usr/include/zconf.h /usr/$$tri/include/ && \
	  cp $$tmp/x/usr/lib/*/libz.a /usr/$$tri/lib/ && rm -rf $$tmp || exit 2; \
	done
	@touch $@

.setup/minio.stamp: s3/install-minio.bash
	@mkdir -p .setup
	@GEARFARM_CACHE=$(CACHE) bash s3/install-minio.bash
	@touch $@

# An interrupted install can leave a virtualenv pip cannot repair: then start it afresh once.
PIP_INSTALL = $(PY) -m pip install -q --disable-pip-version-check -r requirements.txt && \
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
.setup/venv.stamp: requirements.txt pyproject.toml | .setup/debian.stamp
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
.setup/junit-xsd.stamp: .setup/venv.stamp
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

images-base: .setup/debian.stamp
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
	@$(MAKE) --no-print-directory -j3 setup-parts images
	$(MAKE) -s lint
	$(MAKE) -C engine test
	$(PY) -m pytest -q tests

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
