"""Batches on both sides of the bridge: edges may put many frames in one message (FrameBatch),
the bridge puts consecutive frames in one PushBatch message to the sink, and either side that
does not speak batches still gets every frame, in order, once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.client import EdgeClient as EdgeClient_
from bridge.client import StreamSpec as SdkStream
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import (
    RawGrpcEdge,
    cloud_frame,
    grpc_target,
    hello,
    metric,
    running_bridge,
    wait_until,
    ws_url,
)


def grpc_url(bridge: Any) -> str:
    return f"grpc://{grpc_target(bridge)}"


FRAMES = 400


class PushOnlySink(SinkServer):
    """A sink written before PushBatch existed: the generated base answers UNIMPLEMENTED."""

    def _servicer(self) -> Any:
        server = self

        class Servicer(bridge_pb2_grpc.VisualizationSinkServicer):
            async def Push(
                self, request_iterator: AsyncIterator[pb.ProcessedFrame], context: Any
            ) -> None:
                await server._push(request_iterator, context)

        return Servicer()


async def _publish_telemetry(address: str, transport: str, sink: SinkServer) -> None:
    stream = StreamConfig("imu", kind="telemetry")
    edge = EdgeClient(transport, address, f"{transport}-edge", [stream])
    await edge.start()
    for seq in range(1, FRAMES + 1):
        await edge.publish("imu", {"ax": float(seq)})
    assert await edge.wait_delivered(30), edge.stats.as_dict()
    await edge.close()
    totals = sink.record.totals()
    assert totals["delivered"] == FRAMES
    assert totals["lost"] == totals["duplicates"] == totals["reorders"] == 0


async def test_bridge_pushes_small_frames_in_batches() -> None:
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address) as bridge,
    ):
        await _publish_telemetry(ws_url(bridge), "ws", sink)
        assert bridge.pusher is not None and bridge.pusher.batching
        # Fewer messages than frames: consecutive frames shared PushBatch messages.
        assert 0 < sink.push_batches < FRAMES, sink.push_batches


async def test_sink_without_push_batch_gets_one_frame_per_push() -> None:
    async with (
        PushOnlySink(fsync=False) as sink,
        running_bridge(sink_address=sink.address) as bridge,
    ):
        await _publish_telemetry(grpc_target(bridge), "grpc", sink)
        assert bridge.pusher is not None and not bridge.pusher.batching
        assert sink.push_batches == 0


async def test_batching_off_by_setting_uses_push() -> None:
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address, sink_batch_bytes=0) as bridge,
    ):
        await _publish_telemetry(ws_url(bridge), "ws", sink)
        assert await wait_until(lambda: sink.push_streams >= 1)
        assert sink.push_batches == 0


# -- edges -> bridge: FrameBatch -------------------------------------------------------------


def _batch(*frames: pb.Frame) -> bytes:
    return pb.EdgeMessage(batch=pb.FrameBatch(frames=list(frames))).SerializeToString()


async def _ws_session(url: str, *messages: bytes) -> tuple[list[pb.BridgeMessage], int | None]:
    """Hello, then ``messages``; replies until the accepted seqs settle or the bridge closes."""
    replies: list[pb.BridgeMessage] = []
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(hello("batcher", "lidar", "other").SerializeToString())
        welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
        assert welcome.WhichOneof("kind") == "welcome"
        replies.append(welcome)
        for m in messages:
            await ws.send(m)
        try:
            while True:
                raw = await asyncio.wait_for(ws.recv(decode=False), 1.0)
                replies.append(pb.BridgeMessage.FromString(raw))
        except ConnectionClosed as exc:
            return replies, exc.rcvd.code if exc.rcvd else None
        except TimeoutError:
            return replies, None


def _accepted(replies: list[pb.BridgeMessage]) -> dict[str, int]:
    out: dict[str, int] = {}
    for msg in replies:
        if msg.WhichOneof("kind") == "ack":
            for st in msg.ack.streams:
                out[st.stream_id] = max(out.get(st.stream_id, 0), st.accepted_seq)
    return out


async def test_sdk_batches_small_frames_and_every_frame_arrives_once_in_order() -> None:
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address) as bridge,
    ):
        specs = [SdkStream("imu", kind="telemetry")]
        async with EdgeClient_(ws_url(bridge), device_id="dense", streams=specs) as edge:
            assert edge.welcome is not None and edge.welcome.limits.max_batch_frames == 256
            for seq in range(1, FRAMES + 1):
                await edge.publish("imu", {"ax": float(seq)})
            await edge.drain(30)
            assert edge.stats.batches > 0, edge.stats.as_dict()
        messages = metric(bridge, "bridge_frames_received_total", transport="ws")
        accepted = metric(bridge, "bridge_frames_accepted_total")
        assert accepted == FRAMES and 0 < messages < FRAMES  # (+1: the Hello)
        totals = sink.record.totals()
        assert totals["delivered"] == FRAMES
        assert totals["lost"] == totals["duplicates"] == totals["reorders"] == 0


async def test_sdk_sends_single_frames_when_batching_is_off_or_refused() -> None:
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address, max_batch_frames=0) as refusing,
    ):
        specs = [SdkStream("imu", kind="telemetry")]
        async with EdgeClient_(ws_url(refusing), device_id="a", streams=specs) as edge:
            for seq in range(1, 101):
                await edge.publish("imu", {"ax": float(seq)})
            await edge.drain(30)
            assert edge.stats.batches == 0
        async with EdgeClient_(
            grpc_url(refusing), device_id="b", streams=specs, batch_bytes=0
        ) as edge:
            for seq in range(1, 101):
                await edge.publish("imu", {"ax": float(seq)})
            await edge.drain(30)
            assert edge.stats.batches == 0
        assert sink.record.totals()["delivered"] == 200


async def test_a_bad_frame_inside_a_batch_is_refused_alone() -> None:
    async with running_bridge() as bridge:
        replies, closed = await _ws_session(
            ws_url(bridge),
            _batch(cloud_frame("lidar", 1), cloud_frame("nope", 1), cloud_frame("lidar", 2)),
            _batch(cloud_frame("other", 1)),
        )
    assert closed is None
    errors = [m.error for m in replies if m.WhichOneof("kind") == "error"]
    assert [(e.code, e.stream_id, e.fatal) for e in errors] == [(pb.UNKNOWN_STREAM, "nope", False)]
    assert _accepted(replies) == {"lidar": 2, "other": 1}


@pytest.mark.parametrize(
    ("case", "overrides", "message"),
    [
        ("too-many-frames", {"max_batch_frames": 2}, "max_batch_frames 2"),
        ("batches-refused", {"max_batch_frames": 0}, "max_batch_frames 0"),
        ("telemetry-sum", {"max_telemetry_bytes": 3000}, "max_telemetry_bytes 3000"),
    ],
)
async def test_a_batch_beyond_the_welcome_limits_is_fatal(
    case: str, overrides: dict[str, int], message: str
) -> None:
    blob = pb.Frame(stream_id="lidar", telemetry=pb.Telemetry(blob=b"x" * 1200))
    frames = [cloud_frame("lidar", 1), cloud_frame("lidar", 2), cloud_frame("lidar", 3)]
    if case == "telemetry-sum":  # each under the limit, together over it
        frames = [pb.Frame(), pb.Frame(), pb.Frame()]
        for seq, frame in enumerate(frames, 1):
            frame.CopyFrom(blob)
            frame.seq = seq
    async with running_bridge(**overrides) as bridge:
        replies, closed = await _ws_session(ws_url(bridge), _batch(*frames))
        assert (
            metric(
                bridge, "bridge_rejected_messages_total", transport="ws", reason="batch_too_large"
            )
            == 1
        )
    assert closed == 1009, case
    errors = [m.error for m in replies if m.WhichOneof("kind") == "error"]
    assert errors and errors[-1].fatal and message in errors[-1].message
    assert _accepted(replies) == {}


async def test_grpc_batch_is_taken_like_websocket() -> None:
    async with running_bridge() as bridge:
        edge = RawGrpcEdge(grpc_target(bridge))
        await edge.send(hello("g", "lidar").SerializeToString())
        welcome = await edge.recv()
        assert welcome is not None and welcome.welcome.limits.max_batch_frames == 256
        await edge.send(_batch(*(cloud_frame("lidar", seq) for seq in range(1, 6))))
        replies: list[pb.BridgeMessage] = []
        while _accepted(replies).get("lidar", 0) < 5:
            msg = await edge.recv()
            assert msg is not None
            replies.append(msg)
        await edge.close()


async def test_a_backlog_larger_than_a_frame_limit_still_reaches_the_sink(free_port: int) -> None:
    """With small frames allowed (max_frame_bytes 20 kB) and the default 256 KiB PushBatch, a
    backlog of small frames must still go out in messages the push channel accepts: a batch
    stays within sink_batch_bytes, and the channel's limit covers a whole batch."""
    port = free_port  # the sink is down: a backlog builds up in the bridge
    async with running_bridge(
        sink_address=f"127.0.0.1:{port}", passthrough=True, max_frame_bytes=20_000
    ) as bridge:
        edge = EdgeClient("ws", ws_url(bridge), "dev", [StreamConfig("s")])
        await edge.start()
        try:
            for seq in range(1, 61):  # 60 frames of ~12 kB: ~720 kB, several batches
                await edge.publish("s", cloud_frame("s", seq, n=1000).point_cloud)
            stream = bridge.core.streams[("dev", "s")]
            assert await wait_until(lambda: stream.accepted_seq == 60)
            async with SinkServer(listen=f"127.0.0.1:{port}", fsync=False) as sink:
                assert await edge.wait_delivered(60)
                assert sink.record.totals()["delivered"] == 60
        finally:
            await edge.close()
