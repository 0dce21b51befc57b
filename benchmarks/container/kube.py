"""The Kubernetes path of the container rig: ``kubectl patch --subresource resize`` → the stand-in
(:mod:`loadgen.kubesim`) → its kubelet → ``podman update`` on the real container → the bridge.

The bridge inside reads its real cgroup and watches its Pod on the stand-in, so it sees the
*desired* limits before the kubelet acts and shrinks cooperatively; the stand-in's kubelet holds a
memory decrease while the container's real usage is at or above the new limit, like the kubelet.
Without kubectl the same strategic-merge PATCH goes over HTTP (the report says which).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.container.rig import ContainerRig
from bridge.resources.kubeapi import ENV_API, ENV_POD_NAME, ENV_POD_NAMESPACE
from bridge.resources.quantity import to_bytes, to_millicores
from loadgen.kubesim_podman import PodmanActuator
from loadgen.podhttp import get_pod, patch_resize
from loadgen.resize import (
    CONTAINER,
    POD_NAME,
    POD_NAMESPACE,
    pod_json,
    resize_body,
)


def seam_missing() -> str | None:
    """Why the stand-in cannot drive a real container here, or ``None``."""
    from loadgen import kubesim

    sim = getattr(kubesim, "KubeSim", None)
    if sim is None or "actuator" not in inspect.signature(sim).parameters:
        return "loadgen.kubesim has no Actuator seam (KubeSim(actuator=...)) in this tree"
    return None


class KubeResizer:
    """A :class:`~benchmarks.container.rig.Resizer` through the stand-in's resize subresource."""

    def __init__(self, sim: Any, url: str) -> None:
        self.sim, self.url = sim, url
        self.kubectl = shutil.which("kubectl")
        self.name = "kubectl patch --subresource resize" if self.kubectl else "PATCH …/resize"
        self._dir = tempfile.TemporaryDirectory(prefix="simbridge-e2e-kube-")
        self.kubeconfig = Path(self._dir.name, "kubeconfig")
        # an empty kubeconfig: a real cluster's must never be touched
        self.kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
        self.pod_path = f"/api/v1/namespaces/{POD_NAMESPACE}/pods/{POD_NAME}"

    async def _kubectl(self, *args: str) -> str:
        assert self.kubectl is not None
        proc = await asyncio.create_subprocess_exec(
            self.kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            "--server",
            self.url,
            "-n",
            POD_NAMESPACE,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {args[0]} failed: {(out + err).decode().strip()}")
        return out.decode()

    async def _patch(self, body: dict[str, Any]) -> None:
        if self.kubectl:
            await self._kubectl(
                "patch", "pod", POD_NAME, "--subresource", "resize", "--type", "strategic",
                "-p", json.dumps(body),
            )  # fmt: skip
            return
        await patch_resize(self.url + self.pod_path, body)

    async def _pod(self) -> dict[str, Any]:
        return await get_pod(self.url + self.pod_path)

    async def resize(self, cpu: float, memory: int) -> list[str]:
        """PATCH, then wait (≤ 60 s) until the Pod's status shows the resize enacted."""
        await self._patch(resize_body(cpu, memory))
        want = (round(cpu * 1000), memory)
        t0 = time.monotonic()
        held = 0.0
        why = ""
        notes: list[str] = []
        while True:
            pod = await self._pod()
            conds = {c.get("type"): c for c in pod.get("status", {}).get("conditions", [])}
            in_progress = conds.get("PodResizeInProgress")
            if in_progress is not None and in_progress.get("reason") == "Error":
                held = time.monotonic() - t0
                why = str(in_progress.get("message", ""))[:160]
            if _enacted(pod) == want and not {"PodResizePending", "PodResizeInProgress"} & set(
                conds
            ):
                break
            if time.monotonic() - t0 > 60:
                raise RuntimeError(f"Pod status did not converge in 60 s: {why or conds}")
            await asyncio.sleep(0.05)
        if held:
            notes.append(f"kubelet held the resize {held:.1f} s: {why}")
        return notes

    def close(self) -> None:
        self._dir.cleanup()


def _enacted(pod: dict[str, Any]) -> tuple[int, int] | None:
    for st in pod.get("status", {}).get("containerStatuses", []):
        if st.get("name") == CONTAINER:
            lim = st.get("resources", {}).get("limits", {})
            try:
                return to_millicores(lim["cpu"]), to_bytes(lim["memory"])
            except (KeyError, ValueError):
                return None
    return None


class KubePath:
    """Hooks for :meth:`ContainerRig.run`: start the stand-in before the bridge (its URL goes
    into the container's env), then resize through it. Call :meth:`close` on every exit path."""

    def __init__(self) -> None:
        self.sim: Any = None
        self.resizer: KubeResizer | None = None
        self.actuator: PodmanActuator | None = None

    async def before_bridge(self, rig: ContainerRig) -> None:
        from loadgen.kubesim import KubeSim

        self.actuator = PodmanActuator(rig.name, rig.podman)
        # the container starts with the Pod's limits (podman run), so no initial actuation
        self.sim = KubeSim(
            pod_json(rig.cfg.cpu, rig.cfg.memory),
            actuator=self.actuator,  # type: ignore[call-arg,unused-ignore]  # the loadgen seam
            write_initial_cgroup=False,
            sync_interval=0.1,
        )
        url = await self.sim.start()
        rig.cfg.env.update(
            {
                ENV_API: url,
                ENV_POD_NAME: POD_NAME,
                ENV_POD_NAMESPACE: POD_NAMESPACE,
                "BRIDGE_CONTAINER_NAME": CONTAINER,
            }
        )
        self.resizer = KubeResizer(self.sim, url)

    async def resizer_for(self, rig: ContainerRig) -> KubeResizer:
        assert self.resizer is not None
        return self.resizer

    async def close(self) -> None:
        if self.sim is not None:
            await self.sim.stop()
        if self.resizer is not None:
            self.resizer.close()
