# simbridge — every target sets up its own virtualenv from pyproject.toml (CI and a fresh machine
# have nothing else). Override PYTHON to pick an interpreter (>= 3.11).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO_SRC := proto/bridge/v1/bridge.proto

.PHONY: run test lint proto chart-docs venv sysdeps test-memory-heavy bench-relay bench-overload bench-capacity bench-decimate bench-adapt bench-view bench-uplink bench-grpc-window bench-connect test-sanitize fuzz clean \
	container-deps e2e-container e2e-container-full bench-memory

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test,dev,loadgen,gpu,view]'
	touch $(STAMP)

venv: $(STAMP) sysdeps

# System packages (Debian): libusb for Open3D's wheel (see the README), shellcheck for the deploy
# scripts' test, chromium for the view page's browser test. Installed when we are root with
# apt-get; otherwise those tests skip visibly.
SYSPKGS := libusb-1.0-0 shellcheck chromium
sysdeps:
	@missing=""; \
	ldconfig -p 2>/dev/null | grep -q 'libusb-1.0.so.0' || missing="$$missing libusb-1.0-0"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q $$missing >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null 2>&1)) \
	      || echo "warning: could not install$$missing; the tests that need them will skip"; \
	  else echo "note: missing$$missing (apt-get install$$missing); the tests that need them will skip"; fi; \
	fi

run: venv
	$(VENV)/bin/simbridge-loadgen demo

test: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Regenerate the protobuf/gRPC modules under bridge/v1 (tests fail when they are stale).
proto: venv
	$(PY) -m bridge.protogen

# Regenerate the values table in charts/simbridge/README.md from values.yaml (a test checks it).
chart-docs: venv
	$(PY) scripts/chart_values_table.py --write

# The C kernel under ASan/UBSan (like msgspec's sanitizer CI), then rebuilt normally.
test-sanitize: venv
	BRIDGE_SANITIZE=1 BRIDGE_BUILD_NATIVE=yes $(PY) -m pip install -q -e . --no-deps --no-build-isolation
	ASAN_OPTIONS=detect_leaks=0 \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
	  $(PY) -m pytest -q -p no:cacheprovider tests/unit/test_decimate.py; \
	status=$$?; $(PY) -m pip install -q -e . --no-deps --no-build-isolation; exit $$status

# Long structure-aware fuzz run of both transports (make test runs 100 examples of the same target).
FUZZ_EXAMPLES ?= 5000
fuzz: venv
	SIMBRIDGE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/fuzz --timeout 3600

# The hostile memory cases at full size (2,000 idle sessions, longer floods); make test runs small ones.
test-memory-heavy: venv
	SIMBRIDGE_HEAVY=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/integration/test_memory_hostile.py

bench-relay: venv
	$(PY) -m benchmarks.relay.cli

# 0.5x to 4x the bridge's measured capacity, both transports (a few minutes).
bench-overload: venv
	$(PY) -m benchmarks.overload

# Max sustainable clouds/s at 0.5/1/1.5/2 cores (real cgroup v1 CPU throttle: needs root).
bench-capacity: venv
	$(PY) -m benchmarks.capacity

# Decimation backends against Open3D and PCL; ARGS=--quick (about a minute), ARGS=--help for the rest.
bench-decimate: venv
	$(PY) -m benchmarks.decimate.cli $(ARGS)

bench-adapt: venv
	$(PY) -m benchmarks.adapt

bench-view: venv
	$(PY) -m benchmarks.view

# A 20 Mbit/s uplink (own network namespace, tbf; needs root): lanes off/on, codecs off/lossless/lossy.
bench-uplink: venv
	$(PY) -m benchmarks.uplink

# The gRPC receive window (grpc_window_bytes): loopback CPU per message vs slow-link telemetry delay.
bench-grpc-window: venv
	$(PY) -m benchmarks.grpc_window

# Clouds/s, 1 KB frames/s and CPU per frame at N = 1,2,4,8 bridge processes, and a model (ARGS=--help).
.PHONY: bench-scale
bench-scale: venv
	$(PY) -m benchmarks.scale.cli --json reports/bench-scale.json --plot reports/bench-scale.png $(ARGS)

# Session setup (new and resumed, WebSocket and gRPC) and a Unix-socket round trip: the parts of
# a redirect and of a handover between ingest processes (docs/scaling.md).
bench-connect: venv
	$(PY) -m benchmarks.connect

# The bridge in a real container (podman + runc, image from the Dockerfile on a local mmdebstrap
# base), resized live under load: podman update directly and through the Kubernetes stand-in;
# then the hostile cases (benchmarks/container/hostile.py: edges ignoring PAUSE, subscribers
# that never read, codec bombs, a chunk hold, live shrinks; each with a well-behaved edge and a
# sink down then up), the short set at 400m (a few minutes).
# Installs podman runc mmdebstrap uidmap as root with apt (only the missing ones); skips visibly
# where containers cannot run. Tables on stdout, PNG + JSON under reports/e2e-container/.
container-deps:
	@bash scripts/container/install-deps.sh

e2e-container: venv container-deps
	SIMBRIDGE_E2E_CONTAINER=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/e2e

# The same with every hostile case at 256m, 400m, 768m and 1g (~20 minutes; not in CI).
e2e-container-full: venv container-deps
	SIMBRIDGE_E2E_CONTAINER=1 SIMBRIDGE_E2E_FULL=1 $(PY) -m pytest -q -s -p no:cacheprovider tests/e2e

# Three `simbridge serve` replicas behind HAProxy (examples/haproxy/haproxy.cfg: consistent hash
# on x-simbridge-device, WebSocket over HTTP/1.1, gRPC over h2), 24 devices at 10 Hz over both
# transports and one sink; scaled 3 -> 2 -> 3 (SIGTERM, then a new replica through the runtime
# API) and one replica SIGKILLed (about a minute; benchmarks/replicas/cli.py, docs/scaling.md).
# Installs Debian's haproxy as root with apt when missing; skips visibly elsewhere. Report
# under reports/e2e-replicas/.
.PHONY: e2e-replicas
e2e-replicas: venv
	@command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null 2>&1 \
	      || (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy >/dev/null 2>&1) \
	      || echo "warning: could not install haproxy; the replicas e2e will skip"; \
	  else echo "note: haproxy missing (apt-get install haproxy, as root); the replicas e2e will skip"; fi; }
	SIMBRIDGE_E2E_REPLICAS=1 $(PY) -m pytest -q -s -rs -p no:cacheprovider tests/e2e/test_replicas.py

# RSS vs memory limit vs budget over a memory resize trace, one run (reports/bench-memory.png).
bench-memory: venv container-deps
	$(PY) -m benchmarks.memory

# The image the chart deploys by default (image.repository simbridge, tag = the chart's appVersion),
# cpu target. Named docker.io/library/simbridge:TAG, the name Kubernetes gives "simbridge:TAG", so a
# podman-built archive loaded into kind matches the chart (podman would otherwise say localhost/).
# podman where installed (docker format, which keeps the HEALTHCHECK), else docker;
# CONTAINER_TOOL=docker to choose. Loading it into kind:
# docs/operations.md, "Build the image and load it into kind".
CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' charts/simbridge/Chart.yaml)
IMAGE ?= docker.io/library/simbridge:$(CHART_APP_VERSION)
CONTAINER_TOOL ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
.PHONY: image
image:
	$(CONTAINER_TOOL) build $(if $(filter podman,$(notdir $(CONTAINER_TOOL))),--format docker) --target cpu -t $(IMAGE) .

clean:
	rm -rf $(VENV) build *.egg-info
