"""Hardening (issue 11): credentials on every data path, Hello deadlines, bounded work per
message, a sink that goes silent, and clear startup failures. Every test drives a real
``simbridge serve`` process with real clients."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.v1 import bridge_pb2 as pb
from loadgen.clouds import synthetic
from loadgen.edge import EdgeClient, StreamConfig
from loadgen.sink import SinkServer
from tests.integration.harness import (
    ROOT,
    RawGrpcEdge,
    hello,
    serve_process,
    wait_until,
)

TOKEN = "s3cret-token"


async def http_status(port: int, path: str, token: str = "") -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readline()
    writer.close()
    return int(head.split()[1])


async def subscribe_status(port: int, token: str = "") -> grpc.StatusCode:
    """Open Subscribe and read for a moment: OK (still streaming) or the call's error status."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.unary_stream(
            "/bridge.v1.Visualization/Subscribe",
            request_serializer=pb.SubscribeRequest.SerializeToString,
            response_deserializer=pb.ProcessedFrame.FromString,
        )
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        call = method(pb.SubscribeRequest(), metadata=metadata)
        try:
            await asyncio.wait_for(call.read(), 1.0)
        except TimeoutError:
            call.cancel()
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return await call.code()


# -- 1. credentials on every path ------------------------------------------------------------


async def test_subscribe_and_ops_endpoints_require_credentials() -> None:
    async with serve_process(f"--auth-token={TOKEN}") as b:
        assert await subscribe_status(b.grpc) == grpc.StatusCode.UNAUTHENTICATED
        assert await subscribe_status(b.grpc, "wrong") == grpc.StatusCode.UNAUTHENTICATED
        assert await subscribe_status(b.grpc, TOKEN) == grpc.StatusCode.OK
        for path in ("/metrics", "/debug/resources"):
            assert await http_status(b.http, path) == 401, path
            assert await http_status(b.http, path, "wrong") == 401, path
            assert await http_status(b.http, path, TOKEN) == 200, path
        # Probes stay open: the kubelet sends no credentials.
        assert await http_status(b.http, "/healthz") == 200


async def test_viewer_token_is_separate_from_the_edge_token() -> None:
    async with serve_process(f"--auth-token={TOKEN}", "--viewer-token=viewer-only") as b:
        assert await subscribe_status(b.grpc, TOKEN) == grpc.StatusCode.UNAUTHENTICATED
        assert await subscribe_status(b.grpc, "viewer-only") == grpc.StatusCode.OK


async def test_metrics_can_be_left_open_for_prometheus() -> None:
    async with serve_process(f"--auth-token={TOKEN}", "--metrics-auth=open") as b:
        assert await http_status(b.http, "/metrics") == 200
        assert await http_status(b.http, "/debug/resources") == 401


# -- 2. no session takeover by device id ------------------------------------------------------


@pytest.mark.parametrize("resume_token", ["", "not-a-session"])
async def test_hello_for_a_live_device_without_its_token_is_refused(resume_token: str) -> None:
    async with serve_process() as b:
        victim = EdgeClient("ws", b.ws_url, "victim", [StreamConfig("lidar", passthrough=True)])
        await victim.start()
        try:
            async with connect(b.ws_url, compression=None) as ws:
                attack = hello("victim", "lidar", resume_token=resume_token)
                await ws.send(attack.SerializeToString())
                reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
                assert reply.WhichOneof("kind") == "error"
                assert reply.error.code == pb.UNAUTHENTICATED
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 5)
            await victim.publish("lidar", synthetic(32).to_proto())
            assert await victim.wait_delivered(10)
            assert victim.stats.disconnects == 0
        finally:
            await victim.close()


# -- 3. Hello deadline and pre-Hello connection cap --------------------------------------------


async def test_connections_that_never_say_hello_are_closed() -> None:
    async with serve_process("--hello-timeout-seconds=0.5") as b:
        async with connect(b.ws_url, compression=None) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # an Error message first, then the close
                    await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        edge = RawGrpcEdge(f"127.0.0.1:{b.grpc}")
        try:
            assert await edge.status() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            await edge.close()
        # Raw TCP that never completes the HTTP/2 handshake is dropped too.
        reader, writer = await asyncio.open_connection("127.0.0.1", b.grpc)
        try:
            assert await asyncio.wait_for(reader.read(), 15) is not None
        finally:
            writer.close()


# -- 4. bounded CPU per message -----------------------------------------------------------------


@pytest.mark.parametrize("voxel", [math.nan, math.inf, -1.0])
async def test_non_finite_or_negative_voxel_is_refused_at_hello(voxel: float) -> None:
    async with serve_process() as b, connect(b.ws_url, compression=None) as ws:
        spec = pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD, voxel_size=voxel)
        await ws.send(
            pb.EdgeMessage(hello=pb.Hello(device_id="d", streams=[spec])).SerializeToString()
        )
        reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
        assert reply.WhichOneof("kind") == "error"
        assert reply.error.code == pb.INVALID_LAYOUT


async def test_point_budget_below_the_minimum_is_refused_at_hello() -> None:
    async with serve_process() as b, connect(b.ws_url, compression=None) as ws:
        spec = pb.StreamSpec(stream_id="lidar", kind=pb.POINT_CLOUD, max_points=1)
        await ws.send(
            pb.EdgeMessage(hello=pb.Hello(device_id="d", streams=[spec])).SerializeToString()
        )
        reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
        assert reply.WhichOneof("kind") == "error"
        assert reply.error.code == pb.INVALID_LAYOUT
        assert "max_points" in reply.error.message


async def test_telemetry_with_too_many_entries_is_refused_to_its_sender() -> None:
    async with serve_process("--max-telemetry-entries=1000") as b, connect(b.ws_url) as ws:
        await ws.send(
            pb.EdgeMessage(
                hello=pb.Hello(
                    device_id="t", streams=[pb.StreamSpec(stream_id="imu", kind=pb.TELEMETRY)]
                )
            ).SerializeToString()
        )
        assert pb.BridgeMessage.FromString(await ws.recv()).WhichOneof("kind") == "welcome"
        frame = pb.Frame(stream_id="imu", seq=1)
        frame.telemetry.values.update({f"k{i}": float(i) for i in range(1001)})
        await ws.send(pb.EdgeMessage(frame=frame).SerializeToString())
        while True:
            reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
            if reply.WhichOneof("kind") == "error":
                break
        assert reply.error.code == pb.TOO_LARGE
        assert reply.error.seq == 1


# -- 5. a sink that goes silent is detected ----------------------------------------------------


class Blackhole:
    """A TCP relay to the sink whose existing connections can go silent: they stop forwarding
    while both sockets stay open (no reset), like a network partition. Connections opened
    after the partition work normally."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.connections = 0
        self.partitioned_upto = 0  # connections numbered <= this are frozen for good
        self.server: asyncio.Server | None = None
        self._never = asyncio.Event()
        self._relays: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    def partition(self) -> None:
        self.partitioned_upto = self.connections

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if number <= self.partitioned_upto:
                    await self._never.wait()
                dst.write(data)
                await dst.drain()

        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self._relays:
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        for writer in self._writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def test_a_silent_sink_is_detected_and_delivery_resumes() -> None:
    async with SinkServer(fsync=False) as sink:
        hole = Blackhole(sink.port)
        port = await hole.start()
        try:
            async with serve_process(
                f"--sink-address=127.0.0.1:{port}", "--sink-ack-timeout-seconds=1"
            ) as b:
                edge = EdgeClient(
                    "grpc", f"127.0.0.1:{b.grpc}", "d", [StreamConfig("s", passthrough=True)]
                )
                await edge.start()
                try:
                    await edge.publish("s", synthetic(16).to_proto())
                    assert await edge.wait_delivered(10)
                    hole.partition()
                    before = hole.connections
                    for _ in range(5):
                        await edge.publish("s", synthetic(16).to_proto())
                    # The bridge notices without any reset and opens a new connection.
                    assert await wait_until(lambda: hole.connections > before, timeout=15)
                    assert await edge.wait_delivered(15)
                finally:
                    await edge.close()
        finally:
            await hole.close()
        stream = sink.report()["streams"]["d/s"]
        assert (stream["delivered"], stream["duplicates"], stream["lost"]) == (6, 0, 0)


# -- 7. SIGTERM reports an incomplete drain ----------------------------------------------------


async def test_sigterm_exit_status_reports_an_incomplete_drain() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_sink = f"127.0.0.1:{unused.getsockname()[1]}"  # bound, never listening
        async with serve_process(f"--sink-address={dead_sink}", "--drain-grace-seconds=1") as b:
            edge = EdgeClient("ws", b.ws_url, "d", [StreamConfig("s", passthrough=True)])
            await edge.start()
            await edge.publish("s", synthetic(16).to_proto())
            assert await edge.wait_for(lambda: edge.stats.acked_accepted >= 1, 5)
            b.signal(signal.SIGTERM)
            assert await b.wait() == 3
            await edge.close()


async def test_malformed_subscribe_request_is_invalid_argument() -> None:
    async with serve_process() as b, grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc}") as channel:
        method = channel.unary_stream(
            "/bridge.v1.Visualization/Subscribe",
            request_serializer=None,
            response_deserializer=pb.ProcessedFrame.FromString,
        )
        call = method(b"\xff\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(call.read(), 5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Traceback" not in b.logs()


# -- 8. startup failures are one line and exit 2 ------------------------------------------------


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", "serve", "--no-adapt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve("--host=127.0.0.1", f"--ws-port={port}", "--grpc-port=0", "--http-port=0")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert str(port) in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--host=no such host!", "--ws-port=0", "--grpc-port=0", "--http-port=0"),
        ("--sink-address=garbage", "--ws-port=0", "--grpc-port=0", "--http-port=0"),
        ("--ws-port=7000", "--grpc-port=7000", "--http-port=0"),
    ],
)
def test_bad_addresses_are_refused_when_settings_load(args: tuple[str, ...]) -> None:
    done = serve(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip()


# -- 6. device churn leaves nothing behind ------------------------------------------------------


async def test_churning_device_ids_keep_every_structure_bounded() -> None:
    from tests.integration.harness import cloud_frame, running_bridge, ws_url

    async with running_bridge(max_sessions=8) as service:
        for i in range(200):
            async with connect(ws_url(service), compression=None) as ws:
                await ws.send(hello(f"churn-{i}", "lidar").SerializeToString())
                await ws.recv()  # Welcome
                frame = pb.EdgeMessage(frame=cloud_frame("lidar", 1))
                await ws.send(frame.SerializeToString())
                while True:  # until the frame is acknowledged as delivered
                    reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
                    if reply.WhichOneof("kind") == "ack" and any(
                        s.delivered_seq == 1 for s in reply.ack.streams
                    ):
                        break
        assert len(service.core.sessions) <= 8
        assert len(service.core.streams) <= 8
        assert service.edges.tracked_streams <= 8


# -- 1b. per-device credentials -----------------------------------------------------------------


async def test_per_device_tokens_bind_device_ids_and_let_a_device_take_over_its_session(
    tmp_path: Path,
) -> None:
    from bridge.config.credentials import token_digest

    tokens = tmp_path / "devices"
    tokens.write_text(f"robot-1 {token_digest('r1-secret')}\nrobot-2 {token_digest('r2')}\n")
    async with serve_process(f"--device-tokens-file={tokens}") as b:

        async def say_hello(device: str, token: str) -> pb.BridgeMessage:
            async with connect(b.ws_url, compression=None) as ws:
                await ws.send(hello(device, "lidar", auth_token=token).SerializeToString())
                return pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))

        # robot-2's token does not speak for robot-1, nor does no token
        assert (await say_hello("robot-1", "r2")).error.code == pb.UNAUTHENTICATED
        assert (await say_hello("robot-1", "")).error.code == pb.UNAUTHENTICATED
        device = EdgeClient(
            "ws",
            b.ws_url,
            "robot-1",
            [StreamConfig("lidar", passthrough=True)],
            auth_token="r1-secret",
        )
        await device.start()
        try:
            # The device itself (its own token, no resume token: a restart that lost it) may
            # take over its live session; the old connection is closed as superseded.
            async with connect(b.ws_url, compression=None) as ws:
                again = hello("robot-1", "lidar", auth_token="r1-secret")
                await ws.send(again.SerializeToString())
                reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))
                assert reply.WhichOneof("kind") == "welcome" and reply.welcome.resumed
            assert await wait_until(lambda: device.stats.disconnects >= 1, timeout=10)
        finally:
            await device.close()


# -- 4b. the worst legal frames cost their sender, not a well-behaved edge ---------------------


async def test_worst_legal_frames_leave_a_good_edge_fast() -> None:
    """An attacker sends the costliest frames the limits allow (100k-point clouds with the
    smallest point budget and a tiny voxel: the most ladder passes; telemetry maps at the entry
    limit) while a well-behaved edge publishes small frames. Before the ladder was bounded a
    good edge's p50 reached seconds; the bound here is generous for a loaded CI machine."""
    import numpy as np

    from tests.integration.harness import xyz_cloud

    async with serve_process("--workers=1", "--max-telemetry-entries=4096") as b:
        good = EdgeClient(
            "grpc", f"127.0.0.1:{b.grpc}", "good", [StreamConfig("s", passthrough=True)]
        )
        await good.start()
        stop = asyncio.Event()

        async def attack() -> None:
            rng = np.random.default_rng(1)
            cloud = xyz_cloud(rng.uniform(-50, 50, (100_000, 3)))
            specs = [
                pb.StreamSpec(stream_id="c", kind=pb.POINT_CLOUD, voxel_size=1e-6, max_points=8),
                pb.StreamSpec(stream_id="t", kind=pb.TELEMETRY),
            ]
            async with connect(b.ws_url, compression=None, max_size=None) as ws:
                await ws.send(
                    pb.EdgeMessage(
                        hello=pb.Hello(device_id="evil", streams=specs)
                    ).SerializeToString()
                )
                await ws.recv()
                seq = 0
                while not stop.is_set():
                    seq += 1
                    await ws.send(
                        pb.EdgeMessage(
                            frame=pb.Frame(stream_id="c", seq=seq, point_cloud=cloud)
                        ).SerializeToString()
                    )
                    tele = pb.Frame(stream_id="t", seq=seq)
                    tele.telemetry.values.update({f"k{i}": float(i) for i in range(4096)})
                    await ws.send(pb.EdgeMessage(frame=tele).SerializeToString())
                    with contextlib.suppress(TimeoutError):
                        while True:  # read whatever came back (acks, PAUSE) without waiting
                            await asyncio.wait_for(ws.recv(), 0.001)

        attacker = asyncio.create_task(attack())
        try:
            await asyncio.sleep(1.0)  # the attack is under way
            for _ in range(100):
                await good.publish("s", synthetic(32).to_proto())
                await asyncio.sleep(0.03)
            assert await good.wait_delivered(30), str(good.stats.as_dict())
        finally:
            stop.set()
            attacker.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await attacker
            await good.close()
        latencies = sorted(good.stats.latency_ns)
        assert len(latencies) >= 100
        p99 = latencies[int(0.99 * (len(latencies) - 1))] / 1e9
        assert p99 < 2.0, f"good edge p99 {p99:.2f} s under attack"


async def test_ring_capacity_gauge_follows_streams_added_after_a_plan() -> None:
    from tests.integration.harness import metric, running_bridge, ws_url

    async with (
        running_bridge(ring_budget_bytes=64 << 20) as service,
        connect(ws_url(service), compression=None) as first,
    ):
        await first.send(hello("a", "lidar").SerializeToString())
        await first.recv()
        one = metric(service, "bridge_ring_capacity_bytes")
        async with connect(ws_url(service), compression=None) as second:
            await second.send(hello("b", "lidar", "depth").SerializeToString())
            await second.recv()
            assert metric(service, "bridge_ring_capacity_bytes") == (
                service.core.ring_capacity_per_stream
            )
            assert metric(service, "bridge_ring_capacity_bytes") < one
