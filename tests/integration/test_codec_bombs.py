"""Codec bombs against a real ``simbridge serve`` process: ~1 KB messages whose codec headers
declare a maximum cloud and whose last byte makes the decode fail once everything is inflated.
Sent alone and 64 to a FrameBatch, over WebSocket and gRPC, while a well-behaved edge publishes
and ``/healthz`` is polled. The bomber must be closed by its refused-decode budget, the event
loop must keep answering, the good edge must lose nothing, and RSS must stay within the budget
plus the plan's headroom."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from bridge.resources.from_settings import memory_headroom_bytes
from bridge.v1 import bridge_pb2 as pb
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests import codec_bombs
from tests.codec_bombs import batch_of, frame, quantized_bomb, quantized_stream
from tests.integration.harness import (
    BridgeProcess,
    RawGrpcEdge,
    http_get,
    rss,
    scraped,
    xyz_cloud,
)

MiB = 1 << 20
MAX_FRAME = 16 * MiB
BUDGET = 256 * MiB
BOMB_POINTS = MAX_FRAME // 16  # 16 MiB declared, ~0.15 s of CPU to inflate here
#: /healthz answers within this while the bombs go off (generous for a loaded 2-core CI VM; the
#: figure measured is printed). Decoding one bomb on the event loop stalls it ~0.15-0.2 s, a
#: batch of them for seconds.
HEALTHZ_BOUND_S = 0.5


@dataclass
class Watch:
    """``/healthz`` latency and the bridge's RSS, sampled every 20 ms."""

    port: int
    pid: int
    worst_healthz: float = 0.0
    peak_rss: int = 0
    samples: list[float] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                await writer.drain()
                await reader.read()
            finally:
                writer.close()
            took = time.monotonic() - t0
            self.samples.append(took)
            self.worst_healthz = max(self.worst_healthz, took)
            self.peak_rss = max(self.peak_rss, rss(self.pid))
            await asyncio.sleep(0.02)


def bombs() -> tuple[list[bytes], bytes]:
    """Single-frame bombs (seqs 1-4) and one batch of 64 (seqs 5-68)."""
    poison = quantized_bomb(BOMB_POINTS, poisoned=True)
    singles = [
        pb.EdgeMessage(frame=frame("q", seq, poison)).SerializeToString() for seq in range(1, 5)
    ]
    return singles, batch_of([frame("q", seq, poison) for seq in range(5, 69)])


async def ws_bomber(url: str) -> tuple[int | None, list[pb.Error]]:
    """Bombs until the bridge closes the connection: (close code, Errors received)."""
    singles, batch = bombs()
    rounds = (message for _ in range(20) for message in [*singles, batch])
    return await codec_bombs.ws_bomber(url, "bomber", rounds, read_timeout_s=60, yield_each=True)


async def grpc_bomber(target: str) -> tuple[str, list[pb.Error]]:
    """The same over gRPC: (final status, Errors received)."""
    singles, batch = bombs()
    edge = RawGrpcEdge(target)
    errors: list[pb.Error] = []

    async def read() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while (msg := await edge.call.read()) is not grpc.aio.EOF:
                if msg.WhichOneof("kind") == "error":
                    errors.append(msg.error)

    try:
        hello = pb.Hello(device_id="bomber", streams=[quantized_stream("q")])
        await edge.send(pb.EdgeMessage(hello=hello).SerializeToString())
        reader = asyncio.create_task(read())
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            for _ in range(20):
                for message in [*singles, batch]:
                    if reader.done() or any(e.fatal for e in errors):
                        break  # as a client does once told the call is over
                    await edge.send(message)
        await asyncio.wait_for(reader, 60)
        # The call is over. Its status is RESOURCE_EXHAUSTED, unless a write of ours was in
        # flight when the bridge ended it: gRPC's client then reports INTERNAL ("Internal error
        # from Core"); the fatal Error before it, and the bridge's counter, say why.
        return str(await asyncio.wait_for(edge.call.code(), 5)), errors
    finally:
        await edge.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("transport", "budget"), [("ws", None), ("grpc", None), ("ws", 1)], ids=["ws", "grpc", "ws-1B"]
)
async def test_codec_bombs_cost_only_their_sender(
    transport: str, budget: int | None, free_port: int
) -> None:
    """The default budget (32 MiB) lets 2-3 bombs of 16 MiB be refused before the close; a
    budget of 1 byte closes the connection after the first."""
    delivered: list[int] = []

    def on_frame(got: pb.ProcessedFrame) -> None:
        if got.device_id == "good":
            delivered.append(got.seq)

    async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=on_frame):
        proc = await BridgeProcess.start(
            "--ring-budget-bytes",
            str(BUDGET),
            "--max-frame-bytes",
            str(MAX_FRAME),
            "--sink-address",
            f"127.0.0.1:{free_port}",
            "--passthrough",
            "--ws-port",
            "0",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            *(["--refused-decode-budget-bytes", str(budget)] if budget else []),
        )
        try:
            await asyncio.sleep(0.3)
            baseline = rss(proc.proc.pid)
            watch = Watch(proc.http, proc.proc.pid)
            watcher = asyncio.create_task(watch.run())
            good = EdgeClient("ws", proc.ws_url, "good", [StreamConfig("cam")])
            await good.start()
            cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (20_000, 3)))
            t0 = time.monotonic()
            if transport == "ws":
                attack = asyncio.create_task(ws_bomber(proc.ws_url))
            else:
                attack = asyncio.create_task(grpc_bomber(f"127.0.0.1:{proc.grpc}"))
            for _ in range(20):
                await good.publish("cam", cloud)
                await asyncio.sleep(0.05)
            ended, errors = await asyncio.wait_for(attack, 90)
            attack_s = time.monotonic() - t0
            assert await good.wait_delivered(30)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await good.close()
            _, metrics = await http_get(proc.http, "/metrics")
        finally:
            proc.kill()
    codes = [(e.code, e.fatal) for e in errors]
    print(
        f"\n{transport}: bomber ended {ended} after {attack_s:.1f} s with {len(errors)} Errors; "
        f"/healthz worst {watch.worst_healthz * 1000:.0f} ms over {len(watch.samples)} polls; "
        f"RSS growth {(watch.peak_rss - baseline) / MiB:.0f} MiB"
    )
    assert (pb.CODEC_ERROR, True) in codes, f"the bomber was not closed by its budget: {codes}"
    closed = {"ws": (1008,), "grpc": ("StatusCode.RESOURCE_EXHAUSTED", "StatusCode.INTERNAL")}
    assert ended in closed[transport], ended
    labels = {"transport": transport, "reason": "decode_budget"}
    assert scraped(metrics, "bridge_rejected_messages_total", **labels) == [1.0]
    assert scraped(metrics, "bridge_connections_closed_total", **labels) == [1.0]
    refused = [c for c in codes if c == (pb.CODEC_ERROR, False)]
    most = 1 if budget == 1 else 4
    assert 1 <= len(refused) <= most, f"{len(refused)} refused decodes before the close"
    assert watch.worst_healthz < HEALTHZ_BOUND_S, f"/healthz stalled {watch.worst_healthz:.2f} s"
    assert good.stats.disconnects == 0 and good.stats.dropped == 0
    assert delivered == list(range(1, 21)), "the good edge lost or repeated frames"
    assert watch.peak_rss - baseline <= BUDGET + memory_headroom_bytes(MAX_FRAME)
