"""The lifecycle owner: builds every part, starts the listeners, and shuts down in a fixed order.

Startup: settings → core → worker pool + decimator → gRPC / WebSocket / HTTP listeners → sink
pusher → ready. Shutdown (SIGTERM): not ready → refuse new edges → ``Drain`` to every edge →
deliver what is buffered to the sink within the grace period → final acks → close → exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from bridge.config.settings import Settings
from bridge.decimate import get_decimator
from bridge.decimate.batch import GpuBatcher
from bridge.decimate.cuda import use_library as use_cuda_library
from bridge.protocol import codec
from bridge.protocol.errors import StartupError
from bridge.resources.from_settings import RESERVE_FRACTION, MiB
from bridge.resources.rss import own_rss_bytes
from bridge.server.capacity import Capacity
from bridge.server.core import BridgeCore
from bridge.server.events import CoreEvents
from bridge.server.governor import Governor
from bridge.server.grpc_impl import build_server, set_health
from bridge.server.http_impl import OpsHttpServer
from bridge.server.ingest import EdgeRegistry
from bridge.server.ingest_config import IngestConfig
from bridge.server.looplag import LoopLagMonitor
from bridge.server.memtrim import release_free_heap
from bridge.server.metrics import BridgeMetrics
from bridge.server.ownership_gate import OwnershipGate
from bridge.server.podlink import PodEnv, PodLink
from bridge.server.ports import CoreConfig
from bridge.server.processing import Processor
from bridge.server.push_impl import SinkPusher
from bridge.server.ring import Policy
from bridge.server.subscribers import SubscriberSet
from bridge.server.tls import grpc_server_credentials
from bridge.server.trimpolicy import HeapTrimPolicy
from bridge.server.workers import WorkerPool
from bridge.server.ws_impl import WsServer, start_ws_server

log = logging.getLogger("bridge.server.app")


@dataclass(frozen=True, slots=True)
class BoundPorts:
    ws: int
    grpc: int
    http: int


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class BridgeService:
    """Builds the parts, wires each adapter to its port, and owns start and shutdown. No adapter
    imports this module: they see only the Protocols in ``bridge.server.ports``."""

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        pod: PodEnv | None = None,
    ) -> None:
        self.settings = settings
        # One process of a pod (docs/pod-worker.md): from the supervisor's environment.
        self.pod_env = pod if pod is not None else PodEnv.from_environ()
        self.podlink: PodLink | None = None  # connected in start() in a pod
        self.grpc_internal = ""  # the private gRPC listener in a pod (host:port)
        self.registry = registry or CollectorRegistry()
        self.metrics = BridgeMetrics(self.registry)
        self.limits = codec.Limits(
            max_frame_bytes=settings.max_frame_bytes,
            max_points=settings.max_points,
            max_streams_per_session=settings.max_streams_per_session,
            max_telemetry_bytes=settings.max_telemetry_bytes,
            max_telemetry_entries=settings.max_telemetry_entries,
            max_batch_frames=settings.max_batch_frames,
            max_cloud_fields=settings.max_cloud_fields,
        )
        self.events = CoreEvents(self.metrics)
        # Until the adapter plans from the memory limit (or without it): the configured budget.
        self.governor = Governor(
            settings.ring_budget_bytes, math.floor(RESERVE_FRACTION * settings.ring_budget_bytes)
        )
        self.metrics.watch_governor(self.governor)
        self.core = BridgeCore(
            CoreConfig(
                limits=self.limits,
                max_sessions=settings.max_sessions,
                default_voxel_size=settings.voxel_size,
                default_policy=Policy(settings.overflow_policy),
                default_passthrough=settings.passthrough,
            ),
            self.events,
            self.governor,
        )
        self.core.auto_ack = not settings.sink_address
        self.subscribers = SubscriberSet(self.core.egress, self.governor)
        self.edges = EdgeRegistry(
            self.core, IngestConfig.from_settings(settings, self.limits), self.metrics
        )
        self.events.edges = self.edges
        self.events.viewers = self.subscribers
        self.ready = False
        self.ports: BoundPorts | None = None
        self.pool = WorkerPool(settings.workers or default_workers())
        self.processor: Processor | None = None
        self.capacity: Capacity | None = None
        self.pusher: SinkPusher | None = None
        self.adapter: Any = None  # bridge.resources.adapt.Adapter when available
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._ws_server: WsServer | None = None
        self._grpc_server: Any = None
        self._health: Any = None
        self._http: OpsHttpServer | None = None
        self._baseline_rss = _rss_bytes()
        self._trim = HeapTrimPolicy(
            slack_bytes=max(32 * MiB, 2 * settings.max_frame_bytes),
            idle_seconds=settings.heap_trim_idle_seconds,
        )

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> BoundPorts:
        """Start every part in order; when a step fails, what already started is closed again
        (no listener or task outlives a failed start)."""
        try:
            return await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> BoundPorts:
        settings = self.settings
        if self.pod_env is not None:  # before any listener: every Hello claims its device
            await self._join_pod(self.pod_env)
        if settings.cuda_lib:
            use_cuda_library(settings.cuda_lib)
        decimator = get_decimator(settings.decimate_backend)
        cpu_decimator = (
            decimator if decimator.name != "cuda" else get_decimator("c" if _has("c") else "numpy")
        )
        if decimator.name == "cuda":  # concurrent frames share one device batch
            decimator = GpuBatcher(decimator, cpu_decimator)
        self.metrics.publish_backend(decimator.name)
        self.processor = Processor(
            self.core,
            self.pool,
            decimator,
            depth=settings.worker_depth,
            on_done=self._on_processed,
            governor=self.governor,
        )
        self.events.work = self.processor.notify
        self.capacity = Capacity(
            self.core,
            self.pool,
            self.processor,
            self.metrics,
            decimator=decimator,
            cpu_decimator=cpu_decimator,
            pinned_workers=bool(settings.workers),
            baseline_rss=self._baseline_rss,
        )
        self.metrics.workers.set(self.pool.size)
        # Read at scrape time: the per-stream share changes with every stream added or gone.
        self.metrics.ring_capacity.set_function(lambda: self.core.ring_capacity_per_stream)
        self._grpc_server, self._health = build_server(
            settings,
            self.edges,
            self.subscribers,
            self.metrics,
            self.governor,
            pod=lambda: self.podlink,  # a viewer here also sees the siblings' devices
        )
        grpc_address = f"{settings.host}:{settings.grpc_port}"
        credentials = grpc_server_credentials(settings)
        try:
            grpc_port = (
                self._grpc_server.add_secure_port(grpc_address, credentials)
                if credentials is not None
                else self._grpc_server.add_insecure_port(grpc_address)
            )
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise StartupError(f"cannot listen on {grpc_address} (gRPC): {exc}") from None
        if not grpc_port:
            raise StartupError(f"cannot listen on {grpc_address} (gRPC)")
        if self.podlink is not None:  # the siblings' way in (cross-process Subscribe)
            internal = self._grpc_server.add_insecure_port("127.0.0.1:0")
            if not internal:
                raise StartupError("cannot listen on 127.0.0.1:0 (private gRPC)")
            self.grpc_internal = f"127.0.0.1:{internal}"
        await self._grpc_server.start()
        try:
            self._ws_server = await start_ws_server(
                self.edges, settings, self.metrics, self.governor
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {settings.host}:{settings.ws_port} (WebSocket): {exc.strerror}"
            ) from None
        ws_port = next(iter(self._ws_server.sockets)).getsockname()[1]
        self._http = OpsHttpServer(
            self.registry,
            is_live=lambda: True,
            is_ready=lambda: self.ready,
            describe_resources=self.describe_resources,
            token=settings.auth_token,
            metrics_open=settings.metrics_auth == "open",
            on_unauthorized=lambda path: self.metrics.unauthorized.labels("http").inc(),
        )
        try:
            http_port = (
                await self._http.start(settings.host, settings.http_port)
                if self.podlink is None  # in a pod the supervisor owns the ops port
                else await self._http.start("127.0.0.1", 0, public=False)
            )
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {settings.host}:{settings.http_port} (HTTP): {exc.strerror}"
            ) from None
        self._spawn(
            LoopLagMonitor(self.metrics.loop_lag, busy=self.metrics.loop_busy).run(), "loop-lag"
        )
        self.ports = BoundPorts(ws=ws_port, grpc=grpc_port, http=http_port)
        if settings.sink_address:
            self.pusher = SinkPusher(self.core, settings, self.metrics, self.governor)
            self.events.committed = self.pusher.wake
            self._spawn(self.pusher.run(), "sink-pusher")
        self._spawn(self._housekeeping(), "housekeeping")
        await self._start_adapter(self.capacity)
        await set_health(self._health, True)
        self.ready = True
        self.metrics.ready.set(1)
        if self.podlink is not None:
            self.podlink.up(
                ops=f"127.0.0.1:{http_port}",
                grpc_internal=self.grpc_internal,
                ws=ws_port,
                grpc=grpc_port,
            )
        log.info(
            "simbridge ready: ws :%d%s grpc :%d http :%d, backend %s, %d workers, sink %s",
            ws_port,
            "/v1/ingest",
            grpc_port,
            http_port,
            decimator.name,
            self.pool.size,
            settings.sink_address or "(none: auto-ack)",
        )
        return self.ports

    async def _start_adapter(self, target: Capacity) -> None:
        """Watch cgroup limits (and the own Pod / GPU where present) and re-plan live."""
        if not self.settings.adapt:
            return
        from bridge.resources.adapt import Adapter

        self.adapter = Adapter.from_settings(target, self.registry, self.settings)
        if self.podlink is not None and self.podlink.share is not None:
            self.adapter.set_share(self.podlink.share)
        await self.adapter.start()

    def _retire(self, reconnect_after_ms: int) -> None:
        """The pod re-planned without this process: drain as on SIGTERM, but the edges may come
        back at once (the kernel hands them to the processes that stay)."""
        self.edges.drain_reconnect_ms = reconnect_after_ms
        self.request_stop()

    async def _join_pod(self, env: PodEnv) -> None:
        """Connect to the supervisor; claims at Hello, releases, shares and forgets go through
        it. Its channel closing ends this process (drained as on SIGTERM)."""
        link = PodLink(
            env,
            claim_timeout=self.settings.pod_claim_timeout_seconds,
            on_share=self._on_share,
            on_lost=self.request_stop,
        )
        try:
            await link.connect()
        except OSError as exc:
            raise StartupError(
                f"cannot reach the pod's supervisor at {env.control}: {exc}"
            ) from None
        self.podlink = link
        link.on_retire = self._retire
        self.edges.pod = OwnershipGate(
            link,
            self.core,
            self.edges,
            self.metrics,
            release_timeout=self.settings.pod_release_timeout_seconds,
        )
        self.core.on_forget = link.forget

    def _on_share(self, share: Any) -> None:
        """The supervisor's plan changed: this process plans from its new share. With ``adapt``
        off only the share's worker count applies (unless ``workers`` is set): N processes
        each sized for the whole pod's CPUs would oversubscribe them N times."""
        log.info(
            "pod share: process %d of %d, %d workers, memory %s, cpu %s",
            share.index,
            share.processes,
            share.workers,
            share.memory_limit_bytes,
            share.cpu_cores,
        )
        if self.adapter is not None:
            self.adapter.set_share(share)
        elif self.capacity is not None and not self.settings.workers:
            self.capacity.resize_workers(share.workers)

    def describe_resources(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "workers": self.pool.size,
            "ring_capacity_per_stream_bytes": self.core.ring_capacity_per_stream,
            "ring_occupancy_bytes": self.core.buffered_bytes,
            "memory": {
                **self.governor.describe(),
                "resident_bytes": _rss_bytes(),
                "baseline_bytes": self._baseline_rss,
                "max_frame_bytes_now": self.core.limits_now().max_frame_bytes,
            },
            "streams": len(self.core.streams),
            "decimate_backend": self.processor.decimator.name
            if self.processor and self.processor.decimator
            else None,
        }
        if self.adapter is not None:
            info["adapter"] = self.adapter.describe()
        if self.podlink is not None:
            share = self.podlink.share
            info["pod"] = {
                "index": self.podlink.index,
                "connected": self.podlink.connected,
                "grpc_internal": self.grpc_internal,
                "share": None if share is None else share.as_dict(),
            }
        return info

    def _on_processed(self, item: Any, spent: float, error: str | None) -> None:
        if error is not None:
            self.metrics.processing_errors.inc()
            log.warning(
                "stream %s seq %d delivered raw: %s", item.stream.key, item.frame.seq, error
            )
        elif spent:
            backend = (
                self.processor.decimator.name
                if self.processor and self.processor.decimator
                else "none"
            )
            self.metrics.decimation_seconds.labels(backend).observe(spent)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def _housekeeping(self) -> None:
        while True:
            expired = self.core.expire(time.monotonic(), self.settings.session_ttl_seconds)
            self.edges.forget(expired)
            self.metrics.ring_occupancy.set(self.core.buffered_bytes)
            self.metrics.ring_frames.set(self.core.buffered_frames)
            capacity = self.capacity
            if capacity is not None and capacity.trim_pending and capacity.within_budget():
                # The shrink has drained: hand the freed heap back so memory.current falls and
                # the kubelet's check for a pending memory decrease passes.
                capacity.trim_pending = False
                released = await asyncio.to_thread(release_free_heap)
                self._trim.trimmed(time.monotonic())
                log.info("memory shrink drained; free heap %s", "released" if released else "kept")
            elif self._trim.decide(
                time.monotonic(),
                _rss_bytes(),
                self._baseline_rss,
                self.governor.total_bytes,
                self.governor.budget_bytes,
                self._planned_memory_limit(),
            ):
                # Frames were freed but their pages stay in the heap: give them back.
                await asyncio.to_thread(release_free_heap)
            await asyncio.sleep(0.25)

    def _planned_memory_limit(self) -> int | None:
        """The memory limit the current plan is sized for (a held decrease included)."""
        plan = self.adapter.plan if self.adapter is not None else None
        return plan.memory_limit_bytes if plan is not None else None

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> bool:
        """Drain and close. Returns True when everything buffered was delivered in time."""
        settings = self.settings
        self.ready = False
        self.metrics.ready.set(0)
        if self._health is not None:
            await set_health(self._health, False)
        log.info(
            "draining: %d edges, %d frames buffered",
            len(self.edges),
            self.core.buffered_frames,
        )
        await self.edges.drain()
        deadline = time.monotonic() + settings.drain_grace_seconds
        while self.core.buffered_frames and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # polling a count: simpler than an event per ack
        delivered_all = self.core.buffered_frames == 0
        await self.edges.final_acks()
        if not delivered_all:
            log.warning(
                "grace period over with %d frames undelivered (edges will resend them)",
                self.core.buffered_frames,
            )
        await self.close()
        log.info("drained (%s)", "all delivered" if delivered_all else "incomplete")
        return delivered_all

    async def close(self) -> None:
        """Stop everything now (idempotent, and safe after a partial start)."""
        self.ready = False
        if self.adapter is not None:
            await self.adapter.stop()
            self.adapter = None
        await self.edges.close()
        if self.podlink is not None:
            self.core.on_forget = None  # closing forgets every session: the supervisor knows
            await self.podlink.close()
        if self._ws_server is not None:
            self._ws_server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws_server.wait_closed(), 3)
            self._ws_server = None
        self.subscribers.close_all()
        if self._grpc_server is not None:
            await self._grpc_server.stop(grace=1.0)
            self._grpc_server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None
        # Joining worker threads blocks: off the loop (the loop guard in tests caught it).
        await asyncio.to_thread(self.pool.close, 2.0)
        self.core.close()  # what the rings and sessions held goes back to the governor
        if self.governor.debug:  # SIMBRIDGE_CHARGE_DEBUG (tests): nothing may be left...
            standing = self.capacity.standing_charges() if self.capacity is not None else []
            self.governor.check_all_released(standing=standing)  # ...but the kernel's scratch


def _rss_bytes() -> int:
    """This process's resident bytes, 0 where /proc is not there (tests stand in for it here)."""
    return own_rss_bytes() or 0


def _has(backend: str) -> bool:
    from bridge.decimate import available_backends

    return available_backends().get(backend) is None
