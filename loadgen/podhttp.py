"""The Pod's resize subresource and the Pod itself over plain HTTP (the local Kubernetes
stand-ins in ``loadgen.kubesim`` and the container rig speak it; a real API server goes through
``kubectl`` or lightkube instead)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any


async def patch_resize(pod_url: str, body: dict[str, Any]) -> None:
    """PATCH the Pod's ``resize`` subresource (strategic merge) over plain HTTP."""
    req = urllib.request.Request(
        pod_url + "/resize",
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    try:
        await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=10).read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"resize rejected: {exc.code} {exc.read().decode()}") from None


async def get_pod(pod_url: str) -> dict[str, Any]:
    """GET one Pod as JSON over plain HTTP."""

    def get() -> dict[str, Any]:
        with urllib.request.urlopen(pod_url, timeout=10) as r:
            pod: dict[str, Any] = json.loads(r.read())
            return pod

    return await asyncio.to_thread(get)
