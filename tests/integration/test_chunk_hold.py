"""Chunk hold (issue 29) against a real ``simbridge serve``: one connection opens chunked frames
on every stream it may declare and never finishes them, holding the admission budget; a
well-behaved edge alongside must keep delivering, and the attacker must be closed.

Before the fix the held pieces were dropped only when another piece arrived (30 s age): the
good edge delivered nothing for as long as the attacker held (50-60 s in the container). Now
the holder is cut back to its fair share at its next piece or within one check interval
(``chunk_check_interval_seconds``), and closed after ``chunk_stall_seconds``.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.v1 import bridge_pb2 as pb
from loadgen.edge import EdgeClient, StreamConfig, longest_stall_s
from loadgen.sink import SinkServer
from tests.integration.harness import BridgeProcess, hello, http_get, xyz_cloud

MiB = 1 << 20
BUDGET = 64 * MiB
MAX_FRAME = 4 * MiB
STREAMS = 64  # max_streams_per_session: 64 frames of 2 MiB held would be twice the budget
STALL_SECONDS = 6.0  # the attacker's deadline (chunk_stall_seconds)
PUBLISH_SECONDS = 9.0  # the good edge publishes past that deadline
#: The longest the good edge may go without a delivery. The target is 2 s; measured here
#: 0.33-0.61 s, 1.52 s once with the host's 2 cores shared by other test runs (the holder is cut
#: back within one 0.25 s check interval, or at its next piece); the bound leaves room for a
#: loaded 2-core CI host. Before the fix the stall was the whole publishing window (9 s).
MAX_STALL_SECONDS = 3.0


class ChunkHolder:
    """Opens a 4 MiB chunked frame on each of its streams (the first 2 MiB piece) and never
    sends the rest; each frame the bridge abandons is opened again under the next seq, so it
    holds all it can for as long as it is connected. Records the Errors it is told and how its
    connection ends."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.errors: list[pb.Error] = []
        self.close_code: int | None = None
        self.closed_at: float | None = None
        self.fatal_at: float | None = None  # when the fatal Error came
        self.sent = 0
        self._reopen: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    async def run(self) -> None:
        names = [f"s{i}" for i in range(STREAMS)]
        async with connect(
            self.url, max_size=None, compression=None, ping_interval=None, close_timeout=1
        ) as ws:
            await ws.send(hello("holder", *names).SerializeToString())
            reader = asyncio.create_task(self._read(ws))
            for name in names:
                self._reopen.put_nowait((name, 1))
            piece = b"\x00" * (2 * MiB)
            try:
                while True:
                    name, seq = await self._reopen.get()
                    if not name:
                        break
                    chunk = pb.FrameChunk(
                        stream_id=name, seq=seq, total_bytes=MAX_FRAME, offset=0, data=piece
                    )
                    await ws.send(pb.EdgeMessage(chunk=chunk).SerializeToString())
                    self.sent += 1
            except ConnectionClosed:
                pass
            await reader

    async def _read(self, ws: object) -> None:
        try:
            async for raw in ws:  # type: ignore[attr-defined]
                msg = pb.BridgeMessage.FromString(raw)
                if msg.WhichOneof("kind") == "error":
                    self.errors.append(msg.error)
                    if msg.error.fatal:
                        self.fatal_at = time.monotonic()
                    if msg.error.code == pb.CHUNK_ABANDONED and not msg.error.fatal:
                        self._reopen.put_nowait((msg.error.stream_id, msg.error.seq + 1))
        except ConnectionClosed:
            pass
        self.close_code = ws.close_code  # type: ignore[attr-defined]
        self.closed_at = time.monotonic()
        self._reopen.put_nowait(("", 0))  # wake the sender to end


async def test_a_connection_holding_chunked_frames_costs_a_good_edge_no_stall(
    free_port: int,
) -> None:
    delivered_ns: list[int] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.device_id == "good":
            delivered_ns.append(time.time_ns())

    async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False, on_frame=on_frame):
        proc = await BridgeProcess.start(
            *("--ring-budget-bytes", str(BUDGET), "--max-frame-bytes", str(MAX_FRAME)),
            *("--sink-address", f"127.0.0.1:{free_port}", "--passthrough", "--workers", "1"),
            *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
            *("--chunk-max-age-seconds", "5", "--chunk-stall-seconds", str(STALL_SECONDS)),
        )
        try:
            good = EdgeClient("ws", proc.ws_url, "good", [StreamConfig("cam")])
            await good.start()
            cloud = xyz_cloud(np.random.default_rng(7).uniform(-5, 5, (2000, 3)))
            await good.publish("cam", cloud)
            assert await good.wait_delivered(10)

            holder = ChunkHolder(proc.ws_url)
            attack = asyncio.create_task(holder.run())
            held_from = time.monotonic()
            start_ns = time.time_ns()
            published = 0
            while time.monotonic() - held_from < PUBLISH_SECONDS:
                await good.publish("cam", cloud)
                published += 1
                await asyncio.sleep(0.05)
            end_ns = time.time_ns()
            drained = await good.wait_delivered(5)
            await asyncio.wait({attack}, timeout=3)  # closed by now (the stall deadline)
            attack.cancel()
            status, metrics = await http_get(proc.http, "/metrics")
            await good.close()
        finally:
            proc.kill()

    stall = longest_stall_s(delivered_ns, start_ns, end_ns)
    codes = [(e.code, e.fatal) for e in holder.errors]
    shed = codes.count((pb.CHUNK_ABANDONED, False))
    print(
        f"good edge: {published} published, longest stall {stall:.2f} s; holder: "
        f"{holder.sent} pieces sent on {STREAMS} streams, {shed} abandoned, closed with "
        f"{holder.close_code}, told after {(holder.fatal_at or 0) - held_from:.1f} s"
    )
    assert stall <= MAX_STALL_SECONDS, f"the good edge stalled {stall:.2f} s"
    assert drained and good.stats.disconnects == 0
    # The holder was cut back to its share (non-fatal CHUNK_ABANDONED for the frames shed)
    # and then closed: a fatal CHUNK_ABANDONED, close 1008, within its stall deadline.
    assert shed > 0
    assert codes[-1] == (pb.CHUNK_ABANDONED, True)
    assert holder.close_code == 1008
    assert holder.fatal_at is not None and holder.closed_at is not None
    assert holder.fatal_at - held_from <= STALL_SECONDS + 2.0
    assert status == 200
    rejected = [line for line in metrics.splitlines() if "chunks_stalled" in line]
    assert rejected and rejected[0].startswith("bridge_rejected_messages_total"), rejected
    assert rejected[0].endswith(" 1.0"), rejected
