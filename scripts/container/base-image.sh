#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Makes the local Debian 12 base image (default localhost/simbridge-base:bookworm) once: no
# registry is reachable from the project's machines, so the Dockerfile's BASE_IMAGE comes from
# mmdebstrap (minbase + python3 + python3-venv, the parts of python:3.11-slim the Dockerfile uses)
# imported with `podman import`. Skipped when the image exists; FORCE=1 rebuilds it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

if [[ "${FORCE:-0}" != 1 ]] && "${PODMAN[@]}" image exists "${SIMBRIDGE_BASE_IMAGE}"; then
  log "base image ${SIMBRIDGE_BASE_IMAGE} exists (FORCE=1 rebuilds it)"
  exit 0
fi
command -v mmdebstrap >/dev/null || { log "mmdebstrap is not installed"; exit 1; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/simbridge-e2e-base.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
log "mmdebstrap bookworm -> ${SIMBRIDGE_BASE_IMAGE}"
start=${SECONDS}
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv \
  --aptopt='Acquire::Retries "3"' bookworm "${tmp}/base.tar"
"${PODMAN[@]}" import --quiet \
  --change 'CMD ["/bin/bash"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --message "simbridge: mmdebstrap --variant=minbase --include=python3,python3-venv bookworm" \
  "${tmp}/base.tar" "${SIMBRIDGE_BASE_IMAGE}" >/dev/null
log "base image ready in $((SECONDS - start)) s"
