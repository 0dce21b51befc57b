#!/usr/bin/env bash
# Installs what the container targets need (podman, runc, mmdebstrap, uidmap) with apt-get, only
# the missing ones, when we are root; otherwise says what is missing. Never fails: the targets
# then skip visibly and say why.
set -uo pipefail

missing=()
command -v podman >/dev/null || missing+=(podman)
[[ -x /usr/sbin/runc ]] || missing+=(runc)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v newuidmap >/dev/null || missing+=(uidmap)
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "note: missing ${missing[*]} (apt-get install ${missing[*]}, as root); container targets will skip" >&2
  exit 0
fi
echo "[container] apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null 2>&1
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || echo "warning: could not install ${missing[*]}; container targets will skip" >&2
fi
exit 0
