#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Prints the path of a wheelhouse holding every wheel the image build needs (the project's
# dependencies and its build backend), downloaded on the host with the host's pip and trust store,
# so `podman build -v WHEELHOUSE:/wheelhouse:ro` needs no index and no TLS setup inside the build.
# Cached under SIMBRIDGE_CACHE, keyed by the requirement list: a second run downloads nothing.
# Usage: wheelhouse.sh PYTHON   (an interpreter of the same minor version and platform as the
# image's, e.g. the repo's .venv/bin/python)
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
python="${1:?usage: wheelhouse.sh PYTHON}"
repo="$(cd "$(dirname "$0")/../.." && pwd)"

reqs="$("${python}" - "${repo}/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
reqs = list(data["build-system"]["requires"]) + list(data["project"]["dependencies"])
print("\n".join(sorted(reqs)))
PY
)"
key="$(printf '%s\n%s\n' "$("${python}" -c 'import sys; print(sys.version_info[:2])')" "${reqs}" \
  | sha256sum | cut -c1-16)"
dir="${SIMBRIDGE_CACHE}/wheelhouse/${key}"
if [[ -f "${dir}/.complete" ]]; then
  log "wheelhouse ${dir} (cached)"
  echo "${dir}"
  exit 0
fi
mkdir -p "${dir}"
log "downloading wheels into ${dir}"
mapfile -t req_list <<<"${reqs}"
"${python}" -m pip download --quiet --only-binary=:all: --dest "${dir}" "${req_list[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
touch "${dir}/.complete"
echo "${dir}"
