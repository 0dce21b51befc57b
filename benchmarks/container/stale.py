"""Rig containers left behind by a run killed with SIGKILL: found by label, removed when the
process that owns them is gone (every other exit path removes its own)."""

from __future__ import annotations

import os

from benchmarks.container.rig import LABEL
from loadgen.kubesim_podman import Podman


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def remove_stale(podman: Podman) -> list[str]:
    """Remove rig containers whose owning process is gone (a run killed with SIGKILL)."""
    out = await podman.run("ps", "--all", "--filter", f"label={LABEL}=1", "--format", "{{.Names}}")
    removed = []
    for name in out.split():
        if not name.startswith(f"{LABEL}-"):
            continue
        state = await podman.inspect(name)
        owner = state.get("Config", {}).get("Labels", {}).get(f"{LABEL}.owner", "")
        if owner.isdigit() and _alive(int(owner)):
            continue
        await podman.remove(name)
        removed.append(name)
    return removed
