"""Every program in examples/ runs against a real bridge process whose sink is the custom-sink
example: what a new user copies must work as written.

The Node.js edge needs ``node`` and ``npm`` (``ws`` and ``protobufjs`` are installed from the npm
registry into a temp dir); it skips visibly when either is missing or the registry is offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from tests.integration.harness import ROOT, BridgeProcess

#: The tests that share the module's bridge and sink run on the module's event loop.
shared_stack = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = ROOT / "examples"
PCL = ROOT / "tests" / "data" / "pcl"


class SinkExample:
    def __init__(self, proc: subprocess.Popen[str], record: Path) -> None:
        self.proc = proc
        self.record = record

    def frames(self, device: str) -> list[dict[str, Any]]:
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        return [f for f in map(json.loads, lines) if f["device"] == device]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[SinkExample, BridgeProcess]]:
    """One bridge and one custom sink for the module (each example uses its own device id)."""
    record = tmp_path_factory.mktemp("sink") / "frames.jsonl"
    proc = subprocess.Popen(  # noqa: ASYNC220 (spawning does not block)
        [sys.executable, str(EXAMPLES / "custom_sink.py"), "--listen", "127.0.0.1:0",
         "--record", str(record)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
    assert line.startswith("CUSTOM_SINK_READY"), line
    port = int(line.split("port=")[1])
    bridge = await BridgeProcess.start(
        "--sink-address", f"127.0.0.1:{port}", "--ws-port", "0", "--grpc-port", "0",
        "--http-port", "0",
    )  # fmt: skip
    try:
        yield SinkExample(proc, record), bridge
    finally:
        bridge.kill()
        proc.kill()
        proc.wait()
        proc.stdout.close()


async def run_example(*args: str, timeout: float = 90) -> dict[str, Any]:  # noqa: ASYNC109
    """Run a Python example; return the JSON summary it prints last."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def seqs(frames: list[dict[str, Any]], stream: str) -> list[int]:
    return sorted(f["seq"] for f in frames if f["stream"] == stream)


@shared_stack
async def test_publish_numpy_async_and_sync(stack: tuple[SinkExample, BridgeProcess]) -> None:
    sink, bridge = stack
    out = await run_example(str(EXAMPLES / "publish_numpy.py"), bridge.ws_url, "--frames", "5")
    assert out["undelivered"] == 0
    grpc_url = f"grpc://127.0.0.1:{bridge.grpc}"
    await run_example(
        str(EXAMPLES / "publish_numpy.py"), grpc_url, "--sync", "--frames", "4", "--device", "s"
    )
    for device, n in (("numpy-edge", 5), ("s", 4)):
        frames = sink.frames(device)
        for stream in ("lidar", "depth", "status"):
            assert seqs(frames, stream) == list(range(1, n + 1)), (device, stream)
    depth = [f for f in sink.frames("numpy-edge") if f["stream"] == "depth"]
    assert all(f["points"] == 2000 for f in depth)  # passthrough: every point arrives
    status = [f for f in sink.frames("numpy-edge") if f["stream"] == "status"]
    assert status[0]["values"] == {"battery": 1.0, "speed": 0.5}


@shared_stack
async def test_ros_pointcloud2_layout(stack: tuple[SinkExample, BridgeProcess]) -> None:
    sink, bridge = stack
    out = await run_example(str(EXAMPLES / "ros_pointcloud2.py"), bridge.ws_url, "--frames", "3")
    assert out["fields"] == ["x", "y", "z", "intensity", "ring", "time"]
    assert out["points_per_frame"] == 16 * 900
    frames = sink.frames("ros-edge")
    assert seqs(frames, "velodyne_points") == [1, 2, 3]
    assert all(0 < f["points"] < 16 * 900 for f in frames)  # decimated on a 0.2 m grid


def test_ros_mapping_strips_row_padding_and_swaps_big_endian() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import ros_pointcloud2 as ros
    finally:
        sys.path.remove(str(EXAMPLES))
    msg = ros.velodyne_like(0, beams=2, azimuths=3)
    assert msg.row_step == 72 and msg.point_step == 22  # 66 bytes of points + 6 of padding
    pts = ros.to_points(msg)
    assert len(pts) == 6 and pts.dtype.itemsize == 22 and list(pts["ring"]) == [0, 0, 0, 1, 1, 1]
    rec = np.zeros(2, dtype=[("xyz", ">f4", 3), ("n", ">u2", 2)])  # 16 bytes, big endian
    rec["xyz"] = [[1, 2, 3], [4, 5, 6]]
    rec["n"] = [[1, 2], [3, 4]]
    fields = [ros.PointField("x", 0, 7), ros.PointField("y", 4, 7), ros.PointField("z", 8, 7),
              ros.PointField("n", 12, 4, count=2)]  # fmt: skip
    big = ros.PointCloud2(ros.Header(), 1, 2, fields, True, 16, 32, rec.tobytes())
    p = ros.to_points(big)
    assert p.dtype.names == ("x", "y", "z", "n_0", "n_1")
    assert p["x"].tolist() == [1.0, 4.0] and p["n_1"].tolist() == [2, 4]
    assert p.dtype["x"].byteorder in ("<", "=")


@shared_stack
async def test_replay_pcd_and_ply_files(
    stack: tuple[SinkExample, BridgeProcess], tmp_path: Path
) -> None:
    o3d = pytest.importorskip(
        "open3d", reason="open3d not installed (pip install simbridge[open3d])"
    )
    sink, bridge = stack
    pcds = sorted(PCL.glob("frame_*.pcd"))
    ply = tmp_path / "scan.ply"
    o3d.t.io.write_point_cloud(str(ply), o3d.t.io.read_point_cloud(str(pcds[0])))
    out = await run_example(
        str(EXAMPLES / "replay_files.py"), f"grpc://127.0.0.1:{bridge.grpc}",
        *map(str, pcds), str(ply), "--rate", "50", "--loop", "2",
    )  # fmt: skip
    assert out["frames"] == 2 * (len(pcds) + 1)
    assert seqs(sink.frames("replay"), "replay") == list(range(1, out["frames"] + 1))


@shared_stack
async def test_node_edge(stack: tuple[SinkExample, BridgeProcess], tmp_path: Path) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed: the Node.js example was not run")
    mods = tmp_path / "npm"
    install = await asyncio.to_thread(
        subprocess.run,
        [npm, "install", "--prefix", str(mods), "--no-audit", "--no-fund", "--loglevel=error",
         "ws@8", "protobufjs@8"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(f"npm registry unreachable, Node.js example not run: {install.stderr[-300:]}")
    sink, bridge = stack
    done = await asyncio.to_thread(
        subprocess.run,
        [node, str(EXAMPLES / "node_edge.js"), bridge.ws_url, "7"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "NODE_PATH": str(mods / "node_modules")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "device": "node-edge", "published": 7, "delivered": 7, "buffered": 0
    }  # fmt: skip
    assert seqs(sink.frames("node-edge"), "lidar") == list(range(1, 8))


async def test_custom_sink_resumes_from_its_record(tmp_path: Path) -> None:
    """Restarted on the same record, the custom sink sends its watermarks first: the bridge
    sends nothing twice."""
    record = tmp_path / "frames.jsonl"
    record.write_text(json.dumps({"device": "d", "stream": "s", "seq": 4, "points": 1}) + "\n")
    proc = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, str(EXAMPLES / "custom_sink.py"), "--listen", "127.0.0.1:0",
         "--record", str(record)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        import grpc

        from bridge.v1 import bridge_pb2 as pb

        async with grpc.aio.insecure_channel(f"127.0.0.1:{line.split('port=')[1].strip()}") as ch:
            call = ch.stream_stream(
                "/bridge.v1.VisualizationSink/Push",
                request_serializer=pb.ProcessedFrame.SerializeToString,
                response_deserializer=pb.SinkAck.FromString,
            )()
            first = await call.read()
            assert [(w.device_id, w.stream_id, w.seq) for w in first.watermarks] == [("d", "s", 4)]
            for seq, bseq in ((4, 1), (5, 2)):  # a replayed frame, then a new one
                await call.write(pb.ProcessedFrame(device_id="d", stream_id="s", seq=seq,
                                                   bridge_seq=bseq))  # fmt: skip
                assert (await call.read()).bridge_seq == bseq
            call.cancel()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert [json.loads(x)["seq"] for x in record.read_text().splitlines()] == [4, 5]
