"""The :class:`KubeSim` facade: one Pod's store, its kubelet and the API server, composed and run
together, plus the knobs tests and demos turn (node room, device health, memory usage)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any

from loadgen.kubesim.cgroup import CgroupActuator, CgroupDir
from loadgen.kubesim.kubelet import Actuator, Kubelet
from loadgen.kubesim.model import JSON, NodeModel, PodStore
from loadgen.kubesim.server import ApiServer


class KubeSim:
    """API server + kubelet stand-in for one Pod. Use ``async with KubeSim(...) as sim``.

    ``actuator`` makes the kubelet's decisions real (see :mod:`loadgen.kubesim.kubelet`); by
    default, with ``cgroup_dir``, the cgroup files in that directory are written."""

    def __init__(
        self,
        pod: JSON,
        *,
        claims: Iterable[JSON] = (),
        slices: Iterable[JSON] = (),
        cgroup_dir: str | None = None,
        container: str | None = None,
        node: NodeModel | None = None,
        sync_interval: float = 0.05,
        actuation_delay: float = 0.0,
        claims_block_resize: bool = False,
        write_initial_cgroup: bool = True,
        actuator: Actuator | None = None,
    ) -> None:
        self.store = PodStore(
            pod, claims=claims, slices=slices, claims_block_resize=claims_block_resize
        )
        names = self.store.container_names
        self.container = container or ("bridge" if "bridge" in names else (names or [""])[0])
        self.node = node or NodeModel(
            name=self.store.pod.get("spec", {}).get("nodeName", "gpu-node-a")
        )
        self.cgroup = CgroupDir(cgroup_dir) if cgroup_dir else None
        if actuator is None and self.cgroup is not None:
            actuator = CgroupActuator(self.cgroup)
        self.kubelet = Kubelet(
            self.store,
            self.node,
            container=self.container,
            actuator=actuator,
            sync_interval=sync_interval,
            actuation_delay=actuation_delay,
        )
        self.store.on_resize = self.kubelet.kick
        self.api = ApiServer(self.store, self.kubelet)
        self._write_initial = write_initial_cgroup
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        return self.api.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        if self._write_initial:
            await self.kubelet.start_actuator()
        await self.api.start(host, port)
        self._spawn(self.kubelet.run())
        return self.url

    async def stop(self) -> None:
        self.api.close()
        pending = set(self._tasks)
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.api.wait_closed(), 1)

    async def __aenter__(self) -> KubeSim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ state (tests, demo)

    @property
    def pod(self) -> JSON:
        return self.store.pod

    @property
    def events(self) -> list[JSON]:
        return self.store.events

    @property
    def requests_seen(self) -> list[tuple[str, str]]:
        return self.api.requests_seen

    @property
    def last_authorization(self) -> str | None:
        return self.api.last_authorization

    def condition(self, ctype: str) -> JSON | None:
        """The Pod condition of that type, if present."""
        return self.store.condition(ctype)

    def apply_resize_patch(self, body: Any, content_type: str) -> tuple[int, JSON]:
        """What ``PATCH pods/{name}/resize`` does, without HTTP."""
        return self.store.apply_resize_patch(body, content_type)

    async def sync(self) -> None:
        """One kubelet sync now, awaited."""
        async with self.kubelet.lock:
            await self.kubelet.sync()

    # ------------------------------------------------------------------ control (tests, demo)

    def set_node_others(self, cpu_m: int | None = None, memory: int | None = None) -> None:
        """Change what the other pods request (frees or takes room; Deferred is re-evaluated)."""
        if cpu_m is not None:
            self.node.others_cpu_m = cpu_m
        if memory is not None:
            self.node.others_memory = memory
        self.kubelet.kick()

    def set_device_health(self, resource_id: str, health: str, message: str = "") -> None:
        """See :meth:`PodStore.set_device_health`."""
        self.store.set_device_health(resource_id, health, message)

    @property
    def open_watches(self) -> int:
        """Watch streams currently being served."""
        return self.api.open_watches

    def end_watches(self) -> None:
        """End every open watch stream, as an API server restart or watch timeout does."""
        self.api.end_watches()

    def kick(self) -> None:
        """Run a kubelet sync now."""
        self.kubelet.kick()
