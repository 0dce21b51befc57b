"""The SDK's EdgeClient against a tiny fake ingest server (tests/integration/fake_bridge.py; real
websockets and grpc.aio servers), each scenario over both transports: delivery and receipts,
resume, flow control, bounded resend buffers, Drain, errors, reconnects and bad URLs. The delivery
suite against the real bridge and sink is ``test_edge_sdk.py``; the load generator's layer on top
(``loadgen.edge``) is ``test_edge_client_loadgen.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from bridge.client import ClientClosed, DeliveryTimeout, EdgeClient, StreamSpec, TlsConfig
from bridge.v1 import bridge_pb2 as pb
from tests.integration.fake_bridge import (
    Env,
    FakeBridge,
    GrpcFront,
    WsFront,
    env_fixture,  # noqa: F401 - the fixture (ws, grpc)
    flow,
    settle,
)


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
