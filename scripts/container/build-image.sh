#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Builds the Dockerfile's cpu target with podman, offline: BASE_IMAGE is the local mmdebstrap
# base (base-image.sh) and pip installs from a host-made wheelhouse (wheelhouse.sh). Layers are
# cached by podman, so a rebuild after a source change only reruns the wheel and install steps.
# Usage: build-image.sh PYTHON [IMAGE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "${here}/lib.sh"
python="${1:?usage: build-image.sh PYTHON [IMAGE]}"
image="${2:-${SIMBRIDGE_E2E_IMAGE}}"
repo="$(cd "${here}/../.." && pwd)"

"${here}/base-image.sh"
wheelhouse="$("${here}/wheelhouse.sh" "${python}")"
log "podman build --target cpu -> ${image}"
start=${SECONDS}
previous="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "${image}" 2>/dev/null || true)"
"${PODMAN[@]}" build --layers --network host "${ULIMITS[@]}" \
  --build-arg "BASE_IMAGE=${SIMBRIDGE_BASE_IMAGE}" \
  --volume "${wheelhouse}:/wheelhouse:ro" \
  --target cpu --tag "${image}" "${repo}" >&2
log "image ${image} built in $((SECONDS - start)) s"
# The image this tag pointed at before (ours) is dropped when it is no longer used; its layers that
# the new one shares stay.
current="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "${image}")"
if [[ -n "${previous}" && "${previous}" != "${current}" ]]; then
  "${PODMAN[@]}" rmi "${previous}" >/dev/null 2>&1 || true
fi
