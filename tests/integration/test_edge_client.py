"""The SDK's EdgeClient against a tiny fake ingest server (real websockets and grpc.aio servers).

The fake keeps just enough of the bridge's side of the protocol to drive every client path:
sessions that resume or not, cumulative Acks whose delivery the test releases by hand, and
FlowControl / Error / Drain messages pushed on demand. Each scenario runs over both transports.
The delivery suite against the real bridge and sink is ``test_edge_sdk.py``; the load
generator's layer on top (``loadgen.edge``) is tested at the end of this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from bridge.client import ClientClosed, DeliveryTimeout, EdgeClient, StreamSpec, TlsConfig
from bridge.client.client import cancel_and_wait
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen import cli
from loadgen.edge import EdgeClient as LoadEdgeClient
from loadgen.edge import Publisher

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


@pytest.fixture(params=["ws", "grpc"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
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


# ---------------------------------------------------------------------------------------------


async def test_hello_then_frames_delivered_with_receipts(env: Env) -> None:
    specs = [
        StreamSpec("lidar", voxel_size=0.2, max_points=5000),
        StreamSpec("tel", kind="telemetry"),
    ]
    receipts: list[tuple[str, int, int]] = []
    c = env.client(
        specs=specs,
        device_id="robot-7",
        on_delivered=lambda s, q, t, now: receipts.append((s, q, t)),
    )
    await c.start()
    hello = env.fake.hellos[0]
    assert hello.device_id == "robot-7" and hello.resume_token == ""
    assert [(s.stream_id, s.kind, s.voxel_size) for s in hello.streams] == [
        ("lidar", pb.POINT_CLOUD, 0.2),
        ("tel", pb.TELEMETRY, 0.0),
    ]
    assert [(r.stream_id, r.delivered_seq) for r in hello.resume] == [("lidar", 0), ("tel", 0)]
    seqs = [await c.publish("tel", {"v": float(i)}, capture_time_ns=i) for i in range(5)]
    await c.publish("lidar", pb.PointCloud(point_stride=12), capture_time_ns=9)
    assert seqs == [1, 2, 3, 4, 5]
    assert await c.wait_delivered(5.0)
    assert env.fake.frames == [("tel", i) for i in range(1, 6)] + [("lidar", 1)]
    s = c.stats
    assert (s.published, s.sent, s.resent, s.delivered, s.accepted) == (6, 6, 0, 6, 6)
    assert receipts == [("tel", i + 1, i) for i in range(5)] + [("lidar", 1, 9)]
    await c.close()
    assert c.stats.disconnects == 0


async def test_auth_token_goes_in_hello_and_in_the_transport_header(env: Env) -> None:
    c = env.client(token="s3cret")
    await c.start()
    anon = env.client(device_id="dev2")
    await anon.start()
    assert [h.auth_token for h in env.fake.hellos] == ["s3cret", ""]
    assert env.fake.header_tokens == ["Bearer s3cret", ""]


async def test_connection_loss_and_bridge_restart_resend_above_delivered(env: Env) -> None:
    env.fake.hold = True
    c = env.client()
    await c.start()
    first_session = c.session_id
    for i in range(6):
        await c.publish("a", b"x%d" % i)
    await env.fake.frames_at_least(6)
    await env.fake.release(upto=2)
    await settle(c, lambda: c.stats.delivered == 2, "delivered=2")
    assert c.core.buffered_frames == 4  # 3..6 kept: never discarded before delivered

    env.fake.restart()  # sessions lost; the sink (watermark 2) is not
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect")
    hello = env.fake.hellos[-1]
    assert hello.resume_token == first_session
    assert [(r.stream_id, r.delivered_seq) for r in hello.resume] == [("a", 2)]
    assert c.welcome is not None and not c.welcome.resumed
    frames = await env.fake.frames_at_least(10)
    assert frames[6:] == [("a", 3), ("a", 4), ("a", 5), ("a", 6)]
    await env.fake.release()
    assert await c.wait_delivered(5.0)
    s = c.stats
    assert (s.sent, s.resent, s.disconnects, s.reconnects, s.delivered) == (6, 4, 1, 1, 6)
    await c.close()


async def test_resumed_session_resends_only_what_the_bridge_did_not_accept(env: Env) -> None:
    env.fake.hold = True
    c = env.client()
    await c.start()
    for i in range(2):
        await c.publish("a", b"%d" % i)
    await settle(c, lambda: c.stats.accepted == 2, "accepted=2")
    env.fake.ignore_frames = True  # 3 and 4 are lost in flight
    for i in range(2):
        await c.publish("a", b"%d" % i)
    await env.fake.frames_at_least(4)
    env.fake.ignore_frames = False
    env.fake.kill()
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect")
    assert c.welcome is not None and c.welcome.resumed
    assert (await env.fake.frames_at_least(6))[4:] == [("a", 3), ("a", 4)]
    await env.fake.release()
    assert await c.wait_delivered(5.0)
    assert (c.stats.sent, c.stats.resent) == (4, 2)
    await c.close()


def flow(action: Any, stream_id: str = "") -> pb.BridgeMessage:
    return pb.BridgeMessage(flow_control=pb.FlowControl(action=action, stream_id=stream_id))


async def test_publish_waits_while_paused_and_resumes_on_resume(env: Env) -> None:
    env.fake.on_welcome = [flow(pb.FlowControl.PAUSE)]
    c = env.client(streams=("a", "b"))
    await c.start()
    await settle(c, lambda: c.stats.pauses == 1, "pause")
    first = asyncio.create_task(c.publish("a", b"p"))
    await asyncio.sleep(0.2)
    assert not first.done(), "publish on a paused backpressure stream waits for RESUME"
    assert env.fake.frames == [] and c.core.buffered_frames == 0

    # a per-stream pause holds only that stream
    await env.fake.broadcast(flow(pb.FlowControl.PAUSE, "b"))
    await env.fake.broadcast(flow(pb.FlowControl.RESUME))
    assert await asyncio.wait_for(first, 5.0) == 1
    held = asyncio.create_task(c.publish("b", b"q"))
    assert await c.publish("a", b"p") == 2
    assert await c.wait_for(lambda: c.stats.delivered == 2, 5.0)
    assert not held.done()
    await env.fake.broadcast(flow(pb.FlowControl.RESUME, "b"))
    assert await asyncio.wait_for(held, 5.0) == 1
    await c.drain(5.0)
    assert env.fake.frames == [("a", 1), ("a", 2), ("b", 1)]
    assert c.stats.dropped == 0

    # closing releases a publisher that still waits
    await env.fake.broadcast(flow(pb.FlowControl.PAUSE))
    await settle(c, lambda: c.stats.pauses == 3, "pause again")
    stuck = asyncio.create_task(c.publish("a", b"never"))
    await asyncio.sleep(0.05)
    await c.close()
    with pytest.raises(ClientClosed):
        await asyncio.wait_for(stuck, 5.0)


async def test_drop_oldest_streams_and_open_loop_clients_never_wait(env: Env) -> None:
    env.fake.on_welcome = [flow(pb.FlowControl.PAUSE)]
    lossy = env.client(specs=[StreamSpec("a", kind="telemetry", overflow="drop_oldest")])
    await lossy.start()
    open_loop = env.client(device_id="dev2", wait_for_room=False)
    await open_loop.start()
    await settle(open_loop, lambda: open_loop.stats.pauses == 1, "pause")
    for c in (lossy, open_loop):
        for _ in range(3):
            await asyncio.wait_for(c.publish("a", b"p"), 1.0)
    await asyncio.sleep(0.2)
    assert env.fake.frames == []  # buffered, not sent while paused
    assert lossy.core.buffered_frames == open_loop.core.buffered_frames == 3
    await env.fake.broadcast(flow(pb.FlowControl.RESUME))
    for c in (lossy, open_loop):
        await c.drain(5.0)
    assert sorted(env.fake.frames) == [("a", 1), ("a", 1), ("a", 2), ("a", 2), ("a", 3), ("a", 3)]


async def test_publish_waits_for_room_in_a_full_resend_buffer(env: Env) -> None:
    env.fake.hold = True
    c = env.client(resend_buffer_frames=2)
    await c.start()
    await c.publish("a", b"1")
    await c.publish("a", b"2")
    third = asyncio.create_task(c.publish("a", b"3"))
    await settle(c, lambda: c.stats.accepted == 2, "accepted=2")
    assert not third.done(), "accepted is not delivered: the buffer must keep both"
    await env.fake.release(upto=1)
    assert await asyncio.wait_for(third, 5.0) == 3
    await env.fake.frames_at_least(3)
    await env.fake.release()
    await c.drain(5.0)
    assert c.stats.dropped == 0 and env.fake.frames == [("a", 1), ("a", 2), ("a", 3)]


async def test_drain_raises_with_the_undelivered_count(env: Env) -> None:
    env.fake.hold = True
    c = env.client()
    await c.start()
    for i in range(3):
        await c.publish("a", b"%d" % i)
    await env.fake.frames_at_least(3)  # release() delivers only what the fake has accepted
    await env.fake.release(upto=1)
    with pytest.raises(DeliveryTimeout) as info:
        await c.drain(timeout=0.3)
    assert info.value.undelivered == 2 and "2 frame(s) not delivered" in str(info.value)
    await env.fake.release()
    await c.drain(timeout=5.0)


async def test_resend_buffer_overflow_drops_the_oldest_and_counts(env: Env) -> None:
    env.fake.hold = True
    c = env.client(streams=("a", "b"), resend_buffer_frames=3, wait_for_room=False)
    await c.start()
    await c.publish("a", b"1")
    await c.publish("b", b"1")
    await c.publish("a", b"2")
    await c.publish("a", b"3")  # evicts the oldest frame not yet sent (else the oldest)
    await c.publish("b", b"2")
    assert c.stats.dropped == 2
    kept = sorted((sid, seq) for sid, st in c.core.streams.items() for seq in st.buf)
    assert len(kept) == 3 and ("a", 3) in kept and ("b", 2) in kept
    # which of a/1, b/1, a/2 went out before the evictions depends on the send loop (open loop)
    await settle(c, lambda: ("b", 2) in env.fake.frames, "the last frame sent")
    n = len(env.fake.frames)
    env.fake.restart()  # evicted frames are never resent
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect")
    frames = await env.fake.frames_at_least(n + 3)
    assert sorted(frames[n:]) == kept
    await env.fake.release()
    assert await c.wait_delivered(5.0)
    await c.close()


async def test_resend_buffer_is_bounded_in_bytes_too(env: Env) -> None:
    env.fake.hold = True
    payload = b"z" * 1000
    c = env.client(resend_buffer_bytes=2500, wait_for_room=False)
    await c.start()
    for _ in range(5):
        await c.publish("a", payload)
    assert c.stats.dropped == 3
    kept = list(c.core.streams["a"].buf)
    assert len(kept) == 2 and kept[-1] == 5  # the newest stays; unsent frames go first
    assert c.core.buffered_bytes <= 2500
    await c.close()


async def test_drain_closes_and_reconnects_after_the_delay(env: Env) -> None:
    c = env.client()
    await c.start()
    await c.publish("a", b"1")
    assert await c.wait_delivered(5.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await env.fake.broadcast(pb.BridgeMessage(drain=pb.Drain(reconnect_after_ms=300)))
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect after drain")
    assert loop.time() - t0 >= 0.3
    assert (c.stats.drains, c.stats.disconnects, c.stats.connect_failures) == (1, 1, 0)
    assert env.fake.hellos[-1].resume == [pb.ResumeState(stream_id="a", delivered_seq=1)]
    await c.publish("a", b"2")
    assert await c.wait_delivered(5.0)
    assert env.fake.frames == [("a", 1), ("a", 2)]
    await c.close()


async def test_errors_are_counted_by_code(env: Env) -> None:
    c = env.client()
    await c.start()
    err = pb.Error(code=pb.UNKNOWN_STREAM, message="no such stream", stream_id="zz")
    await env.fake.broadcast(pb.BridgeMessage(error=err))
    await env.fake.broadcast(pb.BridgeMessage(error=err))
    await settle(c, lambda: sum(c.stats.errors.values()) == 2, "errors")
    assert c.stats.errors == {"UNKNOWN_STREAM": 2}
    # A fatal error a retry can pass (a stall; bridge.client.refusal): counted, and reconnected.
    fatal = pb.Error(code=pb.CHUNK_ABANDONED, fatal=True)
    await env.fake.broadcast(pb.BridgeMessage(error=fatal))
    env.fake.kill()  # a fatal error is followed by the bridge closing
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect after fatal error")
    assert c.stats.errors["CHUNK_ABANDONED"] == 1
    # One no retry can pass ends the client's attempts, in the bridge's words.
    fatal = pb.Error(code=pb.PROTOCOL_VIOLATION, message="second Hello", fatal=True)
    await env.fake.broadcast(pb.BridgeMessage(error=fatal))
    env.fake.kill()
    await settle(c, lambda: c.refused is not None, "refused")
    assert c.refused is not None and "PROTOCOL_VIOLATION: second Hello" in str(c.refused)
    assert c.stats.reconnects == 1
    await c.close()


async def test_frames_the_bridge_rejects_are_not_resent(env: Env) -> None:
    env.fake.hold = True
    env.fake.limits = pb.ServerLimits(max_frame_bytes=600)
    c = env.client()
    await c.start()
    await c.publish("a", b"small")
    await c.publish("a", b"x" * 1000)  # above the Welcome's limit: never sent
    await c.publish("a", b"small")
    await env.fake.frames_at_least(2)
    err = pb.Error(code=pb.INVALID_LAYOUT, stream_id="a", seq=3, message="bad")
    await env.fake.broadcast(pb.BridgeMessage(error=err))
    await settle(c, lambda: c.stats.rejected == 2, "rejections")
    assert env.fake.frames == [("a", 1), ("a", 3)]
    assert list(c.core.streams["a"].buf) == [1]
    env.fake.restart()  # frame 1 is resent to the new session; 2 and 3 are not
    await settle(c, lambda: c.stats.reconnects == 1, "reconnect")
    assert (await env.fake.frames_at_least(3))[2:] == [("a", 1)]
    await env.fake.release()
    assert await c.wait_delivered(5.0)
    assert c.stats.resent == 1
    assert c.stats.errors == {"INVALID_LAYOUT": 1}
    await c.close()


async def test_reconnects_and_close_leave_no_task_behind(env: Env) -> None:
    # The load generator's old gRPC connection left grpc's request-iterator task pending on
    # every reconnect ("Task was destroyed but it is pending!" at exit, hundreds per run).
    before = asyncio.all_tasks()
    c = env.client()
    await c.start()
    for i in range(3):  # cut while frames are in flight, the send queue full
        for _ in range(20):
            await c.publish("a", b"x" * 200_000)
        env.fake.kill()
        await settle(c, lambda i=i: c.stats.reconnects == i + 1, "reconnect")
    await c.drain(5.0)
    await c.close()
    me = asyncio.current_task()

    def left() -> list[str]:
        names = (t.get_coro().__qualname__ for t in asyncio.all_tasks() - before if t is not me)
        return [n for n in names if not n.startswith("AioServer.")]  # the server's accept loop

    for _ in range(100):  # the server's side of the last connection winds down meanwhile
        if not left():
            break
        await asyncio.sleep(0.02)
    assert left() == []


def test_urls_and_tls_are_checked_up_front() -> None:
    spec = [StreamSpec("a")]
    for bad in ("http://h:1", "127.0.0.1:9", "grpc://h:1/path", "ws://"):
        with pytest.raises(ValueError, match="URL"):
            EdgeClient(bad, device_id="d", streams=spec)
    with pytest.raises(ValueError, match="wss:// or grpcs://"):
        EdgeClient("ws://h:1/v1/ingest", device_id="d", streams=spec, tls=TlsConfig())
    assert EdgeClient("grpcs://h:1", device_id="d", streams=spec).transport == "grpc"


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_a_server_that_never_answers_is_retried_not_waited_on(transport: str) -> None:
    held: list[asyncio.StreamWriter] = []

    async def black_hole(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept the TCP connection, never say a word

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"ws://127.0.0.1:{port}/v1/ingest" if transport == "ws" else f"grpc://127.0.0.1:{port}"
    c = EdgeClient(
        url,
        device_id="d",
        streams=[StreamSpec("a")],
        connect_timeout=0.2,
        welcome_timeout=0.2,
        seed=1,
    )
    try:
        await c.start(wait=False)
        assert await c.wait_for(lambda: c.stats.connect_failures >= 3, 5.0), c.stats
    finally:
        await c.close()
        for w in held:
            w.transport.abort()
        server.close()
        await server.wait_closed()


async def test_start_fails_clearly_when_nothing_answers(env: Env) -> None:
    url = "ws://127.0.0.1:9/v1/ingest" if env.transport == "ws" else "grpc://127.0.0.1:9"
    c = env.client(url=url)
    with pytest.raises(ConnectionError, match="no Welcome"):
        await c.start(timeout=0.5)
    assert c.stats.connect_failures >= 1


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_reconnects_with_backoff_when_the_bridge_is_down(transport: str) -> None:
    fake = FakeBridge()
    front: WsFront | GrpcFront = WsFront(fake) if transport == "ws" else GrpcFront(fake)
    url = await front.start()
    c = EdgeClient(url, device_id="dev1", streams=[StreamSpec("a", kind="telemetry")], seed=3)
    loop = asyncio.get_running_loop()
    try:
        await c.start()
        fake.hold = True
        await c.publish("a", b"1")
        await fake.frames_at_least(1)
        await front.stop()
        fake.restart()
        # Long enough for gRPC's own subchannel backoff (1 s) to kick in if it were shared.
        await settle(c, lambda: c.stats.connect_failures >= 4, "failed attempts")
        await front.start(port=front.port)
        back = loop.time()
        await settle(c, lambda: c.stats.reconnects == 1, "reconnect")
        # Our next attempt comes within 1.6 s; one more failed attempt would add 3.2 s.
        assert loop.time() - back < 2.5
        assert c.stats.connect_failures <= 5
        fake.hold = False
        assert await c.wait_delivered(5.0)
        assert c.stats.resent == 1 and c.stats.disconnects == 1
    finally:
        await c.close()
        await front.stop()


async def test_publisher_runs_open_loop_and_reports(env: Env) -> None:
    pub = Publisher(
        env.transport,  # type: ignore[arg-type]
        env.url,
        edges=2,
        streams_per_edge=2,
        rate_hz=50,
        duration_s=0.4,
        points=500,
        telemetry=True,
    )
    rep = await pub.run()
    assert rep["published"] == 2 * 3 * 20
    assert rep["acked_delivered"] == rep["published"] and rep["undelivered"] == 0
    assert rep["latency"]["count"] == rep["published"]
    assert rep["disconnects"] == 0 and rep["dropped_resend_overflow"] == 0
    assert {h.device_id for h in env.fake.hellos} == {"loadgen-0", "loadgen-1"}
    assert len(env.fake.frames) == 120


async def test_publish_command_prints_a_json_summary(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = "--ws" if env.transport == "ws" else "--grpc"
    argv = [
        "publish", flag, env.url, "--edges", "2", "--rate", "40", "--duration", "0.25",
        "--points", "200", "--json",
    ]  # fmt: skip
    rc = await asyncio.to_thread(cli.main, argv)  # its own event loop, like the real command
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["published"] == 2 * 10 and rep["undelivered"] == 0
    assert len(env.fake.frames) == 20


def test_unreachable_bridge_exits_1_and_help_lists_the_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["publish", "--grpc", "127.0.0.1:9", "--duration", "0.1", "--connect-timeout", "0.3"]
    assert cli.main(argv) == 1
    assert "error:" in capsys.readouterr().err
    assert {"sink", "publish", "demo"} <= set(cli.COMMANDS)  # demo is filled in elsewhere
    with pytest.raises(SystemExit) as exc:
        cli.main(["publish", "--help"])
    assert exc.value.code == 0
    assert "--streams-per-edge" in capsys.readouterr().out


async def test_load_generator_client_is_open_loop_and_samples_latency(env: Env) -> None:
    env.fake.on_welcome = [flow(pb.FlowControl.PAUSE)]
    transport: Any = env.transport
    target = env.url.removeprefix("grpc://")  # the load generator's gRPC targets are host:port
    c = LoadEdgeClient(transport, target, "load", [StreamSpec("a", kind="telemetry")])
    env.clients.append(c)
    await c.start()
    # The PAUSE follows the Welcome: publish only once the client has read it (no race).
    assert await c.wait_for(lambda: c.core.paused("a"), 5.0)
    for i in range(3):  # paused: buffered at once, never waits (open loop)
        await asyncio.wait_for(c.publish("a", {"i": float(i)}), 1.0)
    assert c.core.buffered_frames == 3 and env.fake.frames == []
    await env.fake.broadcast(flow(pb.FlowControl.RESUME))
    assert await c.wait_delivered(5.0)
    rep = c.stats.as_dict()
    assert (rep["acked_delivered"], rep["dropped_resend_overflow"]) == (3, 0)
    assert rep["latency"]["count"] == 3 and len(c.stats.latency_ns) == 3
