"""What one frame of a FrameBatch costs the bridge, in process: ingest, admission, core, ring,
passthrough processing and the (auto-)ack, without sockets.

Why: the relay benchmark's ``bridgeB`` cells measure this path through two real transports and a
sink on a shared machine, where a round varies by 10-30 %; here one process feeds a real
:class:`~bridge.server.app.BridgeService` (passthrough, no sink: frames are acknowledged once
committed) the same 1 KB cloud frames, 16 to a message, through ``EdgeRegistry.serve`` and a stub
transport that charges each message to the governor as the WebSocket adapter does, and yields
to the loop twice per message as a socket read would. It prints CPU microseconds per frame over
chunks of 100 messages: the minimum and low percentiles are what to compare between commits.

    python -m benchmarks.ingest_batch [--messages 3000] [--rounds 2] [--batch 16]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import numpy as np
from prometheus_client import CollectorRegistry

from bridge.client.payload import PreparedPayload, encode_frame
from bridge.config.settings import Settings
from bridge.protocol.batches import edge_batch
from bridge.protocol.errors import ProtocolError
from bridge.server.app import BridgeService
from bridge.server.governor import Charge, Component, Governor
from bridge.server.ports import Received
from bridge.v1 import bridge_pb2 as pb

CHUNK = 100  # messages per measured chunk
STREAM = "cloud"


class FeedTransport:
    """An edge sending as fast as the bridge reads (a ``ports.EdgeTransport``)."""

    name = "ws"

    def __init__(self, governor: Governor, messages: list[bytes], frames_per_message: int) -> None:
        self._governor = governor
        self._messages = messages
        self._frames = frames_per_message
        self._next = 0
        self._started = 0.0
        self.chunks: list[float] = []  # CPU us per frame of each chunk of CHUNK messages
        self.done = asyncio.Event()
        self.error: ProtocolError | None = None

    async def recv(self) -> Received | None:
        await asyncio.sleep(0)  # a socket read: what the loop runs in between gets its turn
        await asyncio.sleep(0)
        index = self._next
        if index % CHUNK == 1:  # the Hello is message 0: chunks start with the first batch
            now = time.process_time()
            if index > 1:
                self.chunks.append((now - self._started) / (CHUNK * self._frames) * 1e6)
            self._started = now
        if index == len(self._messages):
            self.done.set()
            await asyncio.Event().wait()  # the edge is idle until the benchmark closes the bridge
        self._next += 1
        data = self._messages[index]
        return Received(data, await self._grant(len(data)))

    async def _grant(self, nbytes: int) -> Charge:
        granted: asyncio.Future[Charge | None] = asyncio.get_running_loop().create_future()
        got = self._governor.request(Component.TRANSPORT, nbytes, granted.set_result)
        if isinstance(got, Charge):
            return got
        charge = await granted if got is not None else None
        if charge is None:
            raise RuntimeError(f"the governor refused a {nbytes} B message")
        return charge

    def on_wait(self, notify: Callable[[bool], None]) -> None:
        pass

    async def send(self, data: bytes) -> None:
        pass

    async def reject(self, error: ProtocolError) -> None:
        self.error = error
        self.done.set()

    async def close_going_away(self, reason: str = "bridge shutting down") -> None:
        pass

    async def ping(self, seconds: float) -> bool | None:
        return None


def build_messages(count: int, batch: int, payload_bytes: int) -> list[bytes]:
    """A Hello, then ``count`` FrameBatch messages of ``batch`` cloud frames (seq 1, 2, ...)."""
    spec = pb.StreamSpec(stream_id=STREAM, kind=pb.POINT_CLOUD, passthrough=True)
    hello = pb.EdgeMessage(hello=pb.Hello(device_id="bench", streams=[spec]))
    points = np.random.default_rng(1).random((payload_bytes // 12, 3), dtype=np.float32)
    payload = PreparedPayload.cloud(points)
    now = time.time_ns()
    return [hello.SerializeToString()] + [
        edge_batch([encode_frame(STREAM, m * batch + i, now, payload) for i in range(1, batch + 1)])
        for m in range(count)
    ]


async def measure(count: int, batch: int, payload_bytes: int) -> list[float]:
    """CPU us per frame of each chunk; raises if a frame was refused or not accepted."""
    settings = Settings(
        host="127.0.0.1",
        ws_port=0,
        grpc_port=0,
        http_port=0,
        passthrough=True,
        adapt=False,
        max_frame_bytes=4 << 20,
    )
    service = BridgeService(settings, CollectorRegistry())
    await service.start()
    try:
        edge = FeedTransport(service.governor, build_messages(count, batch, payload_bytes), batch)
        serving = asyncio.create_task(service.edges.serve(edge))
        await edge.done.wait()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        accepted = service.registry.get_sample_value("bridge_frames_accepted_total")
        if edge.error is not None or accepted != count * batch:
            raise RuntimeError(f"{accepted} of {count * batch} frames accepted ({edge.error})")
        return edge.chunks
    finally:
        await service.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000, help="FrameBatch messages a round")
    parser.add_argument("--rounds", type=int, default=2, help="bridges started, one after another")
    parser.add_argument("--batch", type=int, default=16, help="frames per message")
    parser.add_argument("--payload", type=int, default=1024, help="cloud bytes per frame")
    args = parser.parse_args(argv)
    if args.messages < 2 * CHUNK or args.rounds < 1 or args.batch < 2:
        parser.error(f"--messages >= {2 * CHUNK}, --rounds >= 1, --batch >= 2 please")
    try:  # the event loop `simbridge serve` runs on
        import uvloop

        run: Callable[..., list[float]] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        run = asyncio.run
    chunks: list[float] = []
    for _ in range(args.rounds):
        chunks += run(measure(args.messages, args.batch, args.payload))
    chunks.sort()

    def at(q: float) -> float:
        return chunks[int(q * (len(chunks) - 1))]

    print(
        f"{args.batch} x {args.payload} B frames a message, CPU us per frame, {len(chunks)} chunks"
    )
    print(f"min {chunks[0]:.2f}  p10 {at(0.1):.2f}  p25 {at(0.25):.2f}  median {at(0.5):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
