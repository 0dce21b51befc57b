"""A pod re-planned live (issue 31): the supervisor reads an injected cgroup directory
(``cgroup_root``, rewritten by the test as a resize would rewrite the real files) and adds or
retires processes under load; and the faults: a retiring process whose sink is stalled, a
resize the memory limit cannot follow, a process that crash-loops."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from bridge.client import EdgeClient, StreamSpec
from tests.integration.harness import ROOT, http_get, scraped
from tests.integration.test_pod import CLOUD, Pod, pod, url

MiB = 1 << 20
GiB = 1 << 30


def cgroup(tmp: Path, cores: float, memory: int | None) -> Path:
    tmp.mkdir(exist_ok=True)
    (tmp / "cpu.max").write_text(f"{int(cores * 100000)} 100000\n")
    (tmp / "memory.max").write_text(f"{memory}\n" if memory is not None else "max\n")
    (tmp / "memory.current").write_text("0\n")
    return tmp


async def until(check: Any, timeout: float = 20.0) -> bool:  # noqa: ASYNC109
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


class Fleet:
    """Devices publishing every 10 ms until stopped (each with its own count)."""

    def __init__(self, pod: Pod, devices: int) -> None:
        self.pod = pod
        self.edges = [
            EdgeClient(
                url(pod.proc.ws if n % 2 else pod.proc.grpc, "ws" if n % 2 else "grpc"),
                device_id=f"robot-{n}",
                streams=[StreamSpec("s")],
            )
            for n in range(devices)
        ]
        self.sent = [0] * devices
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Fleet:
        for n, edge in enumerate(self.edges):
            await edge.__aenter__()
            self._tasks.append(asyncio.create_task(self._run(n, edge)))
        return self

    async def _run(self, n: int, edge: EdgeClient) -> None:
        while not self._stop.is_set():
            await edge.publish("s", CLOUD)
            self.sent[n] += 1
            await asyncio.sleep(0.01)

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        for edge in self.edges:
            await edge.drain(timeout=30)
            await edge.__aexit__(None, None, None)

    def reconnects(self) -> int:
        return sum(e.stats.reconnects for e in self.edges)


def assert_all_once(fleet: Fleet, *, duplicates_allowed: bool = False) -> None:
    p = fleet.pod
    for n, sent in enumerate(fleet.sent):
        st = p.sink.record.streams[(f"robot-{n}", "s")]
        assert (st.delivered, st.lost, st.highest) == (sent, 0, sent), (n, st.report())
        assert duplicates_allowed or st.duplicates == 0, (n, st.report())
    assert p.gaps == [], f"gaps announced: {p.gaps[:5]}"


async def test_cpu_taken_away_retires_a_process_and_cpu_given_back_adds_one(
    tmp_path: Path,
) -> None:
    cg = cgroup(tmp_path / "cg", 2.0, None)
    async with pod("--processes=auto", f"--cgroup-root={cg}") as p:
        assert await p.running() == 2
        async with Fleet(p, 8) as fleet:
            await asyncio.sleep(1.0)
            cgroup(cg, 1.0, None)  # 2 -> 1 core: process 1 drains, its edges move to 0
            assert await until(lambda: _running_is(p, 1)), await p.workers()
            retired = [w for w in await p.workers() if w["index"] == 1]
            assert retired and retired[0]["last_exit"] == 0, retired  # delivered all it held
            await asyncio.sleep(1.0)
            moved = fleet.reconnects()
            assert moved >= 1  # the retired process's edges reconnected
            cgroup(cg, 2.0, None)  # 1 -> 2 cores: a process is added, no connection moves
            assert await until(lambda: _running_is(p, 2)), await p.workers()
            await asyncio.sleep(1.0)
            assert fleet.reconnects() == moved
        assert_all_once(fleet)
        info = await p.debug()
        assert info["plan"]["processes"] == 2


async def _running_is(p: Pod, n: int) -> bool:
    """``n`` processes up and none still draining."""
    states = [w["state"] for w in await p.workers()]
    return states.count("up") == n and "retiring" not in states


async def test_a_retiring_process_whose_sink_is_stalled_loses_nothing(tmp_path: Path) -> None:
    """Process 1 retires while the sink takes 2 s per batch: its drain grace (1 s) ends with
    frames undelivered, it exits 3, and its edges resend them to process 0."""
    cg = cgroup(tmp_path / "cg", 2.0, None)
    args = ("--processes=auto", f"--cgroup-root={cg}", "--drain-grace-seconds=1")
    async with pod(*args, sink_delay=0.0) as p:
        async with Fleet(p, 6) as fleet:
            await asyncio.sleep(0.5)
            p.sink.delay = 2.0  # the sink stalls
            await asyncio.sleep(0.3)
            cgroup(cg, 1.0, None)
            assert await until(lambda: _running_is(p, 1), timeout=30), await p.workers()
            retired = [w for w in await p.workers() if w["index"] == 1]
            assert retired and retired[0]["last_exit"] == 3, retired  # said: undelivered
            p.sink.delay = 0.0
            await asyncio.sleep(0.5)
        # The sink may have made a stalled batch durable after process 1 gave up on it:
        # those come again from process 0 and the sink drops them (counted, not delivered).
        assert_all_once(fleet, duplicates_allowed=True)


async def test_a_resize_the_memory_cannot_follow_keeps_fewer_processes_and_says_why(
    tmp_path: Path,
) -> None:
    cg = cgroup(tmp_path / "cg", 2.0, 2 * GiB)
    async with pod("--processes=auto", f"--cgroup-root={cg}") as p:
        assert await p.running() == 2
        cgroup(cg, 2.0, 400 * MiB)  # two cores want 2 processes; 400 MiB holds one
        assert await until(lambda: _running_is(p, 1)), (await p.workers(), p.proc.logs()[-6000:])
        plan = (await p.debug())["plan"]
        assert plan["processes"] == 1
        assert "memory" in plan["reasons"]["processes"], plan["reasons"]
        status, body = await http_get(p.proc.http, "/metrics")
        assert scraped(body, "bridge_pod_processes_planned") == [1.0]
        assert scraped(body, "bridge_pod_processes") == [1.0]
        status, _ = await http_get(p.proc.http, "/readyz")
        assert status == 200  # one process serves: ready


async def test_a_crash_loop_backs_off_logs_and_is_not_ready() -> None:
    """Every process exits at start (the CUDA backend is asked for where there is none)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        http = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge.cli",
        "serve",
        "--processes=2",
        "--ws-port=0",
        "--grpc-port=0",
        f"--http-port={http}",
        "--decimate-backend=cuda",
        "--pod-crash-loop-restarts=3",
        "--pod-restart-backoff-max-seconds=1",
        cwd=ROOT,
        env={**os.environ, "BRIDGE_CUDA_LIB": "/nonexistent/libsbv.so"},
        stderr=asyncio.subprocess.PIPE,
    )
    try:

        async def crash_looping() -> bool:
            try:
                status, body = await http_get(http, "/readyz")
            except OSError:
                return False
            return status == 503 and "crash loop" in body

        assert await until(crash_looping, timeout=30)
        status, body = await http_get(http, "/metrics")
        assert status == 200
        assert scraped(body, "bridge_pod_crash_loop") == [1.0]
        assert scraped(body, "bridge_pod_restarts_total")[0] >= 3
        status, body = await http_get(http, "/healthz")
        assert status == 200  # the supervisor itself is alive
        _, text = await http_get(http, "/debug/resources")
        workers = json.loads(text)["workers"] if text.startswith("{") else []
        assert all(w["last_exit"] in (None, 2) for w in workers), workers
    finally:
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    log = err.decode()
    assert "crash loop" in log and "restarting in 1 s" in log, log[-3000:]
