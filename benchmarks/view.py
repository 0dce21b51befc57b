"""What recording costs: frames/s through ``simbridge view`` vs the reference sink, side by side
(``make bench-view`` = ``python -m benchmarks.view``).

Each sink runs as its own process on 127.0.0.1; this process plays the bridge: one Push stream,
every frame written as soon as gRPC flow control allows, the clock stopped when the cumulative
ack covers the last frame. Sinks, in rounds (ABC ABC …, so drifting machine load hits all alike):

- ``reference``: ``simbridge-loadgen sink --record`` (JSON lines of metadata, fsync per batch);
- ``view mcap``: ``simbridge view --mcap`` (every point written, one chunk + fsync per batch),
  no viewers;
- ``view mcap+fox``: the same with the Foxglove server and the web page on (no clients);
- ``view live``: no MCAP: acks once offered to the viewers.

Printed: median frames/s and MB/s per sink and the ratio to the reference sink.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

from bridge.v1 import bridge_pb2 as pb

PUSH = "/bridge.v1.VisualizationSink/Push"


def frames(count: int, points: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    rec = rng.uniform(-20, 20, (points, 4)).astype("<f4")
    cloud = pb.PointCloud(
        point_stride=16,
        fields=[pb.PackedField(name=n, offset=4 * i, type=pb.FLOAT32)
                for i, n in enumerate(("x", "y", "z", "intensity"))],
        data=rec.tobytes(),
    )  # fmt: skip
    now = time.time_ns()
    return [
        pb.ProcessedFrame(
            device_id="bench", stream_id="lidar", seq=i + 1, bridge_seq=i + 1,
            capture_time_ns=now + i, ingest_time_ns=now + i, processed_time_ns=now + i,
            point_cloud=cloud,
        ).SerializeToString()
        for i in range(count)
    ]  # fmt: skip


def start(cmd: list[str], ready: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if ready in line:
            if "grpc=" in line:
                return proc, int(line.split("grpc=")[1].split()[0])
            return proc, int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"{cmd[:4]} did not start")


async def push(port: int, data: list[bytes]) -> float:
    opts = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts) as channel:
        call = channel.stream_stream(
            PUSH, request_serializer=None, response_deserializer=pb.SinkAck.FromString
        )()
        await call.read()  # watermarks first
        t0 = time.perf_counter()

        async def writer() -> None:
            for d in data:
                await call.write(d)

        w = asyncio.create_task(writer())
        while True:
            ack = await call.read()
            if ack is grpc.aio.EOF or ack.bridge_seq >= len(data):
                break
        elapsed = time.perf_counter() - t0
        await w
        call.cancel()
        return elapsed


def sinks(tmp: Path) -> dict[str, tuple[list[str], str]]:
    py = [sys.executable]
    view = [*py, "-m", "bridge.cli", "view", "--listen", "127.0.0.1:0"]
    return {
        "reference": (
            [*py, "-c", "import sys; from loadgen.cli import main; sys.exit(main())", "sink",
             "--listen", "127.0.0.1:0",
             "--record", str(tmp / "ref.jsonl")], "sink listening on",
        ),
        "view mcap": ([*view, "--foxglove-port", "off", "--mcap", str(tmp / "a")], "VIEW_READY"),
        "view mcap+fox": (
            [*view, "--foxglove-port", "0", "--web-port", "0", "--mcap", str(tmp / "b")],
            "VIEW_READY",
        ),
        "view live": ([*view, "--foxglove-port", "0", "--web-port", "0"], "VIEW_READY"),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--points", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    data = frames(args.frames, args.points)
    mb = sum(map(len, data)) / 1e6
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, (cmd, ready) in sinks(Path(tmp := tempfile.mkdtemp())).items():
            proc, port = start(cmd, ready)
            try:
                results.setdefault(name, []).append(asyncio.run(push(port, data)))
            finally:
                proc.terminate()
                proc.wait(30)
                shutil.rmtree(tmp, ignore_errors=True)
    ref = statistics.median(results["reference"])
    print(f"{args.frames} frames x {args.points} points ({mb / args.frames:.2f} MB each), "
          f"{args.rounds} rounds, medians; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'sink':<16}{'frames/s':>10}{'MB/s':>8}{'vs reference':>14}")
    for name, times in results.items():
        t = statistics.median(times)
        print(f"{name:<16}{args.frames / t:>10.0f}{mb / t:>8.1f}{ref / t:>14.2f}")


if __name__ == "__main__":
    main()
