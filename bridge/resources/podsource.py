"""The own-Pod source: GET + watch our Pod, fetch its ResourceClaims and ResourceSlices.

Each Pod object (initial GET, then every ADDED/MODIFIED watch event) is parsed into a
:class:`~bridge.resources.pod.PodView` and handed to ``on_pod`` with the time it was seen.
Claims are fetched once per claim name (a claim cannot change under a running pod, see
docs/kubernetes.md);
slices are listed for our node when a claim first resolves. A failing slice list (no ClusterRole)
leaves device attributes unknown and is reported in ``problems``, never fatal.

Reconnects: the client resumes a watch the server ended from the last resourceVersion; when it
fails (410 Gone, network error) the source re-GETs the Pod and watches again, with capped
exponential backoff after failures.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.resources.kubeapi import KubeError
from bridge.resources.pod import (
    AllocatedDevice,
    ClaimView,
    PodView,
    SliceDevice,
    parse_claim,
    parse_pod,
    parse_slices,
    resolve_devices,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodUpdate:
    pod: PodView
    devices: tuple[AllocatedDevice, ...]
    detected_at: float
    problems: tuple[str, ...] = ()


OnPod = Callable[[PodUpdate], Awaitable[None] | None]


class PodApi(Protocol):
    """The API calls the source makes (:class:`bridge.resources.kubelight.LightkubeApi`); dicts in
    the API's JSON shape, :class:`KubeError` on failure."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def watch_pod(
        self, namespace: str, name: str, resource_version: str | None
    ) -> AsyncIterator[dict[str, Any]]: ...

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def list_slices(self, node_name: str | None) -> dict[str, Any]: ...


class PodSource:
    def __init__(
        self,
        client: PodApi,
        namespace: str,
        name: str,
        on_pod: OnPod,
        *,
        container: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_max: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self._on_pod = on_pod
        self._container = container
        self._clock = clock
        self._backoff_max = backoff_max
        self._claims: dict[str, ClaimView] = {}
        self._slices: dict[tuple[str, str, str], SliceDevice] = {}
        self._slices_loaded = False
        self.problems: list[str] = []
        self.last: PodUpdate | None = None
        self.connected = False

    async def _resolve(self, pod: PodView) -> tuple[AllocatedDevice, ...]:
        problems: list[str] = []
        for _, claim_name in pod.claim_statuses:
            if claim_name and claim_name not in self._claims:
                try:
                    claim = parse_claim(await self.client.get_claim(pod.namespace, claim_name))
                    if claim.allocated:
                        self._claims[claim_name] = claim
                except KubeError as e:
                    problems.append(f"ResourceClaim {pod.namespace}/{claim_name}: {e}")
        if self._claims and not self._slices_loaded:
            try:
                self._slices = parse_slices([await self.client.list_slices(pod.node_name)])
                self._slices_loaded = True
            except KubeError as e:
                problems.append(f"ResourceSlices: {e}")
        self.problems = problems
        return resolve_devices(pod, self._claims, self._slices, self._container)

    async def _update(self, obj: dict[str, object]) -> PodUpdate:
        detected_at = self._clock()
        pod = parse_pod(obj)
        devices = await self._resolve(pod) if pod.claim_statuses else ()
        update = PodUpdate(pod, devices, detected_at, tuple(self.problems) + pod.problems)
        self.last = update
        return update

    async def fetch_once(self) -> PodUpdate:
        """One GET of the Pod plus its claims and slices (``simbridge resources``)."""
        return await self._update(await self.client.get_pod(self.namespace, self.name))

    async def _deliver(self, obj: dict[str, object]) -> None:
        update = await self._update(obj)
        try:
            result = self._on_pod(update)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("pod update callback failed")

    async def run_once(self) -> None:
        """GET, deliver, then follow the watch until it ends."""
        obj = await self.client.get_pod(self.namespace, self.name)
        await self._deliver(obj)
        rv = parse_pod(obj).resource_version
        self.connected = True
        async for event in self.client.watch_pod(self.namespace, self.name, rv):
            kind = event.get("type")
            inner = event.get("object")
            if kind in ("ADDED", "MODIFIED") and isinstance(inner, dict):
                await self._deliver(inner)
            elif kind == "ERROR":  # e.g. 410 Gone: re-list
                log.info("pod watch error event: %s", inner)
                return
            elif kind == "DELETED":
                log.warning("own pod %s/%s deleted", self.namespace, self.name)
                return

    async def run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self.run_once()
                delay = 0.1
            except (KubeError, ValueError) as e:
                self.connected = False
                log.warning(
                    "pod watch %s/%s: %s; retry in %.1fs", self.namespace, self.name, e, delay
                )
                await asyncio.sleep(delay)
                delay = min(self._backoff_max, delay * 2)
