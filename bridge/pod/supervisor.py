"""The pod's lifecycle owner when ``processes`` is not 1: N ingest processes behind the same
ports, planned from the cgroup and re-planned live (docs/scaling.md "Processes in a pod").

- Ports: the WebSocket and gRPC ports are resolved once (port 0 becomes a real port) and held
  by a socket with ``SO_REUSEPORT`` that never listens, so a restarted process binds the same
  ports and no other program takes them meanwhile. Every process listens on them with
  ``SO_REUSEPORT``; the kernel spreads connections, the ownership table keeps each device in
  one process (:mod:`bridge.pod.ownership`).
- Plan: every ``POLL_SECONDS`` the cgroup is read; a changed plan starts the missing slots
  (added CPUs) or retires the highest ones (SIGTERM: the process drains as a single bridge does:
  Drain to its edges, which reconnect to the others, delivers what it holds, exits), and sends
  every process its share.
- Crashes: a process that exits unasked is restarted after a back-off (0.5 s doubling to
  ``pod_restart_backoff_max_seconds``); ``pod_crash_loop_restarts`` crashes within 60 s mark the
  pod not ready until a restarted process has stayed up ``HOLD_SECONDS``.
- SIGTERM: every process drains; the exit code says whether all delivered everything.

The supervisor imports no data plane (no gRPC, no NumPy): its RSS counts against the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bridge.config.settings import Settings
from bridge.pod.control import ControlServer, Peer
from bridge.pod.ownership import Ownership
from bridge.pod.podmetrics import PodMetrics
from bridge.pod.podplan import PodPlan, plan_pod
from bridge.pod.ports import WorkerOps
from bridge.protocol import podcontrol
from bridge.resources.cgroup import CgroupReader, open_cgroup
from bridge.resources.rss import own_rss_bytes

log = logging.getLogger("bridge.pod.supervisor")

MIB = 1 << 20
MIN_RESERVED_RSS = 48 * MIB  # measured: the supervisor with its ops server idles near 40 MiB
POLL_SECONDS = 0.2
BRIDGE_ID_MAX = 128  # the bridge_id setting's bound
RETIRE_RECONNECT_MS = 100  # a retired process's edges come back this soon (others are up)
RETIRE_SIGTERM_AFTER_S = 1.0  # then SIGTERM, for a process that did not hear "retire"
CRASH_WINDOW_SECONDS = 60.0
HOLD_SECONDS = 10.0  # a restarted process up this long ends a crash loop
FIRST_BACKOFF_SECONDS = 0.5
STOP_EXTRA_SECONDS = 10.0  # beyond drain_grace_seconds before a draining process is killed


@dataclass(slots=True)
class Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    state: str = "idle"  # idle | starting | up | retiring | backoff | stopped
    started_at: float = 0.0
    crashes: deque[float] = field(default_factory=deque)
    restarts: int = 0
    backoff: float = FIRST_BACKOFF_SECONDS
    last_exit: int | None = None
    peer: Peer | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        serve_argv: list[str],
        *,
        cgroup: CgroupReader | None = None,
        affinity: Any = None,
    ) -> None:
        self.settings = settings
        self.serve_argv = serve_argv
        self.cgroup = cgroup or open_cgroup(settings.cgroup_root)
        self._affinity = affinity or (lambda: len(os.sched_getaffinity(0)))
        self.secret = secrets.token_hex(16)
        # Each process pushes under a name of its own (its bridge_seq is its own sequence):
        # the pod's name and the slot, stable across a process's restarts.
        self.bridge_id = (
            settings.bridge_id or settings.pod_name or f"{socket.gethostname()}-{os.getpid()}"
        )
        self.ownership = Ownership(settings.pod_release_timeout_seconds + 1.0)
        self.control = ControlServer(self.ownership, self._index_of_pid, self._on_up)
        self.slots: dict[int, Slot] = {}
        self.plan: PodPlan | None = None
        self.ws_port = 0
        self.grpc_port = 0
        self.http_port = 0
        self.stopping = False
        self.crash_loop = False
        self.all_up = asyncio.Event()
        self._stop = asyncio.Event()
        self._reservations: list[socket.socket] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rss_reserved = 0
        self.metrics: PodMetrics | None = None  # set with the ops port (bridge.pod.run)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.ws_port, self.grpc_port = self._reserve_ports()
        await self.control.start()
        self.replan()
        self._spawn(self._plan_loop(), "pod-plan")

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> bool:
        """SIGTERM every process and wait for each to drain; True when all delivered all."""
        self.stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        running = [s for s in self.slots.values() if s.proc is not None and s.state != "stopped"]
        for slot in running:
            self._terminate(slot)
        limit = self.settings.drain_grace_seconds + STOP_EXTRA_SECONDS
        codes = await asyncio.gather(*(self._wait_exit(s, limit) for s in running))
        await self.control.close()
        for sock in self._reservations:
            sock.close()
        ok = all(code == 0 for code in codes)
        log.info("pod drained: exit codes %s (%s)", codes, "all delivered" if ok else "incomplete")
        return ok

    # -- the ops view (bridge.pod.ops_http) ----------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "draining"
        if self.plan is not None and self.plan.processes.refused:
            return False, self.plan.processes.reasons.get("processes", "plan refused")
        if self.crash_loop:
            return False, "crash loop: a process keeps exiting (see the log)"
        up = sum(1 for s in self.slots.values() if s.state == "up")
        if not self.all_up.is_set():
            return False, f"starting: {up} of {self.plan.count if self.plan else 0} processes up"
        if up == 0:
            return False, "no ingest process is up"
        return True, f"{up} processes up"

    def workers(self) -> list[WorkerOps]:
        """The slots of the current plan, for the ops port (scraped while alive)."""
        planned = self.plan.count if self.plan is not None else 0
        return [
            WorkerOps(
                index=w["index"],
                pid=w["pid"] or 0,
                ops=w["ops"],
                alive=w["state"] == "up" and w["ops"] is not None,
            )
            for w in self.worker_table()
            if w["index"] < planned or w["state"] in ("up", "retiring")
        ]

    def worker_table(self) -> list[dict[str, Any]]:
        out = []
        for slot in sorted(self.slots.values(), key=lambda s: s.index):
            up = slot.peer.up if slot.peer is not None else None
            out.append(
                {
                    "index": slot.index,
                    "pid": slot.pid,
                    "state": slot.state,
                    "alive": slot.state in ("up", "retiring"),
                    "ops": up["ops"] if up is not None else None,
                    "grpc_internal": up["grpc_internal"] if up is not None else None,
                    "restarts": slot.restarts,
                    "last_exit": slot.last_exit,
                }
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "plan": self.plan.as_dict() if self.plan is not None else None,
            "processes_running": sum(1 for s in self.slots.values() if s.state == "up"),
            "crash_loop": self.crash_loop,
            "owned_devices": len(self.ownership),
            "supervisor_rss_bytes": (own_rss_bytes() or 0),
            "ports": {"ws": self.ws_port, "grpc": self.grpc_port, "http": self.http_port},
            "workers": self.worker_table(),
        }

    # -- planning ------------------------------------------------------------------------------
    def replan(self) -> PodPlan:
        reading = self.cgroup.read()
        plan = plan_pod(
            self.settings,
            reading.cpu_limit_cores,
            self._affinity(),
            reading.memory_limit_bytes,
            self._reserve_rss(),
        )
        old, self.plan = self.plan, plan
        if old is None or old.as_dict() != plan.as_dict():
            log.info(
                "process plan: %d process(es), %d worker(s) each, share %s; %s",
                plan.count,
                plan.share.workers,
                plan.share.memory_limit_bytes,
                "; ".join(f"{k}: {v}" for k, v in plan.processes.reasons.items()),
            )
        self._reconcile()
        return plan

    def _reserve_rss(self) -> int:
        """The supervisor's RSS the plan counts: measured once, at the first plan after its
        imports, rounded up to 8 MiB, and fixed from then on (a plan that moved with every
        sample would re-send shares for nothing)."""
        if not self._rss_reserved:
            step = 8 * MIB
            self._rss_reserved = max(MIN_RESERVED_RSS, -(-(own_rss_bytes() or 0) // step) * step)
        return self._rss_reserved

    def _reconcile(self) -> None:
        plan = self.plan
        if plan is None or self.stopping:
            return
        target = plan.count
        if plan.processes.refused:  # keep what runs (its edges); say not ready
            target = sum(1 for s in self.slots.values() if s.state in ("up", "starting"))
        for index in range(target):
            slot = self.slots.setdefault(index, Slot(index))
            if slot.state in ("idle", "stopped"):
                self._start_slot(slot)
        for slot in self.slots.values():
            if slot.index >= target and slot.state in ("up", "starting", "backoff"):
                self._retire(slot)
        self._send_shares()

    def _send_shares(self) -> None:
        plan = self.plan
        if plan is None:
            return
        siblings = [
            {"index": w["index"], "grpc_internal": w["grpc_internal"]}
            for w in self.worker_table()
            if w["state"] == "up" and w["grpc_internal"]
        ]
        for slot in self.slots.values():
            if slot.state != "up" or slot.peer is None:
                continue
            share = {
                "memory_limit_bytes": plan.share.memory_limit_bytes,
                "cpu_cores": plan.share.cpu_cores,
                "workers": plan.share.workers,
                "processes": plan.count,
                "index": slot.index,
                "siblings": [s for s in siblings if s["index"] != slot.index],
            }
            if share != slot.peer.last_share and self.control.send(slot.index, "share", **share):
                slot.peer.last_share = share  # sent once per change, to each incarnation

    async def _plan_loop(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            self.replan()
            now = time.monotonic()
            if self.crash_loop and any(
                s.state == "up" and now - s.started_at >= HOLD_SECONDS for s in self.slots.values()
            ):
                self.crash_loop = False
                log.info("crash loop over: a restarted process has held %g s", HOLD_SECONDS)
            self.publish_metrics()

    def publish_metrics(self) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        metrics.processes.set(sum(1 for s in self.slots.values() if s.state == "up"))
        metrics.processes_planned.set(self.plan.count if self.plan is not None else 0)
        metrics.crash_loop.set(1 if self.crash_loop else 0)
        metrics.ready.set(1 if self.ready()[0] else 0)

    # -- processes -----------------------------------------------------------------------------
    def _start_slot(self, slot: Slot) -> None:
        slot.state = "starting"
        slot.started_at = time.monotonic()
        self._spawn(self._run_slot(slot), f"pod-process-{slot.index}")

    async def _run_slot(self, slot: Slot) -> None:
        env = dict(os.environ)
        env[podcontrol.ENV_CONTROL] = self.control.path
        env[podcontrol.ENV_INDEX] = str(slot.index)
        env[podcontrol.ENV_SECRET] = self.secret
        argv = [
            *self.serve_argv,
            "--processes=1",
            "--reuse-port",
            f"--ws-port={self.ws_port}",
            f"--grpc-port={self.grpc_port}",
            "--http-port=0",
            f"--bridge-id={self.bridge_id}.p{slot.index}"[:BRIDGE_ID_MAX],
        ]
        slot.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge.cli", "serve", *argv, env=env, preexec_fn=_die_with_parent
        )
        log.info("process %d started (pid %d)", slot.index, slot.proc.pid)
        code = await slot.proc.wait()
        slot.last_exit = code
        self.control.process_gone(slot.index)
        slot.peer = None
        asked = slot.state == "retiring" or self.stopping
        slot.state = "stopped"
        if asked:
            log.info(
                "process %d exited %d (%s)",
                slot.index,
                code,
                "retired" if not self.stopping else "stopped",
            )
            self._send_shares()
            return
        self._crashed(slot, code)

    def _crashed(self, slot: Slot, code: int) -> None:
        now = time.monotonic()
        slot.crashes.append(now)
        while slot.crashes and now - slot.crashes[0] > CRASH_WINDOW_SECONDS:
            slot.crashes.popleft()
        if self.metrics is not None:
            self.metrics.restarts.inc()
        if len(slot.crashes) >= self.settings.pod_crash_loop_restarts and not self.crash_loop:
            self.crash_loop = True
            log.error(
                "process %d: crash loop (%d exits within %g s, last exit %d); not ready until a "
                "restarted process holds %g s",
                slot.index,
                len(slot.crashes),
                CRASH_WINDOW_SECONDS,
                code,
                HOLD_SECONDS,
            )
            self.publish_metrics()
        delay = slot.backoff
        slot.backoff = min(slot.backoff * 2, self.settings.pod_restart_backoff_max_seconds)
        log.warning("process %d exited %d unasked; restarting in %g s", slot.index, code, delay)
        slot.state = "backoff"
        self._spawn(self._restart_later(slot, delay), f"pod-restart-{slot.index}")

    async def _restart_later(self, slot: Slot, delay: float) -> None:
        await asyncio.sleep(delay)
        if slot.state != "backoff" or self.stopping:
            return
        if self.plan is not None and slot.index >= self.plan.count:
            slot.state = "stopped"  # re-planned away meanwhile
            return
        slot.restarts += 1
        self._start_slot(slot)

    def _retire(self, slot: Slot) -> None:
        if slot.state == "backoff":
            slot.state = "stopped"
            return
        slot.state = "retiring"
        log.info(
            "retiring process %d (the plan wants %d)",
            slot.index,
            self.plan.count if self.plan else 0,
        )
        # Told first, so its Drain says "back in 100 ms" (the others are up), not the 1 s a
        # whole bridge going away says; SIGTERM follows for a process that cannot hear it.
        if self.control.send(slot.index, "retire", reconnect_after_ms=RETIRE_RECONNECT_MS):
            self._spawn(self._terminate_later(slot, RETIRE_SIGTERM_AFTER_S), "pod-retire")
        else:
            self._terminate(slot)

    async def _terminate_later(self, slot: Slot, delay: float) -> None:
        await asyncio.sleep(delay)
        if slot.state == "retiring":
            self._terminate(slot)  # a second stop request changes nothing if it heard

    def _terminate(self, slot: Slot) -> None:
        if slot.proc is not None and slot.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(signal.SIGTERM)

    async def _wait_exit(self, slot: Slot, limit: float) -> int:
        assert slot.proc is not None
        try:
            return await asyncio.wait_for(slot.proc.wait(), limit)
        except TimeoutError:
            log.error("process %d did not drain within %g s: killed", slot.index, limit)
            with contextlib.suppress(ProcessLookupError):
                slot.proc.kill()
            return await slot.proc.wait()

    def _index_of_pid(self, pid: int) -> int | None:
        for slot in self.slots.values():
            if slot.pid == pid and slot.state in ("starting", "up", "retiring"):
                return slot.index
        return None

    def _on_up(self, peer: Peer) -> None:
        slot = self.slots.get(peer.index)
        if slot is None:
            return
        slot.peer = peer
        if slot.state == "starting":
            slot.state = "up"
            slot.backoff = FIRST_BACKOFF_SECONDS if not slot.crashes else slot.backoff
        log.info("process %d up (pid %d, ops %s)", peer.index, peer.pid, peer.up and peer.up["ops"])
        self._send_shares()
        if self.plan is not None and all(
            self.slots.get(i) is not None and self.slots[i].state == "up"
            for i in range(self.plan.count)
        ):
            self.all_up.set()

    def _reserve_ports(self) -> tuple[int, int]:
        """Bind (never listen) the ingest ports with SO_REUSEPORT; port 0 becomes a real one."""
        host = self.settings.host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ports = []
        for port in (self.settings.ws_port, self.settings.grpc_port):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            self._reservations.append(sock)
            ports.append(int(sock.getsockname()[1]))
        return ports[0], ports[1]

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s failed", task.get_name(), exc_info=task.exception())


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (even by SIGKILL), so no
    ingest process outlives its owner; it then drains as on any SIGTERM."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the control channel's close still ends it
        pass
