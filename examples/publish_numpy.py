"""Publish NumPy arrays to a bridge with the edge SDK (``bridge.client``).

    python examples/publish_numpy.py ws://127.0.0.1:8080/v1/ingest --frames 20
    python examples/publish_numpy.py grpc://127.0.0.1:9090 --sync      # the blocking facade

Three streams show what ``publish`` accepts: an (n, 3) float32 array (x, y, z), a structured
array whose dtype *is* the wire layout (names, offsets and itemsize become the packed fields and
the stride), and a dict of numbers as telemetry. ``drain`` returns once the bridge reports every
frame delivered to its sink.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math

import numpy as np

from bridge.client import EdgeClient, StreamSpec, SyncEdgeClient

STREAMS = [
    StreamSpec("lidar", voxel_size=0.1),  # decimated by the bridge on a 10 cm grid
    StreamSpec("depth", passthrough=True),  # passed through as sent
    StreamSpec("status", kind="telemetry"),
]
#: A structured dtype: 4 floats, a uint16 and 2 bytes of padding = a 20-byte stride on the wire.
DEPTH = np.dtype(
    {
        "names": ["x", "y", "z", "intensity", "ring"],
        "formats": ["<f4", "<f4", "<f4", "<f4", "<u2"],
        "offsets": [0, 4, 8, 12, 16],
        "itemsize": 20,
    }
)


def ring_scan(i: int, n: int = 5000) -> np.ndarray:
    """(n, 3) float32: a ring of points 5 m around the sensor, tilting with i."""
    a = np.linspace(0, 2 * math.pi, n, endpoint=False)
    z = 0.5 * np.sin(3 * a + 0.3 * i)
    return np.stack([5 * np.cos(a), 5 * np.sin(a), z], axis=1).astype(np.float32)


def depth_points(i: int, n: int = 2000) -> np.ndarray:
    rng = np.random.default_rng(i)
    pts = np.zeros(n, dtype=DEPTH)
    pts["x"], pts["y"] = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    pts["z"] = 2.0 + 0.1 * rng.standard_normal(n)
    pts["intensity"] = rng.uniform(0, 1, n)
    pts["ring"] = np.arange(n) % 16
    return pts


async def publish_async(url: str, device: str, frames: int) -> int:
    async with EdgeClient(url, device_id=device, streams=STREAMS) as edge:
        for i in range(frames):
            await edge.publish("lidar", ring_scan(i))
            await edge.publish("depth", depth_points(i))
            await edge.publish("status", {"battery": 1.0 - i / 100, "speed": 0.5})
            await asyncio.sleep(0.02)
        await edge.drain(timeout=30)
        return edge.undelivered


def publish_sync(url: str, device: str, frames: int) -> int:
    with SyncEdgeClient(url, device_id=device, streams=STREAMS) as edge:
        for i in range(frames):
            edge.publish("lidar", ring_scan(i))
            edge.publish("depth", depth_points(i))
            edge.publish("status", {"battery": 1.0 - i / 100, "speed": 0.5})
        edge.drain(timeout=30)
        return edge.undelivered


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="ws://HOST:8080/v1/ingest or grpc://HOST:9090")
    p.add_argument("--device", default="numpy-edge")
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--sync", action="store_true", help="use the blocking SyncEdgeClient")
    args = p.parse_args()
    if args.sync:
        left = publish_sync(args.url, args.device, args.frames)
    else:
        left = asyncio.run(publish_async(args.url, args.device, args.frames))
    print(
        json.dumps({"device": args.device, "frames_per_stream": args.frames, "undelivered": left})
    )


if __name__ == "__main__":
    main()
