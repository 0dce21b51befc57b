"""A minimal simbridge client written from ``docs/protocol.md`` alone (issue 33).

Nothing of the bridge is imported except the generated messages (``bridge/v1/bridge_pb2``): the
transports are ``websockets`` and ``grpcio`` used generically (the method paths of §1, §10 and
§11, serializers from the messages). Every rule below names the section it comes from, so when
the client and a bridge disagree, either the document or the bridge is wrong.
``tests/integration/test_protocol_only_client.py`` runs it against a token-protected
``simbridge serve``.

- :class:`WsConnection` / :class:`GrpcConnection`: one edge connection, message by message (§1),
  and how it ended (a WebSocket close code, or a gRPC status and its details).
- :class:`Edge`: Hello / Welcome (§2), frames and seqs (§3), acks (§5) and resume (§6).
- :class:`Viewer`: ``Visualization/Subscribe`` (§11).
- :class:`Sink`: a ``VisualizationSink`` that implements ``Push`` only (§10).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bridge.v1 import bridge_pb2 as pb

Outgoing = pb.EdgeMessage | bytes | str  # bytes: sent as they are; str: a text WebSocket message
TIMEOUT = 5.0


@dataclass
class End:
    """How a connection ended (§8): the WebSocket close code, or the gRPC status and details."""

    ws_code: int | None = None
    grpc_code: grpc.StatusCode | None = None
    details: str = ""


def _raw(message: Outgoing) -> bytes | str:
    return message.SerializeToString() if isinstance(message, pb.EdgeMessage) else message


def cloud(points: Sequence[tuple[float, float, float]], frame_id: str = "") -> pb.PointCloud:
    """§4: float32 x, y, z at offsets 0, 4, 8 of a 12-byte little-endian record."""
    return pb.PointCloud(
        point_stride=12,
        fields=[
            pb.PackedField(name=axis, offset=4 * i, type=pb.FLOAT32) for i, axis in enumerate("xyz")
        ],
        data=b"".join(struct.pack("<fff", *p) for p in points),
        frame_id=frame_id,
    )


class Connection:
    """One edge connection: a reader task fills ``inbox``; ``None`` in it means it ended."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[pb.BridgeMessage | None] = asyncio.Queue()
        self.end: End | None = None
        self._reader: asyncio.Task[None] | None = None

    async def send(self, message: Outgoing) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def _read(self) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def recv(self, timeout: float = TIMEOUT) -> pb.BridgeMessage | None:  # noqa: ASYNC109
        """The next message, or None once the connection has ended."""
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def until_end(self, timeout: float = TIMEOUT) -> tuple[list[pb.BridgeMessage], End]:  # noqa: ASYNC109
        """Everything the bridge still sends, then how the connection ended."""
        seen: list[pb.BridgeMessage] = []
        while (message := await self.recv(timeout)) is not None:
            seen.append(message)
        assert self.end is not None
        return seen, self.end


class WsConnection(Connection):
    """§1: one binary WebSocket message per ``EdgeMessage`` / ``BridgeMessage``."""

    def __init__(self, ws: ClientConnection) -> None:
        super().__init__()
        self.ws = ws
        self._start()

    @classmethod
    async def open(cls, url: str, token: str = "", device: str = "") -> WsConnection:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if device:  # §1 routing key: the query parameter and the upgrade header
            query = urllib.parse.urlencode({"device": device})
            url = f"{url}{'&' if '?' in url else '?'}{query}"
            headers["x-simbridge-device"] = device
        # §1: the bridge negotiates no compression; a client SHOULD NOT offer it.
        ws = await connect(url, additional_headers=headers, compression=None, max_size=None)
        return cls(ws)

    async def send(self, message: Outgoing) -> None:
        with contextlib.suppress(ConnectionClosed):  # how it ended is read by the reader
            await self.ws.send(_raw(message))

    async def _read(self) -> None:
        try:
            while True:
                data = await self.ws.recv()
                assert isinstance(data, bytes), "the bridge sends binary messages only"
                await self.inbox.put(pb.BridgeMessage.FromString(data))
        except ConnectionClosed as closed:
            self.end = End(ws_code=closed.rcvd.code if closed.rcvd else 1006)
            await self.inbox.put(None)

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            await self._reader


def _serialize(message: pb.EdgeMessage | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class GrpcConnection(Connection):
    """§1: the bidirectional stream ``bridge.v1.Ingest/Connect``."""

    def __init__(self, target: str, token: str = "", device: str = "") -> None:
        super().__init__()
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", -1),
                ("grpc.max_receive_message_length", -1),
            ],
        )
        connect_method = self.channel.stream_stream(
            "/bridge.v1.Ingest/Connect",
            request_serializer=_serialize,
            response_deserializer=pb.BridgeMessage.FromString,
        )
        metadata = [("authorization", f"Bearer {token}")] if token else []
        if device:  # §1 routing key
            metadata.append(("x-simbridge-device", device))
        self.call = connect_method(metadata=tuple(metadata) or None)
        self._start()

    @classmethod
    async def open(cls, target: str, token: str = "", device: str = "") -> GrpcConnection:
        return cls(target, token, device)

    async def send(self, message: Outgoing) -> None:
        assert not isinstance(message, str), "gRPC has no text messages"
        with contextlib.suppress(grpc.RpcError, grpc.aio.UsageError):
            await self.call.write(message)

    async def _read(self) -> None:
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                assert isinstance(message, pb.BridgeMessage)
                await self.inbox.put(message)
            code, details = await self.call.code(), await self.call.details()
        except grpc.aio.AioRpcError as error:
            code, details = error.code(), error.details() or ""
        except asyncio.CancelledError:
            if not self.call.cancelled():  # our own close() cancels the call, not this task
                raise
            code, details = grpc.StatusCode.CANCELLED, "closed by the client"
        self.end = End(grpc_code=code, details=details)
        await self.inbox.put(None)

    async def close(self) -> None:
        self.call.cancel()
        if self._reader is not None:
            await self._reader
        await self.channel.close()


# (the transport's bearer token, the routing key): either may be empty
Opener = Callable[[str, str], Awaitable[Connection]]


class Refused(Exception):
    """The Hello was not answered with a Welcome: the Error (if any) and how it ended."""

    def __init__(self, error: pb.Error | None, end: End | None) -> None:
        super().__init__(f"{error} {end}")
        self.error, self.end = error, end


@dataclass
class StreamState:
    spec: pb.StreamSpec
    next_seq: int = 1  # §3: starts at 1, strictly increases
    accepted: int = 0
    delivered: int = 0
    unacked: dict[int, pb.Frame] = field(default_factory=dict)  # §5: kept until delivered


class Edge:
    """One device: Hello/Welcome, publishing, acks and resume, as §2, §3, §5 and §6 say."""

    def __init__(
        self,
        device_id: str,
        streams: Sequence[pb.StreamSpec],
        token: str = "",
        token_in_hello: bool = False,
    ) -> None:
        self.device_id = device_id
        self.streams = {spec.stream_id: StreamState(spec) for spec in streams}
        self.token, self.token_in_hello = token, token_in_hello
        self.session_id = ""  # §2.4: the resume token
        self.conn: Connection | None = None
        self.welcome: pb.Welcome | None = None
        self.errors: list[pb.Error] = []
        self.acks: list[pb.Ack] = []
        self.resent: list[tuple[str, int]] = []
        self.end: End | None = None
        self._pump: asyncio.Task[None] | None = None

    def hello(self) -> pb.EdgeMessage:
        """§2 and §6: the same declarations each time, the last token and delivered_seqs."""
        return pb.EdgeMessage(
            hello=pb.Hello(
                device_id=self.device_id,
                resume_token=self.session_id,
                streams=[state.spec for state in self.streams.values()],
                resume=[
                    pb.ResumeState(stream_id=sid, delivered_seq=state.delivered)
                    for sid, state in self.streams.items()
                    if state.delivered
                ],
                auth_token=self.token if self.token_in_hello else "",
            )
        )

    async def connect(self, opener: Opener) -> pb.Welcome:
        conn = await opener("" if self.token_in_hello else self.token, self.device_id)
        await conn.send(self.hello())  # §2.1: the first message, within the Hello deadline
        first = await conn.recv()
        if first is None or first.WhichOneof("kind") != "welcome":
            error = first.error if first is not None and first.HasField("error") else None
            with contextlib.suppress(TimeoutError):
                await conn.until_end()
            end = conn.end
            await conn.close()
            raise Refused(error, end)
        self.conn, self.welcome, self.end = conn, first.welcome, None
        self.session_id = first.welcome.session_id
        self._pump = asyncio.create_task(self._read(conn))
        await self._resend(first.welcome)
        return first.welcome

    async def _resend(self, welcome: pb.Welcome) -> None:
        """§6: resend what the bridge may not hold, in seq order."""
        for known in welcome.streams:
            state = self.streams[known.stream_id]
            state.delivered = max(state.delivered, known.delivered_seq)
            state.accepted = known.accepted_seq if welcome.resumed else 0
            self._prune(state)
            above = max(known.delivered_seq, known.accepted_seq if welcome.resumed else 0)
            for seq in sorted(s for s in state.unacked if s > above):
                self.resent.append((known.stream_id, seq))
                await self.send(pb.EdgeMessage(frame=state.unacked[seq]))

    @staticmethod
    def _prune(state: StreamState) -> None:
        for seq in [s for s in state.unacked if s <= state.delivered]:
            del state.unacked[seq]  # §5: MAY discard once delivered_seq covers it

    async def _read(self, conn: Connection) -> None:
        while (message := await conn.recv(timeout=3600)) is not None:
            kind = message.WhichOneof("kind")
            if kind == "ack":
                self.acks.append(message.ack)
                for ack in message.ack.streams:  # §5: cumulative, take the maximum
                    state = self.streams[ack.stream_id]
                    state.accepted = max(state.accepted, ack.accepted_seq)
                    state.delivered = max(state.delivered, ack.delivered_seq)
                    self._prune(state)
            elif kind == "error":
                self.errors.append(message.error)
                refused = self.streams.get(message.error.stream_id)
                # §8: a refused frame is never resent; §3.2: an abandoned chunked one is
                if refused is not None and message.error.code != pb.CHUNK_ABANDONED:
                    refused.unacked.pop(message.error.seq, None)
        self.end = conn.end

    async def send(self, message: Outgoing) -> None:
        assert self.conn is not None
        await self.conn.send(message)

    def frame(self, stream_id: str, payload: pb.PointCloud | pb.Telemetry) -> pb.Frame:
        """The stream's next frame (§3), kept until it is delivered (§5)."""
        state = self.streams[stream_id]
        frame = pb.Frame(stream_id=stream_id, seq=state.next_seq, capture_time_ns=1)
        if isinstance(payload, pb.PointCloud):
            frame.point_cloud.CopyFrom(payload)
        else:
            frame.telemetry.CopyFrom(payload)
        state.unacked[frame.seq] = frame
        state.next_seq += 1
        return frame

    async def publish(self, stream_id: str, payload: pb.PointCloud | pb.Telemetry) -> int:
        frame = self.frame(stream_id, payload)
        await self.send(pb.EdgeMessage(frame=frame))
        return frame.seq

    async def wait(self, check: Callable[[], bool], timeout: float = TIMEOUT) -> bool:  # noqa: ASYNC109
        deadline = asyncio.get_running_loop().time() + timeout
        while not check():
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def wait_delivered(self, stream_id: str, seq: int, timeout: float = TIMEOUT) -> bool:  # noqa: ASYNC109
        return await self.wait(lambda: self.streams[stream_id].delivered >= seq, timeout)

    async def disconnect(self) -> None:
        """Drop the connection (a network loss, as far as the session goes)."""
        if self.conn is not None:
            await self.conn.close()
        if self._pump is not None:
            await self._pump
        self.conn = self._pump = None


def ws_opener(url: str) -> Opener:
    async def opener(token: str, device: str) -> Connection:
        return await WsConnection.open(url, token, device)

    return opener


def grpc_opener(target: str) -> Opener:
    async def opener(token: str, device: str) -> Connection:
        return await GrpcConnection.open(target, token, device)

    return opener


class Viewer:
    """§11: ``Visualization/Subscribe`` with the viewer token in the metadata."""

    def __init__(
        self,
        target: str,
        token: str = "",
        stream_ids: Sequence[str] = (),
        from_bridge_seq: int = 0,
        max_frame_bytes: int = 16 << 20,
        request: bytes | None = None,
    ) -> None:
        # §11: a subscriber MUST accept max_frame_bytes + 64 KiB.
        limit = max_frame_bytes + 65536
        self.channel = grpc.aio.insecure_channel(
            target, options=[("grpc.max_receive_message_length", limit)]
        )
        subscribe = self.channel.unary_stream(
            "/bridge.v1.Visualization/Subscribe",
            request_serializer=_serialize_any,
            response_deserializer=pb.ProcessedFrame.FromString,
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        body = request or pb.SubscribeRequest(
            stream_ids=list(stream_ids), from_bridge_seq=from_bridge_seq
        )
        self.call = subscribe(body, metadata=metadata)
        self.frames: list[pb.ProcessedFrame] = []
        self.end: End | None = None
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while (frame := await self.call.read()) is not grpc.aio.EOF:
                assert isinstance(frame, pb.ProcessedFrame)
                self.frames.append(frame)
            self.end = End(grpc_code=await self.call.code(), details=await self.call.details())
        except grpc.aio.AioRpcError as error:
            self.end = End(grpc_code=error.code(), details=error.details() or "")

    async def subscribed(self, settle: float = 1.0) -> bool:
        """§11: no "started" signal; no status within about a second means subscribed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), settle)
        return self.end is None

    async def ended(self, timeout: float = TIMEOUT) -> End:  # noqa: ASYNC109
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        assert self.end is not None
        return self.end

    async def close(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.channel.close()


def _serialize_any(message: pb.SubscribeRequest | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class Sink:
    """§10: a ``VisualizationSink`` that implements ``Push`` only (the bridge falls back to it
    from ``PushBatch``). It holds frames in memory; its watermarks are what it holds."""

    def __init__(self, max_frame_bytes: int = 16 << 20) -> None:
        limit = max_frame_bytes + 65536  # §10.5
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ]
        )
        handler = grpc.stream_stream_rpc_method_handler(
            self._push,
            request_deserializer=pb.ProcessedFrame.FromString,
            response_serializer=pb.SinkAck.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("bridge.v1.VisualizationSink", {"Push": handler})]
        )
        self.watermarks: dict[tuple[str, str], int] = {}
        self.frames: list[pb.ProcessedFrame] = []  # every frame the bridge pushed, as received
        self.held: dict[tuple[str, str], list[int]] = {}  # seqs kept, duplicates dropped
        self.push_streams = 0
        self.port = 0

    async def start(self) -> int:
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        await self.server.stop(0)

    async def _push(
        self, frames: AsyncIterator[pb.ProcessedFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.SinkAck]:
        self.push_streams += 1
        # §10.1: watermarks first (an empty SinkAck when nothing is held).
        yield pb.SinkAck(
            watermarks=[
                pb.StreamWatermark(device_id=device, stream_id=stream, seq=seq)
                for (device, stream), seq in self.watermarks.items()
            ]
        )
        async for frame in frames:
            self.frames.append(frame)
            key = (frame.device_id, frame.stream_id)
            if frame.seq > self.watermarks.get(key, 0):  # §10.4: drop what is held already
                self.watermarks[key] = frame.seq
                self.held.setdefault(key, []).append(frame.seq)
            yield pb.SinkAck(bridge_seq=frame.bridge_seq)  # §10.3: held (in memory) = durable
