"""``simbridge view`` end to end: a real bridge process pushing to a real view process.

- A Foxglove WebSocket client written here from the published protocol (subprotocol
  ``foxglove.sdk.v1``: JSON ``serverInfo``/``advertise``, a ``subscribe`` op, binary
  ``0x01 | u32 subscription | u64 log time | payload`` messages) receives ``foxglove.PointCloud``
  messages whose points are the bridge's processed frames (checked against the bridge's own
  ``Visualization.Subscribe``).
- The MCAP record reads back with the ``mcap`` library after a clean restart and a SIGKILL:
  right schemas, every frame exactly once, watermarks.
- A viewer that never reads does not slow acks: the edge sees every frame delivered, the view
  counts what that viewer missed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from websockets.asyncio.client import connect

from bridge.client import EdgeClient, StreamSpec
from bridge.client.client import cancel_and_wait
from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.clouds import lidar_xyzrgb
from tests.integration.harness import BridgeProcess
from tests.integration.test_tls import pki  # noqa: F401  (the openssl-made PKI fixture)
from tests.integration.viewproc import ViewProcess

pytest.importorskip("foxglove", reason="foxglove-sdk not installed (pip install simbridge[view])")
pytest.importorskip("mcap", reason="mcap not installed (pip install simbridge[view])")

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mcap.reader import make_reader


@contextlib.asynccontextmanager
async def view_and_bridge(
    *view_args: str, bridge_args: tuple[str, ...] = ()
) -> AsyncIterator[tuple[ViewProcess, BridgeProcess]]:
    view = await ViewProcess.start(*view_args)
    bridge = None
    try:
        bridge = await BridgeProcess.start(
            "--sink-address", view.sink_address, "--ws-port", "0", "--grpc-port", "0",
            "--http-port", "0", "--sink-backoff-initial-seconds", "0.05",
            "--sink-backoff-max-seconds", "0.3", *bridge_args,
        )  # fmt: skip
        yield view, bridge
    finally:
        if bridge is not None:
            bridge.kill()
        view.kill()


def cloud(seed: int, n: int = 4000) -> pb.PointCloud:
    c = lidar_xyzrgb(n, seed=seed)
    return pb.PointCloud(point_stride=c.stride, fields=c.fields, data=c.data)


def edge_for(bridge: BridgeProcess, device: str = "robot-1") -> EdgeClient:
    return EdgeClient(
        bridge.ws_url,
        device_id=device,
        streams=[StreamSpec("lidar", voxel_size=0.25), StreamSpec("imu", kind="telemetry")],
    )


class FoxgloveClient:
    """Just enough of the Foxglove WebSocket protocol to subscribe to topics and decode them."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.server_info: dict[str, Any] = {}
        self.channels: dict[int, dict[str, Any]] = {}
        self.subs: dict[int, dict[str, Any]] = {}  # subscription id -> channel
        self.messages: list[tuple[str, int, bytes]] = []  # (topic, log time, payload)
        self.ops: list[dict[str, Any]] = []  # every JSON message from the server

    async def run(self, topics: set[str]) -> None:
        async for raw in self.ws:
            if isinstance(raw, str):
                msg = json.loads(raw)
                self.ops.append(msg)
                if msg["op"] == "serverInfo":
                    self.server_info = msg
                elif msg["op"] == "advertise":
                    wanted = []
                    for ch in msg["channels"]:
                        self.channels[ch["id"]] = ch
                        subscribed = any(c["id"] == ch["id"] for c in self.subs.values())
                        if ch["topic"] in topics and not subscribed:
                            sub_id = len(self.subs) + 1
                            self.subs[sub_id] = ch
                            wanted.append({"id": sub_id, "channelId": ch["id"]})
                    if wanted:
                        await self.ws.send(json.dumps({"op": "subscribe", "subscriptions": wanted}))
            elif raw[0] == 0x01:  # Message Data
                sub_id, log_time = struct.unpack_from("<IQ", raw, 1)
                self.messages.append((self.subs[sub_id]["topic"], log_time, bytes(raw[13:])))

    def message_class(self, topic: str) -> Any:
        ch = next(c for c in self.channels.values() if c["topic"] == topic)
        assert ch["encoding"] == "protobuf" and ch["schemaEncoding"] == "protobuf"
        fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(ch["schema"]))
        pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            pool.Add(fd)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(ch["schemaName"]))


# Foxglove numbers unsigned before signed; simbridge follows PointCloud2 (signed first).
FOXGLOVE_TYPE = {pb.INT8: 2, pb.UINT8: 1, pb.INT16: 4, pb.UINT16: 3, pb.INT32: 6, pb.UINT32: 5,
                 pb.FLOAT32: 7, pb.FLOAT64: 8}  # fmt: skip


async def test_foxglove_client_receives_the_bridges_processed_clouds() -> None:
    async with view_and_bridge("--foxglove-port", "0", "--frame-id", "lidar=lidar_link") as (
        view,
        bridge,
    ):
        # The bridge's own view of what it processed, to compare against.
        processed: dict[int, pb.ProcessedFrame] = {}
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{bridge.grpc}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        stream = bridge_pb2_grpc.VisualizationStub(channel).Subscribe(pb.SubscribeRequest())

        async def collect() -> None:
            async for frame in stream:
                processed[frame.capture_time_ns] = frame

        collector = asyncio.create_task(collect())
        edge = edge_for(bridge)
        async with connect(
            f"ws://127.0.0.1:{view.foxglove}", subprotocols=["foxglove.sdk.v1"], max_size=None
        ) as ws:
            fox = FoxgloveClient(ws)
            reader = asyncio.create_task(fox.run({"/robot-1/lidar", "/robot-1/imu"}))
            try:
                await edge.start()
                base = time.time_ns()
                deadline = time.monotonic() + 30
                for i in range(1000):  # until the client subscribed and got enough of both
                    t = base + i * 1_000_000
                    await edge.publish("lidar", cloud(i), capture_time_ns=t)
                    await edge.publish("imu", {"speed": float(i)}, capture_time_ns=t + 1)
                    await asyncio.sleep(0.03)
                    topics = [m[0] for m in fox.messages]
                    if topics.count("/robot-1/lidar") >= 5 and topics.count("/robot-1/imu") >= 5:
                        break
                    assert not reader.done(), reader.exception()
                    assert time.monotonic() < deadline, (fox.ops, fox.subs, topics[-20:])
                assert await edge.wait_delivered(10)
            finally:
                await cancel_and_wait(reader)
                await edge.close()
                collector.cancel()
                await channel.close()

    assert ws.subprotocol == "foxglove.sdk.v1"
    assert fox.server_info["op"] == "serverInfo"
    point_cloud = fox.message_class("/robot-1/lidar")
    clouds = [(t, d) for topic, t, d in fox.messages if topic == "/robot-1/lidar"]
    assert len(clouds) >= 5
    compared = 0
    for log_time, payload in clouds:
        msg = point_cloud.FromString(payload)
        stamp = msg.timestamp.seconds * 1_000_000_000 + msg.timestamp.nanos
        assert stamp == log_time  # timestamps from the frame
        if stamp not in processed:  # Subscribe has no "started" signal (protocol.md §11): the
            assert stamp < min(processed)  # first clouds may precede it; Foxglove gets them
            continue
        compared += 1
        want = processed[stamp].point_cloud
        assert want.data and msg.data == want.data  # the decimated points, byte for byte
        assert msg.point_stride == want.point_stride
        assert [(f.name, f.offset, f.type) for f in msg.fields] == [
            (f.name, f.offset, FOXGLOVE_TYPE[f.type]) for f in want.fields
        ]
        assert msg.frame_id == "lidar_link"
        assert processed[stamp].decimation.output_points < processed[stamp].decimation.input_points
    assert compared >= 4
    imu = [json.loads(d) for topic, _, d in fox.messages if topic == "/robot-1/imu"]
    assert imu and all(set(m["values"]) == {"speed"} for m in imu)
    imu_channel = next(c for c in fox.channels.values() if c["topic"] == "/robot-1/imu")
    assert (imu_channel["encoding"], imu_channel["schemaName"]) == ("json", "simbridge.Telemetry")


def read_recording(directory: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"counts": {}, "schemas": {}, "seqs": {}, "watermarks": None}
    files = sorted(directory.glob("simbridge-*.mcap"))
    for path in files:
        with open(path, "rb") as f:
            reader = make_reader(f)
            for schema, ch, message in reader.iter_messages():
                out["counts"][ch.topic] = out["counts"].get(ch.topic, 0) + 1
                out["schemas"][ch.topic] = (schema.name, schema.encoding, ch.message_encoding)
                if ch.topic == "/simbridge/frames":
                    body = json.loads(message.data)
                    out["seqs"].setdefault(body["stream"], []).append(body["seq"])
            for meta in reader.iter_metadata():
                if meta.name == "simbridge.watermarks":
                    out["watermarks"] = json.loads(meta.metadata["watermarks"])
    out["files"] = len(files)
    return out


async def test_mcap_record_survives_restart_and_sigkill_exactly_once(
    tmp_path: Path, free_port: int
) -> None:
    rec = tmp_path / "rec"
    args = ("--listen", f"127.0.0.1:{free_port}", "--foxglove-port", "off", "--mcap", str(rec))
    sent = 0

    async def publish(edge: EdgeClient, n: int) -> None:
        nonlocal sent
        for _ in range(n):
            sent += 1
            await edge.publish("lidar", cloud(sent, n=2000))
            await edge.publish("imu", {"i": float(sent)})
            await asyncio.sleep(0.01)

    async with view_and_bridge(*args) as (view, bridge):
        edge = edge_for(bridge)
        await edge.start()
        try:
            await publish(edge, 10)
            assert await edge.wait_delivered(15)
            assert await view.stop(signal.SIGTERM) == 0  # finishes the file with watermarks
            await publish(edge, 10)  # the bridge holds these while no sink is there
            view2 = await ViewProcess.start(*args)
            try:
                assert await edge.wait_delivered(15)
                assert "resuming with 2 stream watermarks" in view2.logs()
                publishing = asyncio.create_task(publish(edge, 20))
                await asyncio.sleep(0.1)
                view2.proc.kill()  # SIGKILL mid-stream: the last file has no footer
                await asyncio.to_thread(view2.proc.wait)
                await publishing
            finally:
                view2.kill()
            view3 = await ViewProcess.start(*args)
            try:
                assert await edge.wait_delivered(20)
                assert await view3.stop(signal.SIGTERM) == 0
                assert "repaired unfinished MCAP" in view3.logs()
            finally:
                view3.kill()
        finally:
            await edge.close()

    got = read_recording(rec)
    assert sent == 40
    assert got["files"] >= 3
    assert got["counts"]["/robot-1/lidar"] == sent
    assert got["counts"]["/robot-1/imu"] == sent
    assert sorted(got["seqs"]["lidar"]) == list(range(1, sent + 1))  # every frame exactly once
    assert sorted(got["seqs"]["imu"]) == list(range(1, sent + 1))
    assert got["schemas"]["/robot-1/lidar"] == ("foxglove.PointCloud", "protobuf", "protobuf")
    assert got["schemas"]["/robot-1/imu"] == ("simbridge.Telemetry", "jsonschema", "json")
    assert sorted(map(tuple, got["watermarks"])) == [
        ("robot-1", "imu", sent),
        ("robot-1", "lidar", sent),
    ]


async def test_a_viewer_that_never_reads_does_not_slow_acks() -> None:
    async with view_and_bridge("--foxglove-port", "off", "--web-port", "0") as (view, bridge):
        # A browser that completes the WebSocket handshake and then never reads a byte.
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", view.web))
        key = base64.b64encode(b"0123456789abcdef").decode()
        stuck.sendall(
            f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        edge = edge_for(bridge)
        try:
            async with connect(f"ws://127.0.0.1:{view.web}/ws", max_size=None) as good:
                await edge.start()
                started = time.monotonic()
                for i in range(40):
                    await edge.publish("lidar", cloud(i, n=20000))
                    await asyncio.sleep(0.02)
                assert await edge.wait_delivered(20)
                elapsed = time.monotonic() - started
                status = await view.status()
                last = None
                with contextlib.suppress(TimeoutError):
                    while True:  # the reading viewer catches up to the newest frame
                        last = await asyncio.wait_for(good.recv(), 2)
        finally:
            await edge.close()
            stuck.close()
    assert status["bridge"]["frames_recorded"] == 40
    assert status["web"]["clients"] == 2
    assert status["web"]["dropped"] > 0, status["web"]
    lidar = next(s for s in status["streams"] if s["stream"] == "lidar")
    assert lidar["viewer_drops"] > 0
    assert isinstance(last, bytes) and b'"seq": 40' in last[:400]
    assert elapsed < 20


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not found")
async def test_push_over_mtls(pki: Path) -> None:  # noqa: F811  (the fixture)
    """The view's Push server with TLS and required client certificates, like the bridge's
    ``sink_ca_file``/``sink_cert_file``/``sink_key_file`` expect."""
    view_tls = ("--tls-cert-file", str(pki / "server.pem"), "--tls-key-file",
                str(pki / "server.key"), "--tls-client-ca-file", str(pki / "ca.pem"))  # fmt: skip
    bridge_tls = ("--sink-ca-file", str(pki / "ca.pem"), "--sink-cert-file",
                  str(pki / "client.pem"), "--sink-key-file", str(pki / "client.key"))  # fmt: skip
    args = ("--foxglove-port", "off", "--web-port", "0", *view_tls)
    async with view_and_bridge(*args, bridge_args=bridge_tls) as (view, bridge):
        edge = edge_for(bridge)
        try:
            await edge.start()
            for i in range(3):
                await edge.publish("lidar", cloud(i))
            assert await edge.wait_delivered(15)
        finally:
            await edge.close()
        status = await view.status()
    assert status["bridge"]["frames_recorded"] == 3


async def test_sidecar_tees_frames_into_a_view_process(tmp_path: Path) -> None:
    """What ``make run`` does: the reference sink's frames, teed to a view child process, show
    up per run mode and are recorded to MCAP."""
    from bridge.view.sidecar import ViewSidecar

    side = ViewSidecar(tmp_path / "rec", tmp_path / "view.log")
    await asyncio.to_thread(side.start)
    try:
        for mode in ("in-place", "restart"):
            for seq in (1, 2, 3):
                frame = pb.ProcessedFrame(
                    device_id="edge-0", stream_id="lidar", seq=seq, point_cloud=cloud(seq, n=50)
                )
                side.hook(mode, frame)
        assert side.feed is not None
        for _ in range(200):
            if side.feed.sent == 6:
                break
            await asyncio.sleep(0.05)
        assert side.feed.sent == 6 and side.feed.dropped == 0
        await asyncio.sleep(0.3)  # the view's acks; then SIGTERM finishes the file
    finally:
        await asyncio.to_thread(side.stop)
        if side.feed is not None:
            await side.feed.close()
    got = read_recording(tmp_path / "rec")
    assert got["counts"]["/in-place/edge-0/lidar"] == 3
    assert got["counts"]["/restart/edge-0/lidar"] == 3
    assert side.where()[0].startswith("live page:  http://127.0.0.1:")


async def test_foxglove_outlet_drops_for_a_slow_viewer_and_announces_the_gap() -> None:
    from bridge.view import convert
    from bridge.view.fanout import Delivery
    from bridge.view.foxglove_out import FoxgloveOutlet
    from bridge.view.stats import ViewStats

    stats = ViewStats()
    outlet = FoxgloveOutlet(stats, port=0, queue_frames=1)
    logged: list[convert.OutMessage] = []
    outlet._log = logged.append  # type: ignore[method-assign]
    outlet.start()
    try:
        for seq in (1, 2, 3):  # no await in between: the publisher task cannot keep up
            f = pb.ProcessedFrame(
                device_id="d", stream_id="s", seq=seq, point_cloud=cloud(seq, n=10)
            )
            outlet.offer(Delivery(f, convert.to_messages(f, 1, convert.FrameIds()), 1))
        for _ in range(100):
            if logged:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
    finally:
        await outlet.stop()
    assert outlet.dropped == 2 and stats.streams[("d", "s")].viewer_drops == 2
    assert [m.topic for m in logged] == ["/d/s/gaps", "/d/s"]
    gap = json.loads(logged[0].data)
    assert (gap["count"], gap["reason"], gap["seq"]) == (2, "slow_viewer", 3)


def test_bad_arguments_exit_2_with_a_clear_message() -> None:
    for args, message in (
        (["--frame-id", "nope"], "expected [DEVICE/]STREAM=FRAME_ID"),
        (["--listen", "999.1.1.1:5"], "cannot bind 999.1.1.1:5"),
        (["--foxglove-port", "70000"], "port must be 0..65535"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "bridge.cli", "view", "--foxglove-port", "off", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr
