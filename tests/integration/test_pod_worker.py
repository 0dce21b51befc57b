"""The worker side of a pod (issue 31, docs/pod-worker.md): a ``simbridge serve`` process started
by the supervisor (env ``SIMBRIDGE_POD_CONTROL``) claims each Hello's device, releases devices
other processes claim, plans from its share, tags its logs and lives no longer than its
supervisor's channel.

The supervisor is :class:`tests.support.fake_pod.FakeSupervisor` (a real Unix socket speaking
``bridge.protocol.podcontrol``); workers are real ``python -m bridge.cli serve`` processes where
their lifecycle is the point, in-process ``BridgeService``s otherwise; edges are the SDK's
``EdgeClient`` or the protocol-only client of ``tests/support/protocol_client.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from bridge.client import EdgeClient, StreamSpec
from bridge.server.app import BridgeService
from bridge.server.podlink import PodEnv
from bridge.v1 import bridge_pb2 as pb
from loadgen.kubesim.cgroup import CgroupDir
from loadgen.sink import SinkServer
from tests.integration.harness import ROOT, bridge_settings, http_get, metric, wait_until, ws_url
from tests.support.fake_pod import FakeSupervisor
from tests.support.protocol_client import Edge, Refused, cloud, ws_opener
from tests.support.switchproxy import SwitchProxy

MiB = 1 << 20
CLOUD = np.zeros((4, 3), np.float32)
POINTS = cloud([(1.0, 2.0, 3.0)])


class StalledSink(SinkServer):
    """A sink that takes no batch while ``flowing`` is clear (its pushes wait, unacknowledged)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(fsync=False, **kw)
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def _record_batch(self, batch: list[tuple[pb.ProcessedFrame, int]]) -> int:
        await self.flowing.wait()
        return await super()._record_batch(batch)


@asynccontextmanager
async def worker(sup: FakeSupervisor, index: int, **overrides: Any) -> AsyncIterator[BridgeService]:
    """An in-process worker of ``sup``'s pod, up (its ``up`` received)."""
    service = BridgeService(
        bridge_settings(**overrides), CollectorRegistry(), pod=PodEnv(sup.path, index, sup.secret)
    )
    await service.start()
    try:
        await sup.wait_up(index)
        yield service
    finally:
        await service.close()


class WorkerProcess:
    """``python -m bridge.cli serve --processes 1 --reuse-port`` as the supervisor starts one."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc, self.log = proc, log

    @classmethod
    async def start(cls, sup: FakeSupervisor, index: int, tmp: Path, *args: str) -> WorkerProcess:
        log = tmp / f"worker{index}.log"
        cmd = [sys.executable, "-m", "bridge.cli", "serve", "--processes", "1", "--reuse-port"]
        cmd += ["--host", "127.0.0.1", "--ws-port", "0", "--grpc-port", "0", "--http-port", "0"]
        env = {**os.environ, "BRIDGE_ADAPT": "false", **sup.env(index)}
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *cmd, *args, cwd=ROOT, env=env, stdout=out, stderr=out
            )
        return cls(proc, log)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait(self, timeout: float = 10.0) -> int:  # noqa: ASYNC109
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


async def publish(edge: EdgeClient, n: int) -> None:
    for _ in range(n):
        await edge.publish("s", CLOUD)
    await edge.drain(timeout=10)


async def test_a_granted_claim_attaches_the_device_in_a_worker_process(tmp_path: Path) -> None:
    """A real worker: it connects to the supervisor, reports ``up`` (its internal ops HTTP, its
    private gRPC listener, the public ports), claims the device of each Hello and attaches it
    once granted; its text log lines carry ``proc=<index>``; SIGTERM drains and exits 0."""
    async with FakeSupervisor() as sup:
        worker_proc = await WorkerProcess.start(sup, 3, tmp_path)
        try:
            up = await sup.wait_up(3, timeout=30)
            assert up["pid"] == worker_proc.proc.pid
            assert port_of(up["grpc_internal"]) not in (0, up["grpc"])
            assert up["ops"].startswith("127.0.0.1:")
            status, _ = await http_get(port_of(up["ops"]), "/readyz")
            assert status == 200
            url = f"ws://127.0.0.1:{up['ws']}/v1/ingest"
            edge = EdgeClient(url, device_id="robot", streams=[StreamSpec("s")])
            async with edge:
                await publish(edge, 5)
            assert sup.claims == [(3, "robot", True)]
            assert edge.stats.reconnects == 0
            worker_proc.proc.send_signal(signal.SIGTERM)
            assert await worker_proc.wait() == 0
        finally:
            worker_proc.kill()
        lines = [line for line in worker_proc.logs().splitlines() if " bridge." in line]
        assert lines and all(" proc=3 bridge." in line for line in lines), lines[:3]


async def test_the_worker_exits_when_the_control_channel_closes(tmp_path: Path) -> None:
    """The supervisor is the worker's lifecycle owner: when its channel closes (it died), the
    worker drains as on SIGTERM and exits (0: nothing undelivered); JSON log lines carry
    ``"proc": <index>``."""
    async with FakeSupervisor() as sup:
        worker_proc = await WorkerProcess.start(sup, 1, tmp_path, "--log-format", "json")
        try:
            await sup.wait_up(1, timeout=30)
            sup.drop(1)
            assert await worker_proc.wait(timeout=10) == 0
        finally:
            worker_proc.kill()
    entries = [json.loads(x) for x in worker_proc.logs().splitlines() if x.startswith("{")]
    assert entries and all(e.get("proc") == 1 for e in entries)
    assert any("supervisor is gone" in e["msg"] for e in entries)


async def test_a_refused_claim_refuses_that_edge_only() -> None:
    """``claimed{granted: false}``: the Hello is refused with SessionTaken (UNAUTHENTICATED,
    close 1008), as a single process refuses a Hello for a device whose session is live; the
    other device's session goes on."""
    async with FakeSupervisor() as sup, worker(sup, 0) as w:
        sup.answers["intruder"] = "refuse"
        good = EdgeClient(ws_url(w), device_id="robot", streams=[StreamSpec("s")])
        async with good:
            await publish(good, 3)
            spec = pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)
            with pytest.raises(Refused) as refused:
                await Edge("intruder", [spec]).connect(ws_opener(ws_url(w)))
            error, end = refused.value.error, refused.value.end
            assert error is not None and error.code == pb.UNAUTHENTICATED and error.fatal
            assert "has a live session" in error.message
            assert end is not None and end.ws_code == 1008
            await publish(good, 3)
        assert good.stats.reconnects == 0
        assert ("intruder" in {d for _, d, _ in sup.claims}) and "intruder" not in w.core.by_device
        assert metric(w, "bridge_rejected_messages_total", transport="ws", reason="session_taken")


async def test_an_unanswered_claim_is_refused_retryably() -> None:
    """No ``claimed`` within ``pod_claim_timeout_seconds``: the Hello is refused with the wire
    error of ``too_many_pending`` (TOO_MANY_SESSIONS, close 1013 "try again later"), which every
    client retries; once the supervisor answers, the same device is welcomed."""
    async with FakeSupervisor() as sup, worker(sup, 0, pod_claim_timeout_seconds=0.3) as w:
        sup.answers["robot"] = "silent"
        spec = pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)
        edge = Edge("robot", [spec])
        began = asyncio.get_running_loop().time()
        with pytest.raises(Refused) as refused:
            await edge.connect(ws_opener(ws_url(w)))
        took = asyncio.get_running_loop().time() - began
        error, end = refused.value.error, refused.value.end
        assert error is not None and error.code == pb.TOO_MANY_SESSIONS
        assert "ownership in the pod unknown" in error.message
        assert end is not None and end.ws_code == 1013
        assert 0.3 <= took < 2.0
        sup.answers["robot"] = "grant"
        welcome = await edge.connect(ws_opener(ws_url(w)))
        assert welcome.session_id and "robot" in w.core.by_device
        await edge.disconnect()


async def test_release_with_undelivered_frames_answers_in_time_and_nothing_is_lost() -> None:
    """Q holds 10 frames the stalled sink has not taken when the device moves to P. Q answers
    the release within ``pod_release_timeout_seconds`` with what it delivered, keeps the frames
    (no drop) and pushes them once the sink flows; P resumes the device above Q's delivered
    map. At the sink: every frame once, none lost."""
    async with AsyncExitStack() as stack:
        sink = StalledSink()
        await stack.enter_async_context(sink)
        sup = await stack.enter_async_context(FakeSupervisor())
        common = {"sink_address": sink.address, "pod_release_timeout_seconds": 1.0}
        q = await stack.enter_async_context(worker(sup, 0, **common))
        p = await stack.enter_async_context(worker(sup, 1, **common))
        assert q.ports is not None and p.ports is not None
        proxy = await stack.enter_async_context(SwitchProxy(q.ports.ws))
        url = f"ws://127.0.0.1:{proxy.port}/v1/ingest"
        edge = EdgeClient(url, device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            await publish(edge, 10)  # delivered by Q
            sink.flowing.clear()
            for _ in range(10):
                await edge.publish("s", CLOUD)
            assert await wait_until(lambda: q.core.buffered_frames == 10)
            proxy.switch(p.ports.ws)  # the device's connection drops; it reconnects to P
            assert await wait_until(lambda: bool(sup.releases and sup.releases[0].answer))
            release = sup.releases[0]
            assert release.answer is not None
            assert (release.index, release.answer["ok"]) == (0, True)
            assert release.answer["delivered"] == {"s": 10}
            assert 0.9 <= release.seconds < 1.5, release.seconds  # waited, then answered
            assert q.core.buffered_frames == 10  # kept, not dropped
            sink.flowing.set()
            await publish(edge, 10)  # on P
        assert [c for c in sup.claims] == [(0, "robot", True), (1, "robot", True)]
        assert await wait_until(lambda: q.core.buffered_frames == 0)  # Q delivered its copies
        st = sink.record.streams[("robot", "s")]
        assert (st.delivered, st.lost, st.highest) == (30, 0, 30)


async def test_back_on_a_worker_holding_its_stale_session_no_false_gap() -> None:
    """Q -> P -> Q: back on Q, which still holds the device's detached session, the device
    resumes above what P delivered (P's released map and the Hello's delivered_seq): no gap is
    announced, nothing is lost or delivered twice."""
    gaps: list[pb.Gap] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.gap.count:
            gaps.append(frame.gap)

    async with AsyncExitStack() as stack:
        sink = await stack.enter_async_context(SinkServer(fsync=False, on_frame=on_frame))
        sup = await stack.enter_async_context(FakeSupervisor())
        q = await stack.enter_async_context(worker(sup, 0, sink_address=sink.address))
        p = await stack.enter_async_context(worker(sup, 1, sink_address=sink.address))
        assert q.ports is not None and p.ports is not None
        proxy = await stack.enter_async_context(SwitchProxy(q.ports.ws))
        url = f"ws://127.0.0.1:{proxy.port}/v1/ingest"
        edge = EdgeClient(url, device_id="robot", streams=[StreamSpec("s")])
        async with edge:
            await publish(edge, 20)  # on Q
            proxy.switch(p.ports.ws)
            await publish(edge, 20)  # on P
            assert not q.core.by_device["robot"].attached  # Q's stale session
            proxy.switch(q.ports.ws)
            await publish(edge, 20)  # on Q again
        assert edge.stats.reconnects == 2
        released = [r.answer["delivered"] for r in sup.releases if r.answer is not None]
        assert released == [{"s": 20}, {"s": 40}]
        st = sink.record.streams[("robot", "s")]
        assert (st.delivered, st.lost, st.highest, st.duplicates) == (60, 0, 60, 0)
        assert gaps == [] and st.gap_markers == 0


async def test_the_claimed_delivered_map_sets_where_stale_and_new_streams_resume() -> None:
    """The grant carries what the previous owner delivered. A stale detached session here
    (stream ``s`` at 5) and a stream new to this process (``t``) both start above it, although
    the Hello only knew ``s`` up to 9: the Welcome says 12 and 7, and frame 13 is no gap."""
    async with FakeSupervisor() as sup, worker(sup, 0) as w:
        specs = [pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)]
        first = Edge("robot", specs)
        await first.connect(ws_opener(ws_url(w)))
        for _ in range(5):
            await first.publish("s", POINTS)
        assert await first.wait_delivered("s", 5)
        await first.disconnect()
        session = w.core.by_device["robot"]
        assert await wait_until(lambda: not session.attached)
        sup.grant_delivered["robot"] = {"s": 12, "t": 7}  # another process got this far
        specs.append(pb.StreamSpec(stream_id="t", kind=pb.POINT_CLOUD))
        back = Edge("robot", specs)
        back.session_id = "a-token-of-another-process"
        back.streams["s"].delivered, back.streams["s"].next_seq = 9, 13
        welcome = await back.connect(ws_opener(ws_url(w)))
        states = {s.stream_id: (s.delivered_seq, s.accepted_seq) for s in welcome.streams}
        assert welcome.resumed and states == {"s": (12, 12), "t": (7, 7)}
        await back.publish("s", POINTS)  # seq 13
        assert await back.wait_delivered("s", 13)
        assert w.core.by_device["robot"].streams["s"].upstream_gap_frames == 0
        assert not back.errors
        await back.disconnect()


async def test_release_is_refused_while_the_device_is_live_here() -> None:
    """A live incumbent that answers the ping keeps its session (``ok=false, "taken"``), as
    does a Hello for the device still in progress here; the session's own resume token
    supersedes the live connection and the release goes on."""
    async with FakeSupervisor() as sup, worker(sup, 0, pod_claim_timeout_seconds=0.5) as w:
        spec = pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)
        edge = Edge("robot", [spec])
        await edge.connect(ws_opener(ws_url(w)))
        await edge.publish("s", POINTS)
        assert await edge.wait_delivered("s", 1)
        answer = await sup.release(0, "robot")
        assert (answer["ok"], answer["reason"]) == (False, "taken")
        assert metric(w, "bridge_session_challenges_total", result="alive") == 1
        assert w.core.by_device["robot"].attached
        # a Hello whose claim is still unanswered counts as live too
        sup.answers["waiting"] = "silent"
        pending = asyncio.create_task(Edge("waiting", [spec]).connect(ws_opener(ws_url(w))))
        assert await wait_until(lambda: any(d == "waiting" for _, d, _ in sup.claims))
        answer = await sup.release(0, "waiting")
        assert (answer["ok"], answer["reason"]) == (False, "taken")
        with pytest.raises(Refused):
            await pending
        # the resume token takes it over: the live connection is superseded (1001)
        answer = await sup.release(0, "robot", token=edge.session_id)
        assert (answer["ok"], answer["delivered"]) == (True, {"s": 1})
        assert await wait_until(lambda: edge.end is not None)
        assert edge.end is not None and edge.end.ws_code == 1001
        assert not w.core.by_device["robot"].attached


async def test_a_share_changes_the_workers_plan(tmp_path: Path) -> None:
    """The worker plans from its share, not the whole cgroup: the share's memory limit sizes
    the ring budget, the share's worker count is the pool's; a new share re-plans it. Seen in
    the worker's /debug/resources (its internal ops port); the siblings are kept for Subscribe."""
    cg = CgroupDir(str(tmp_path), version="v2")
    cg.write_memory_limit(8 << 30)  # the whole pod: 8 GiB
    async with (
        FakeSupervisor() as sup,
        worker(sup, 0, adapt=True, cgroup_root=str(tmp_path), workers=0) as w,
    ):
        ops = port_of(sup.workers[0].up["ops"]) if sup.workers[0].up else 0

        async def resources() -> dict[str, Any]:
            status, body = await http_get(ops, "/debug/resources")
            assert status == 200
            return dict(json.loads(body))

        # Shares well above this process's RSS (the worker is in-process here, and a long test
        # session's interpreter holds hundreds of MiB): both budgets above the floor.
        small_share = 3072 * MiB
        sibling = {"index": 1, "grpc_internal": "127.0.0.1:4321"}
        sup.share(
            0,
            memory_limit_bytes=small_share,
            cpu_cores=1.0,
            workers=1,
            processes=2,
            siblings=[sibling],
        )
        assert await wait_until(
            lambda: w.pool.size == 1 and w.adapter.plan.memory_limit_bytes == small_share
        )
        small = await resources()
        assert small["workers"] == 1
        assert small["adapter"]["plan"]["memory_limit_bytes"]["value"] == small_share
        assert small["pod"]["share"]["siblings"] == [sibling]
        assert w.podlink is not None and w.podlink.siblings() == ["127.0.0.1:4321"]
        sup.share(
            0, memory_limit_bytes=small_share + 512 * MiB, cpu_cores=3.0, workers=3, processes=2
        )
        assert await wait_until(lambda: w.pool.size == 3)
        large = await resources()
        assert large["workers"] == 3
        before, after = small["adapter"]["plan"], large["adapter"]["plan"]
        budget, ring = "data_budget_bytes", "ring_budget_bytes"
        assert after[budget]["value"] - before[budget]["value"] == 512 * MiB
        assert after[ring]["value"] > before[ring]["value"]
        assert small["memory"]["budget_bytes"] < large["memory"]["budget_bytes"]


async def test_a_session_that_leaves_the_worker_is_forgotten_in_the_pod() -> None:
    """A detached session that expires (its TTL, rings empty) leaves this process: the worker
    sends ``forget{device}`` so the supervisor's table stays bounded."""
    async with FakeSupervisor() as sup, worker(sup, 0, session_ttl_seconds=0.2) as w:
        spec = pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)
        edge = Edge("robot", [spec])
        await edge.connect(ws_opener(ws_url(w)))
        await edge.publish("s", POINTS)
        assert await edge.wait_delivered("s", 1)
        await edge.disconnect()
        forget = await sup.next_message(0, "forget", timeout=5)
        assert forget["device"] == "robot" and "robot" not in w.core.by_device


async def test_without_adapt_the_share_still_sets_the_worker_count() -> None:
    """``adapt: false`` keeps the settings' memory budget, but N processes each running a
    worker per CPU of the pod would oversubscribe it N times: the share's count applies."""
    async with FakeSupervisor() as sup, worker(sup, 0, workers=0) as w:
        assert w.adapter is None
        sup.share(0, workers=1, processes=4)
        assert await wait_until(lambda: w.pool.size == 1)
        sup.share(0, workers=2, processes=2)
        assert await wait_until(lambda: w.pool.size == 2)


async def test_a_retired_worker_tells_its_edges_to_come_back_soon_and_exits(
    tmp_path: Path,
) -> None:
    """``retire{reconnect_after_ms}``: the pod's plan has no room for this process. It drains as
    on SIGTERM, but its Drain says the edges may come back after 100 ms (the other processes
    are up), not the 1 s a whole bridge going away says (before: only SIGTERM, and every moved
    device waited 1.0-1.1 s in the container e2e)."""
    from websockets.asyncio.client import connect

    async with FakeSupervisor() as sup:
        worker_proc = await WorkerProcess.start(sup, 2, tmp_path)
        try:
            up = await sup.wait_up(2, timeout=30)
            spec = pb.StreamSpec(stream_id="s", kind=pb.POINT_CLOUD)
            hello = pb.EdgeMessage(hello=pb.Hello(device_id="robot", streams=[spec]))
            async with connect(f"ws://127.0.0.1:{up['ws']}/v1/ingest") as ws:
                await ws.send(hello.SerializeToString())
                first = pb.BridgeMessage.FromString(_bytes(await asyncio.wait_for(ws.recv(), 10)))
                assert first.HasField("welcome"), first
                sup.send(2, "retire", reconnect_after_ms=100)
                async with asyncio.timeout(10):
                    while True:
                        msg = pb.BridgeMessage.FromString(_bytes(await ws.recv()))
                        if msg.HasField("drain"):
                            break
                assert msg.drain.reconnect_after_ms == 100
            assert await worker_proc.wait(timeout=20) == 0
        finally:
            worker_proc.kill()
    assert "retired by the pod's plan" in worker_proc.logs()


def _bytes(data: str | bytes) -> bytes:
    assert isinstance(data, bytes)
    return data
