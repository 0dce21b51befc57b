"""A tiny fake ingest server for the SDK's tests (test_edge_client*.py): real websockets and
grpc.aio servers in front of a fake that keeps just enough of the bridge's side of the protocol to
drive every client path: sessions that resume or not, cumulative Acks whose delivery the test
releases by hand, and FlowControl / Error / Drain messages pushed on demand. The ``env`` fixture
(import ``env_fixture``) runs each scenario over both transports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from bridge.client import EdgeClient, StreamSpec
from bridge.client.client import cancel_and_wait
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc

MAX = 16 * 1024 * 1024


class FakeConn:
    """One server-side connection, transport-neutral: recv/send/kill."""

    def __init__(self, send: Any, recv: Any, close: Any) -> None:
        self._send, self._recv, self._close = send, recv, close
        self.killed = asyncio.Event()
        self.session = ""
        # grpc.aio allows one write in flight per call (else TOO_MANY_OPERATIONS): serialize.
        self._write_lock = asyncio.Lock()

    async def send(self, msg: pb.BridgeMessage) -> None:
        async with self._write_lock:
            await self._send(msg)

    async def recv(self) -> pb.EdgeMessage | None:
        recv = asyncio.ensure_future(self._recv())
        kill = asyncio.ensure_future(self.killed.wait())
        try:
            await asyncio.wait({recv, kill}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server ended the call: leave no waiter behind
            recv.cancel()
            raise
        finally:
            kill.cancel()
        if self.killed.is_set():
            await cancel_and_wait(recv)
            await self._close()
            return None
        return recv.result()  # type: ignore[no-any-return]


@dataclass
class Session:
    accepted: dict[str, int] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    device: str = ""


class FakeBridge:
    """Welcome + Acks; ``hold`` keeps delivery back until ``release``."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.conns: list[FakeConn] = []
        self.hellos: list[pb.Hello] = []
        self.frames: list[tuple[str, int]] = []
        self.sink: dict[tuple[str, str], int] = {}  # survives restart(), like the real sink
        self.hold = False
        self.ignore_frames = False  # receive but do not accept (frames lost in flight)
        self.on_welcome: list[pb.BridgeMessage] = []
        self.limits = pb.ServerLimits()
        self.header_tokens: list[str] = []  # Authorization header / metadata per connection
        self._n = 0
        self.changed = asyncio.Event()

    async def serve(self, conn: FakeConn) -> None:
        first = await conn.recv()
        if first is None or first.WhichOneof("kind") != "hello":
            return
        hello = first.hello
        self.hellos.append(hello)
        sess = self.sessions.get(hello.resume_token)
        resumed = sess is not None
        if sess is None:
            self._n += 1
            token = f"session-{self._n}"
            sess = self.sessions[token] = Session(device=hello.device_id)
            for spec in hello.streams:
                done = self.sink.get((hello.device_id, spec.stream_id), 0)
                sess.accepted[spec.stream_id] = sess.delivered[spec.stream_id] = done
        else:
            token = hello.resume_token
        conn.session = token
        states = [
            pb.StreamState(stream_id=s, delivered_seq=sess.delivered[s], accepted_seq=a)
            for s, a in sess.accepted.items()
        ]
        welcome = pb.Welcome(session_id=token, streams=states, resumed=resumed, limits=self.limits)
        # Registered before the Welcome goes out: a client may act on the Welcome (or on a
        # PAUSE pushed after it) before this coroutine resumes from sending it, and the test's
        # next broadcast must reach it. Writes are serialized, so the Welcome still goes first.
        self.conns.append(conn)
        try:
            await conn.send(pb.BridgeMessage(welcome=welcome))
            for msg in self.on_welcome:
                await conn.send(msg)
            while (msg := await conn.recv()) is not None:
                frame = msg.frame
                if msg.WhichOneof("kind") == "chunk":  # lanes: a frame counts at its last piece
                    piece = msg.chunk
                    if piece.offset + len(piece.data) < piece.total_bytes:
                        continue
                    frame = pb.Frame(stream_id=piece.stream_id, seq=piece.seq)
                self.frames.append((frame.stream_id, frame.seq))
                self.changed.set()
                if self.ignore_frames:
                    continue
                sid = frame.stream_id
                sess.accepted[sid] = max(sess.accepted[sid], frame.seq)
                if not self.hold:
                    sess.delivered[sid] = sess.accepted[sid]
                    self.sink[(sess.device, sid)] = sess.delivered[sid]
                await conn.send(self._ack(sess, sid))
        finally:
            self.conns.remove(conn)

    @staticmethod
    def _ack(sess: Session, sid: str) -> pb.BridgeMessage:
        sa = pb.StreamAck(
            stream_id=sid, accepted_seq=sess.accepted[sid], delivered_seq=sess.delivered[sid]
        )
        return pb.BridgeMessage(ack=pb.Ack(streams=[sa]))

    async def release(self, upto: int | None = None) -> None:
        """Deliver everything accepted (or up to ``upto``) and tell the live connections."""
        for sess in self.sessions.values():
            for sid, acc in sess.accepted.items():
                sess.delivered[sid] = max(sess.delivered[sid], acc if upto is None else upto)
                self.sink[(sess.device, sid)] = sess.delivered[sid]
        for conn in list(self.conns):
            sess = self.sessions.get(conn.session)
            if sess is not None:
                for sid in sess.accepted:
                    await conn.send(self._ack(sess, sid))

    async def broadcast(self, msg: pb.BridgeMessage) -> None:
        for conn in list(self.conns):
            await conn.send(msg)

    def kill(self) -> None:
        """Drop every connection abruptly (the sessions survive: a network blip)."""
        for conn in list(self.conns):
            conn.killed.set()

    def restart(self) -> None:
        """A bridge restart: connections and sessions gone; only the sink's watermarks stay."""
        self.sessions.clear()
        self.kill()

    async def frames_at_least(self, n: int, timeout: float = 5.0) -> list[tuple[str, int]]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while len(self.frames) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.frames


class WsFront:
    def __init__(self, fake: FakeBridge) -> None:
        self.fake = fake
        self.server: Any = None
        self.port = 0

    async def _handler(self, ws: ServerConnection) -> None:
        async def send(msg: pb.BridgeMessage) -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(msg.SerializeToString())

        async def recv() -> pb.EdgeMessage | None:
            try:
                return pb.EdgeMessage.FromString(await ws.recv())
            except websockets.ConnectionClosed:
                return None

        async def close() -> None:
            ws.transport.abort()

        assert ws.request is not None
        self.fake.header_tokens.append(ws.request.headers.get("Authorization", ""))
        await self.fake.serve(FakeConn(send, recv, close))

    async def start(self, port: int = 0) -> str:
        self.server = await serve(self._handler, "127.0.0.1", port, max_size=MAX, compression=None)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{self.port}/v1/ingest"

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


class GrpcFront(bridge_pb2_grpc.IngestServicer):
    def __init__(self, fake: FakeBridge) -> None:
        self.fake = fake
        self.server: Any = None

    async def Connect(self, request_iterator: Any, context: Any) -> None:
        async def recv() -> pb.EdgeMessage | None:
            msg = await context.read()
            return None if msg is grpc.aio.EOF else msg

        async def close() -> None:
            pass  # returning from the handler ends the call

        meta = dict(context.invocation_metadata() or ())
        self.fake.header_tokens.append(meta.get("authorization", ""))
        await self.fake.serve(FakeConn(context.write, recv, close))

    async def start(self, port: int = 0) -> str:
        opts = [("grpc.max_receive_message_length", MAX), ("grpc.max_send_message_length", MAX)]
        self.server = grpc.aio.server(options=opts)
        bridge_pb2_grpc.add_IngestServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return f"grpc://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(0.2)


@dataclass
class Env:
    fake: FakeBridge
    transport: str
    url: str
    clients: list[EdgeClient] = field(default_factory=list)

    def client(
        self,
        streams: tuple[str, ...] = ("a",),
        *,
        specs: list[StreamSpec] | None = None,
        device_id: str = "dev1",
        url: str | None = None,
        **kw: Any,
    ) -> EdgeClient:
        specs = specs or [StreamSpec(s, kind="telemetry") for s in streams]
        c = EdgeClient(url or self.url, device_id=device_id, streams=specs, seed=1, **kw)
        self.clients.append(c)  # closed by the fixture even when the test fails
        return c


@pytest.fixture(params=["ws", "grpc"], name="env")
async def env_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    fake = FakeBridge()
    front: WsFront | GrpcFront = WsFront(fake) if request.param == "ws" else GrpcFront(fake)
    url = await front.start()
    env = Env(fake, request.param, url)
    yield env
    for c in env.clients:
        await c.close()
    await front.stop()


async def settle(client: EdgeClient, predicate: Any, what: str) -> None:
    assert await client.wait_for(predicate, 5.0), f"timed out waiting for {what}: {client.stats}"


def flow(action: Any, stream_id: str = "") -> pb.BridgeMessage:
    return pb.BridgeMessage(flow_control=pb.FlowControl(action=action, stream_id=stream_id))
