#!/usr/bin/env bash
# Shared settings of the container scripts (sourced, not run). Why these flags: the hybrid cgroup
# layout of the project's machines makes crun refuse to start containers, so podman runs with
# runc and the cgroupfs manager; the default rlimits exceed what the VM permits, so every
# container gets explicit ones.

SIMBRIDGE_BASE_IMAGE="${SIMBRIDGE_BASE_IMAGE:-localhost/simbridge-base:bookworm}"
SIMBRIDGE_E2E_IMAGE="${SIMBRIDGE_E2E_IMAGE:-localhost/simbridge-e2e-cpu:latest}"
SIMBRIDGE_CACHE="${SIMBRIDGE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/simbridge}"
PODMAN_RUNTIME="${PODMAN_RUNTIME:-/usr/sbin/runc}"
# shellcheck disable=SC2034  # used by the scripts that source this file
PODMAN=(podman --runtime "${PODMAN_RUNTIME}" --cgroup-manager cgroupfs)
# Within this shell's hard limits (a container may not raise them): at most 16384 files, 4096 procs.
_cap() { local hard="$1" want="$2"; if [[ "${hard}" == unlimited ]] || ((hard > want)); then echo "${want}"; else echo "${hard}"; fi; }
_nofile="$(_cap "$(ulimit -Hn)" 16384)"
_nproc="$(_cap "$(ulimit -Hu)" 4096)"
# shellcheck disable=SC2034
ULIMITS=(--ulimit "nofile=${_nofile}:${_nofile}" --ulimit "nproc=${_nproc}:${_nproc}")

log() { printf '[container] %s\n' "$*" >&2; }
