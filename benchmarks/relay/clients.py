"""The relay benchmark's load clients: closed-loop WebSocket and gRPC edges (raw or bridge)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks.relay.common import (
    _DRAIN_TAG,
    _ERROR_TAG,
    _FLOW_TAG,
    INGEST_METHOD,
    MAX_FRAME_BYTES,
    RAW_HEADER,
    Cell,
    Conn,
)
from benchmarks.relay.servers import RELAY_INGEST_METHOD, grpc_options
from bridge.client.payload import PreparedPayload, encode_frame
from bridge.protocol.batches import edge_batch
from bridge.v1 import bridge_pb2 as pb


@dataclass(frozen=True)
class Payload:
    """What one message carries at one size: the cloud bytes (bridge) and an opaque body of the
    same total wire size (raw), so both targets move the same number of bytes per message."""

    name: str
    cloud: bytes
    raw_body: bytes
    wire_bytes: int

    @classmethod
    def build(cls, name: str, size: int) -> Payload:
        points = np.random.default_rng(size).uniform(-50, 50, (size // 12, 3)).astype("<f4")
        cloud = points.tobytes()
        wire = len(bridge_encoder(cloud)(1, time.time_ns()))
        return cls(name, cloud, os.urandom(wire - RAW_HEADER.size), wire)


def raw_encoder(token: int, body: bytes) -> Callable[[int, int], bytes]:
    """Header + body: one copy of the payload per message."""
    pack = RAW_HEADER.pack

    def encode(seq: int, now_ns: int) -> bytes:
        return pack(now_ns, token, seq) + body

    return encode


def bridge_encoder(cloud: bytes) -> Callable[[int, int], bytes]:
    """What an edge built on ``bridge.client`` sends: the cloud prepared once, each frame its
    small header plus that payload, so a send copies the payload once, as the raw clients do to
    stamp their header. (Serializing a whole EdgeMessage with protobuf copies it twice: into
    upb's arena, then into bytes.)"""
    payload = PreparedPayload.cloud(np.frombuffer(cloud, "<f4").reshape(-1, 3))

    def encode(seq: int, now_ns: int) -> bytes:
        return encode_frame("cloud", seq, now_ns, payload)

    return encode


def hello_message(device: str) -> bytes:
    """An edge's Hello: one passthrough cloud stream."""
    spec = pb.StreamSpec(stream_id="cloud", kind=pb.POINT_CLOUD, passthrough=True)
    return pb.EdgeMessage(hello=pb.Hello(device_id=device, streams=[spec])).SerializeToString()


class Client:
    """One edge connection: closed-loop sends (``window`` in flight), discards what comes back.

    ``bridge``: speak the bridge protocol (Hello/Welcome, Frames, read every reply) rather than
    sending opaque bytes to a raw relay.
    """

    yield_after_send = False

    def __init__(
        self, cell: Cell, conn: Conn, payload: Payload, *, bridge: bool, batch: int = 1
    ) -> None:
        self.cell = cell
        self.conn = conn
        self.bridge = bridge
        self.batch = batch  # frames per message (a FrameBatch when > 1; window counts frames)
        self.encode = (
            bridge_encoder(payload.cloud)
            if bridge
            else raw_encoder(cell.token(conn.index), payload.raw_body)
        )
        self._reader: asyncio.Task[None] | None = None

    async def open(self, address: str) -> None:
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def hello(self) -> bytes:
        return hello_message(self.cell.device_id(self.conn.index))

    @staticmethod
    def check_welcome(raw: object) -> None:
        if not isinstance(raw, bytes):
            raise ConnectionError(f"expected a Welcome, got {raw!r:.80}")
        msg = pb.BridgeMessage.FromString(raw)
        if msg.WhichOneof("kind") != "welcome":
            raise ConnectionError(f"expected a Welcome, got {msg}")

    def on_bridge_message(self, raw: bytes) -> None:
        """Acks are counted and discarded unparsed; errors and drains fail the cell; pauses are
        counted."""
        self.conn.replies += 1
        tag = raw[0] if raw else 0
        if tag in (_ERROR_TAG, _DRAIN_TAG):
            msg = pb.BridgeMessage.FromString(raw)
            self.conn.errors.append(f"conn {self.conn.index}: bridge sent {msg}".strip())
        elif tag == _FLOW_TAG:
            msg = pb.BridgeMessage.FromString(raw)
            if msg.flow_control.action == pb.FlowControl.PAUSE:
                self.conn.backpressure += 1

    async def send_loop(self, stop: asyncio.Event) -> None:
        conn = self.conn
        window = conn.window
        encode, write = self.encode, self.write
        yield_after_send = self.yield_after_send
        clock = time.time_ns
        seq = 0
        batch = self.batch
        try:
            while True:
                for _ in range(batch):
                    await window.acquire()
                if stop.is_set():
                    for _ in range(batch):
                        window.release()
                    return
                conn.sent += batch  # counted before the await: the sink may see it first
                if batch == 1:
                    seq += 1
                    await write(encode(seq, clock()))
                    continue
                now = clock()
                frames = [encode(seq + i, now) for i in range(1, batch + 1)]
                seq += batch
                await write(edge_batch(frames))
                if yield_after_send:
                    await asyncio.sleep(0)
        except (ConnectionClosed, grpc.aio.AioRpcError, ConnectionError) as exc:
            conn.errors.append(f"conn {conn.index}: send failed: {type(exc).__name__}: {exc}")


class WsClient(Client):
    # ``await ws.send()`` does not yield while the socket takes data (docs/design.md §6): without an
    # explicit yield, 32 "concurrent" connections would take turns.
    yield_after_send = True
    ws: ClientConnection

    async def open(self, address: str) -> None:
        path = "/v1/ingest" if self.bridge else "/relay"
        self.ws = await connect(
            f"ws://{address}{path}",
            compression=None,  # permessage-deflate would dominate (docs/design.md §2)
            max_size=MAX_FRAME_BYTES + 64 * 1024,
            ping_interval=None,
        )
        if self.bridge:
            await self.ws.send(self.hello())
            self.check_welcome(await asyncio.wait_for(self.ws.recv(), 10))
            self._reader = asyncio.create_task(self._read(), name="bench-ws-reader")

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                if isinstance(raw, bytes):
                    self.on_bridge_message(raw)

    async def write(self, data: bytes) -> None:
        await self.ws.send(data)

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 5)


class GrpcClient(Client):
    channel: grpc.aio.Channel
    call: Any

    async def open(self, address: str) -> None:
        # A private subchannel pool gives each client its own TCP connection, like the
        # WebSocket clients (channels with equal arguments otherwise share one connection).
        options: list[tuple[str, Any]] = [
            *grpc_options(MAX_FRAME_BYTES + 64 * 1024),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self.channel = grpc.aio.insecure_channel(address, options=options)
        if not self.bridge:
            method = self.channel.stream_unary(
                RELAY_INGEST_METHOD, request_serializer=None, response_deserializer=None
            )
            self.call = method(wait_for_ready=True)
            return
        connect_method = self.channel.stream_stream(
            INGEST_METHOD, request_serializer=None, response_deserializer=None
        )
        self.call = connect_method(wait_for_ready=True)
        await self.call.write(self.hello())
        self.check_welcome(await asyncio.wait_for(self.call.read(), 10))
        self._reader = asyncio.create_task(self._read(), name="bench-grpc-reader")

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while (raw := await self.call.read()) is not grpc.aio.EOF:
                self.on_bridge_message(raw)

    async def write(self, data: bytes) -> None:
        await self.call.write(data)

    async def close(self) -> None:
        try:
            await self.call.done_writing()
            # The raw relay answers once; the bridge ends the call after our half-close.
            await asyncio.wait_for(self._reader if self._reader is not None else self.call, 5)
        finally:
            self.call.cancel()
            await self.channel.close()
