"""Slow uplinks against the real bridge and sink: lanes, chunk refusals and codecs end to end.

The slow link is a TCP relay that forwards at a fixed byte rate and keeps its own receive buffer
small, so data waits on the sender's side as it does in front of a real bottleneck link.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import zstandard

from bridge.client import EdgeClient, StreamSpec
from bridge.server.app import BridgeService
from bridge.server.governor import Component
from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import lidar_xyzi
from loadgen.sink import SinkServer
from tests.integration.harness import RawGrpcEdge, metric, running_bridge, wait_until

TRANSPORTS = ["ws", "grpc"]


class SlowLink:
    """127.0.0.1:port → target, edge to bridge at ``rate`` bytes/s (the way back is not limited).

    The listening socket's receive buffer is small, so what the relay has not forwarded yet
    stays in the sender (TCP flow control), not in a deep buffer here."""

    def __init__(self, target_port: int, rate: float) -> None:
        self.target_port = target_port
        self.rate = rate
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> SlowLink:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.bind(("127.0.0.1", 0))
        self._server = await asyncio.start_server(self._accept, sock=sock)
        self.port = sock.getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]
        for src, dst, rate in ((reader, up_writer, self.rate), (up_reader, writer, 0.0)):
            task = asyncio.create_task(self._pipe(src, dst, rate))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, rate: float) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await src.read(8192):
                dst.write(data)
                await dst.drain()
                if rate:
                    await asyncio.sleep(len(data) / rate)
        dst.transport.abort()


@contextlib.asynccontextmanager
async def bridge_and_sink(
    arrivals: list[pb.ProcessedFrame],
) -> AsyncIterator[tuple[BridgeService, SinkServer]]:
    async with (
        SinkServer(fsync=False, on_frame=arrivals.append) as sink,
        running_bridge(sink_address=sink.address, passthrough=True) as bridge,
    ):
        yield bridge, sink


def url_for(bridge: BridgeService, transport: str, port: int | None = None) -> str:
    assert bridge.ports is not None
    if transport == "ws":
        return f"ws://127.0.0.1:{port or bridge.ports.ws}/v1/ingest"
    return f"grpc://127.0.0.1:{port or bridge.ports.grpc}"


def big_cloud(points: int = 150_000) -> np.ndarray:
    return np.random.default_rng(7).uniform(-30, 30, (points, 3)).astype(np.float32)


async def arrival_order(transport: str, **client: Any) -> list[tuple[str, int]]:
    """Publish a ~1.8 MB cloud, then (once it is on its way) a telemetry frame, over a 3 MB/s
    link; return the order in which the bridge received them (their ingest times, as the sink
    records them: the bridge's own lanes may reorder frames it holds at the same time)."""
    arrivals: list[pb.ProcessedFrame] = []
    streams = [StreamSpec("lidar"), StreamSpec("status", kind="telemetry")]
    async with bridge_and_sink(arrivals) as (bridge, _sink):
        port = bridge.ports.ws if transport == "ws" else bridge.ports.grpc  # type: ignore[union-attr]
        async with SlowLink(port, rate=3e6) as link:
            url = url_for(bridge, transport, link.port)
            async with EdgeClient(url, device_id="robot", streams=streams, **client) as edge:
                await edge.publish("lidar", big_cloud())
                await asyncio.sleep(0.1)  # the cloud is being sent (it needs ~0.6 s)
                await edge.publish("status", {"battery": 0.5})
                await edge.drain(timeout=30)
    arrivals.sort(key=lambda f: f.ingest_time_ns)
    return [(f.stream_id, f.seq) for f in arrivals]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_telemetry_overtakes_a_large_cloud_on_one_connection(transport: str) -> None:
    # Whole frames in publish order (no lanes): the telemetry frame waits for the cloud.
    assert await arrival_order(transport, chunk_bytes=0) == [("lidar", 1), ("status", 1)]
    # Lanes: it goes between two pieces of the cloud and arrives first. (This relay's slowness
    # is flow control, which the kernel's delivery-rate estimate does not see: pieces are
    # forced here; the shaped link of `make bench-uplink` shows the default choosing them.)
    order = await arrival_order(transport, lane_max_hold_seconds=0.0)
    assert order == [("status", 1), ("lidar", 1)]


def chunk(stream: str, seq: int, total: int, offset: int, data: bytes) -> bytes:
    piece = pb.FrameChunk(stream_id=stream, seq=seq, total_bytes=total, offset=offset, data=data)
    return pb.EdgeMessage(chunk=piece).SerializeToString()


async def test_a_bad_chunk_sequence_is_refused_to_its_sender_only() -> None:
    arrivals: list[pb.ProcessedFrame] = []
    async with bridge_and_sink(arrivals) as (bridge, _sink):
        good = EdgeClient(
            url_for(bridge, "ws"),
            device_id="good",
            streams=[StreamSpec("lidar"), StreamSpec("status", kind="telemetry")],
            chunk_bytes=4096,
        )
        bad = RawGrpcEdge(f"127.0.0.1:{bridge.ports.grpc}")  # type: ignore[union-attr]
        try:
            await good.start()
            hello = pb.Hello(
                device_id="bad", streams=[pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD)]
            )
            await bad.send(pb.EdgeMessage(hello=hello).SerializeToString())
            assert (await bad.recv()).WhichOneof("kind") == "welcome"  # type: ignore[union-attr]
            frame = pb.Frame(stream_id="lidar", seq=1, point_cloud=_xyz(big_cloud(2000)))
            body = frame.SerializeToString()
            published = 0
            for i in range(5):  # the good edge keeps publishing chunked clouds meanwhile
                await good.publish("lidar", big_cloud(3000 + i))
                await good.publish("status", {"i": float(i)})
                published += 2
            # Overlap: the second piece starts inside the first.
            await bad.send(chunk("lidar", 1, len(body), 0, body[:5000]))
            await bad.send(chunk("lidar", 1, len(body), 4000, body[4000:9000]))
            err = await _error(bad)
            assert (err.code, err.stream_id, err.seq, err.fatal) == (
                pb.CHUNK_SEQUENCE,
                "lidar",
                1,
                False,
            )
            # Oversize: total above max_frame_bytes.
            await bad.send(chunk("lidar", 1, 1 << 40, 0, body[:100]))
            assert (await _error(bad)).code == pb.TOO_LARGE
            # Abandoned: a new seq starts while seq 1 is incomplete.
            await bad.send(chunk("lidar", 1, len(body), 0, body[:5000]))
            frame2 = pb.Frame(stream_id="lidar", seq=2, point_cloud=_xyz(big_cloud(10)))
            await bad.send(chunk("lidar", 2, frame2.ByteSize(), 0, frame2.SerializeToString()))
            err = await _error(bad)
            assert (err.code, err.seq) == (pb.CHUNK_ABANDONED, 1)
            # The same connection still works: seq 2 was accepted.
            assert await wait_until(lambda: any(f.device_id == "bad" for f in arrivals))
            await good.drain(timeout=20)
            assert good.stats.errors == {} and good.stats.delivered == published
            rejected = {
                (t, r): metric(bridge, "bridge_rejected_messages_total", transport=t, reason=r)
                for t in ("ws", "grpc")
                for r in ("chunk_sequence", "chunk_too_large", "chunk_abandoned")
            }
            assert rejected == {
                ("grpc", "chunk_sequence"): 1,
                ("grpc", "chunk_too_large"): 1,
                ("grpc", "chunk_abandoned"): 1,
                ("ws", "chunk_sequence"): 0,
                ("ws", "chunk_too_large"): 0,
                ("ws", "chunk_abandoned"): 0,
            }
            # An incomplete frame held when the connection ends is released with it.
            await bad.send(chunk("lidar", 3, len(body), 0, body[:5000]))
            await asyncio.sleep(0.1)
        finally:
            await good.close()
            await bad.close()
        transport = bridge.governor.stats.by_component
        assert await wait_until(lambda: transport[Component.TRANSPORT] == 0)


def _xyz(points: np.ndarray) -> pb.PointCloud:
    return pb.PointCloud(
        point_stride=12,
        fields=[pb.PackedField(name=n, offset=4 * i, type=pb.FLOAT32) for i, n in enumerate("xyz")],
        data=np.ascontiguousarray(points, "<f4").tobytes(),
    )


async def _error(edge: RawGrpcEdge) -> pb.Error:
    while True:
        msg = await edge.recv()
        assert msg is not None
        if msg.WhichOneof("kind") == "error":
            return msg.error


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_compressed_clouds_arrive_decoded_within_the_stated_precision(
    transport: str,
) -> None:
    arrivals: list[pb.ProcessedFrame] = []
    cloud = lidar_xyzi(20_000, seed=3)
    records = np.frombuffer(cloud.data, "<f4").reshape(-1, 4)
    streams = [
        StreamSpec("raw"),
        StreamSpec("lossless", codec="zstd"),
        StreamSpec("lossy", codec="quantized", step=0.001),
    ]
    async with bridge_and_sink(arrivals) as (bridge, _sink):
        url = url_for(bridge, transport)
        async with EdgeClient(url, device_id="robot", streams=streams) as edge:
            for s in streams:
                before = metric(bridge, "bridge_received_bytes_total", transport=transport)
                await edge.publish(s.stream_id, cloud.to_proto())
                await edge.drain(timeout=20)
                wire = metric(bridge, "bridge_received_bytes_total", transport=transport) - before
                got = next(f for f in arrivals if f.stream_id == s.stream_id)
                out = np.frombuffer(got.point_cloud.data, "<f4").reshape(-1, 4)
                assert got.decimation.input_points == len(records), s
                if s.codec == "quantized":
                    err = np.abs(out[:, :3].astype(np.float64) - records[:, :3])
                    assert err.max() <= 0.0005 + 1e-5
                    assert np.array_equal(out[:, 3], records[:, 3])  # attr_step 0: lossless
                    assert wire < len(cloud.data) / 2
                else:
                    assert out.tobytes() == cloud.data
                if s.codec == "zstd":
                    assert wire < len(cloud.data) / 1.2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_large_decode_does_not_hold_up_other_streams(transport: str) -> None:
    """The bridge decodes large clouds in a worker thread: a telemetry frame sent right after
    two of them on the same connection (no lanes: whole frames in publish order) overtakes the
    second, while the cloud stream keeps its order."""
    arrivals: list[pb.ProcessedFrame] = []
    streams = [
        StreamSpec("lidar", codec="quantized", step=0.001),
        StreamSpec("status", kind="telemetry"),
    ]
    async with (
        bridge_and_sink(arrivals) as (bridge, _sink),
        EdgeClient(
            url_for(bridge, transport), device_id="robot", streams=streams, chunk_bytes=0
        ) as edge,
    ):
        scan = _xyz(big_cloud(600_000))  # ~90 ms or more to decode here
        payload = await asyncio.to_thread(edge.prepare, "lidar", scan)
        await edge.publish("lidar", payload)
        await edge.publish("lidar", payload)
        await edge.publish("status", {"battery": 0.5})
        await edge.drain(timeout=60)
        assert edge.stats.errors == {}
    order = [(f.stream_id, f.seq) for f in arrivals]
    assert [o for o in order if o[0] == "lidar"] == [("lidar", 1), ("lidar", 2)]
    assert order.index(("status", 1)) < order.index(("lidar", 2)), order
    got = next(f for f in arrivals if f.stream_id == "lidar")
    assert got.decimation.input_points == 600_000


async def test_clouds_that_do_not_decode_are_refused_on_both_paths() -> None:
    """Garbage under a codec, small (decoded inline) and large (in a worker thread): CODEC_ERROR
    to the sender, not fatal, charges released; the connection goes on."""
    arrivals: list[pb.ProcessedFrame] = []
    async with bridge_and_sink(arrivals) as (bridge, _sink):
        edge = RawGrpcEdge(f"127.0.0.1:{bridge.ports.grpc}")  # type: ignore[union-attr]
        try:
            spec = pb.StreamSpec(
                stream_id="lidar",
                kind=pb.POINT_CLOUD,
                codec=pb.CODEC_ZSTD,
                codec_params=pb.CodecParams(level=3),
            )
            await edge.send(
                pb.EdgeMessage(hello=pb.Hello(device_id="d", streams=[spec])).SerializeToString()
            )
            assert (await edge.recv()).WhichOneof("kind") == "welcome"  # type: ignore[union-attr]
            for seq, size in ((1, 100), (2, 200_000)):
                cloud = _xyz(big_cloud(1))
                cloud.data = bytes(size)  # no zstd frame at all
                frame = pb.Frame(stream_id="lidar", seq=seq, point_cloud=cloud)
                await edge.send(pb.EdgeMessage(frame=frame).SerializeToString())
                err = await _error(edge)
                assert (err.code, err.seq, err.fatal) == (pb.CODEC_ERROR, seq, False)
            good = _xyz(big_cloud(50_000))
            good.data = zstandard.ZstdCompressor(write_content_size=True).compress(
                np.frombuffer(good.data, np.uint8).reshape(-1, 12).T.tobytes()
            )
            frame = pb.Frame(stream_id="lidar", seq=3, point_cloud=good)
            await edge.send(pb.EdgeMessage(frame=frame).SerializeToString())
            assert await wait_until(lambda: any(f.seq == 3 for f in arrivals))
            assert arrivals[-1].decimation.input_points == 50_000
            errors = metric(
                bridge, "bridge_rejected_messages_total", transport="grpc", reason="codec_error"
            )
            assert errors == 2
        finally:
            await edge.close()
        transport = bridge.governor.stats.by_component
        assert await wait_until(lambda: transport[Component.TRANSPORT] == 0)
