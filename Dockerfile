# syntax=docker/dockerfile:1.7
#
# simbridge container images.
#
#   docker build --target cpu -t simbridge:0.1.0 .        # python:3.11-slim runtime (C + NumPy backends)
#   docker build --target gpu -t simbridge:0.1.0-gpu .    # + CUDA runtime libs and the CUDA backend
#
# Without a registry (the project's machines): scripts/container/build-image.sh makes a local Debian
# 12 base with mmdebstrap (localhost/simbridge-base:bookworm, scripts/container/base-image.sh), a
# wheelhouse of the dependencies on the host, and runs
#   podman build --build-arg BASE_IMAGE=localhost/simbridge-base:bookworm \
#     -v WHEELHOUSE:/wheelhouse:ro --target cpu -t localhost/simbridge-e2e:cpu .
# When /wheelhouse is mounted, every pip step installs from it alone (PIP_NO_INDEX), so the build
# needs no index and no TLS trust store; otherwise pip uses the index as usual.
#
# Both runtimes install one wheel built by `pip wheel .` in a builder stage with
# BRIDGE_BUILD_NATIVE=yes (a native build failure fails the image build instead of silently shipping
# the NumPy fallback). The gpu builder has the CUDA toolkit (nvcc), so its wheel also carries the CUDA
# library (bridge/decimate/_sbv_cuda.so, linked with --cudart=static); the GPU driver libraries
# (libcuda, libnvidia-ml) come from the node at run time (NVIDIA container toolkit / CDI via DRA).
#
# Python comes from one BASE_IMAGE in every stage, so the wheel's interpreter ABI and glibc match the
# runtime exactly; CUDA packages come from NVIDIA's Debian 12 apt repository (cuda-keyring).
# Only python3 (>= 3.11) and its venv module are needed from the base, and every stage calls
# `python3`, so both python:3.11-slim-bookworm (the default) and a plain Debian 12 with
# python3 + python3-venv (mmdebstrap --variant=minbase --include=python3,python3-venv) work.
#
# Built for real on the project's machines with podman (cpu target, `make e2e-container`); the gpu
# target is exercised by deploy/kind/demo.sh on a workstation with Docker and a registry.

ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
# CUDA major-minor as used in Debian package names (cuda-nvcc-12-8, cuda-cudart-12-8).
ARG CUDA_PKG_VERSION=12-8
# nvcc -gencode list; empty = setup.py's default fat binary (sm_80, sm_90, compute_90 PTX).
ARG BRIDGE_CUDA_ARCH=""
# NVML bindings for the gpu image (GPU memory total/used, MIG instances).
ARG NVIDIA_ML_PY_VERSION=13.615.71

# Lint: hadolint Dockerfile. Debian packages are not pinned to exact versions (DL3008): the base image
# tag pins the Debian release and security updates should flow in on rebuild.

# ---------------------------------------------------------------------------------------------
# build-base: compiler toolchain + the project sources that `pip wheel .` needs.
FROM ${BASE_IMAGE} AS build-base
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/build/bin:${PATH}
# python3-dev only where Python.h is missing: the python:3.11 images ship the headers of their own
# interpreter, Debian's python3 package does not.
# hadolint ignore=DL3008,SC2086
RUN pkgs="build-essential ca-certificates curl" \
 && if ! python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then pkgs="$pkgs python3-dev"; fi \
 && apt-get update \
 && apt-get install -y --no-install-recommends $pkgs \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY native/ native/
COPY proto/ proto/
COPY bridge/ bridge/
COPY loadgen/ loadgen/

# ---------------------------------------------------------------------------------------------
# builder-cpu: wheel with the C CPU kernel (no nvcc: the CUDA library is not built).
FROM build-base AS builder-cpu
RUN if [ -d /wheelhouse ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse; fi \
 && BRIDGE_BUILD_NATIVE=yes pip wheel --wheel-dir /wheels . \
 && ls -l /wheels \
 && sha256sum /wheels/*.whl > /wheels/SHA256SUMS

# ---------------------------------------------------------------------------------------------
# builder-gpu: the CUDA toolkit (nvcc + cudart headers) on the same Python base; the wheel gets the
# C extension and the CUDA library.
FROM build-base AS builder-gpu
ARG CUDA_REPO
ARG CUDA_PKG_VERSION
ARG BRIDGE_CUDA_ARCH
# hadolint ignore=DL3008
RUN curl -fsSL -o /tmp/cuda-keyring.deb "${CUDA_REPO}/cuda-keyring_1.1-1_all.deb" \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      "cuda-nvcc-${CUDA_PKG_VERSION}" "cuda-cudart-dev-${CUDA_PKG_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}
RUN nvcc --version \
 && if [ -n "${BRIDGE_CUDA_ARCH}" ]; then export BRIDGE_CUDA_ARCH; else unset BRIDGE_CUDA_ARCH; fi \
 && BRIDGE_BUILD_NATIVE=yes pip wheel --wheel-dir /wheels . \
 && ls -l /wheels \
 && sha256sum /wheels/*.whl > /wheels/SHA256SUMS \
 && python3 -c "import sys, zipfile, glob; w = glob.glob('/wheels/simbridge-*.whl')[0]; names = zipfile.ZipFile(w).namelist(); sys.exit(0 if any(n.endswith('_sbv_cuda.so') for n in names) else 'CUDA library missing from ' + w)"

# ---------------------------------------------------------------------------------------------
# runtime-base: slim Python, a non-root user, a virtualenv on PATH; nothing writable but /tmp.
FROM ${BASE_IMAGE} AS runtime-base
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/simbridge \
    PATH=/opt/simbridge/bin:${PATH}
RUN groupadd --system --gid 10001 simbridge \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin simbridge \
 && python3 -m venv /opt/simbridge
# 8080 WebSocket ingest (/v1/ingest), 9090 gRPC (ingest, Visualization.Subscribe, grpc.health.v1),
# 9100 HTTP (/metrics, /healthz, /readyz, /debug/resources).
EXPOSE 8080 9090 9100
COPY LICENSE NOTICE /usr/share/doc/simbridge/
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9100/healthz', timeout=2).status != 200)"]
WORKDIR /tmp
LABEL org.opencontainers.image.title="simbridge" \
      org.opencontainers.image.description="Live simulation bridge that adapts to in-place pod resize" \
      org.opencontainers.image.licenses="Apache-2.0"

# ---------------------------------------------------------------------------------------------
# gpu: CUDA runtime libraries + NVML bindings; the driver itself is injected by the node.
FROM runtime-base AS gpu
ARG CUDA_REPO
ARG CUDA_PKG_VERSION
ARG NVIDIA_ML_PY_VERSION
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates \
 && curl -fsSL -o /tmp/cuda-keyring.deb "${CUDA_REPO}/cuda-keyring_1.1-1_all.deb" \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends "cuda-cudart-${CUDA_PKG_VERSION}" \
 && apt-get purge -y curl && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*
# Legacy (non-CDI) NVIDIA runtime hook: expose compute + NVML. Under DRA/CDI the driver sets these.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64
# simbridge and its dependencies come from the builder's wheels (pinned by the build itself).
# The checksums are copied (a few hundred bytes) so that a new wheel invalidates the layer cache of
# the install below: buildah, unlike BuildKit, does not key a RUN on the content of a mounted stage.
COPY --from=builder-gpu /wheels/SHA256SUMS /opt/simbridge/wheels.sha256
# hadolint ignore=DL3013
RUN --mount=type=bind,from=builder-gpu,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels simbridge \
 && pip install "nvidia-ml-py==${NVIDIA_ML_PY_VERSION}" \
 && python3 -m compileall -q /opt/simbridge/lib \
 && simbridge --help >/dev/null
USER 10001:10001
ENTRYPOINT ["simbridge", "serve"]

# ---------------------------------------------------------------------------------------------
# cpu (default target, last stage): C and NumPy decimation backends only.
FROM runtime-base AS cpu
# The checksums are copied (a few hundred bytes) so that a new wheel invalidates the layer cache of
# the install below: buildah, unlike BuildKit, does not key a RUN on the content of a mounted stage.
COPY --from=builder-cpu /wheels/SHA256SUMS /opt/simbridge/wheels.sha256
# hadolint ignore=DL3013
RUN --mount=type=bind,from=builder-cpu,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels simbridge \
 && python3 -m compileall -q /opt/simbridge/lib \
 && simbridge --help >/dev/null
USER 10001:10001
ENTRYPOINT ["simbridge", "serve"]
