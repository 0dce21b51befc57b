"""Replay PCD / PLY files to a bridge as one point-cloud stream, at a fixed rate.

    pip install 'simbridge[open3d]'       # file reading uses Open3D's I/O (any PCD/PLY flavour)
    python examples/replay_files.py ws://127.0.0.1:8080/v1/ingest scans/*.pcd --rate 10 --loop 3

Each file becomes one frame: float32 x, y, z, then a packed ``rgb`` (uint32 0x00RRGGBB) when the
file has colours, else a float32 ``intensity`` when it has one. Points with NaN coordinates
(organized clouds) are kept: the bridge drops them while decimating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from bridge.client import EdgeClient, StreamSpec


def read_points(path: Path) -> np.ndarray:
    import open3d as o3d  # optional dependency: only this example needs it

    pcd = o3d.t.io.read_point_cloud(str(path))
    xyz = pcd.point["positions"].numpy().reshape(-1, 3).astype("<f4")
    names, formats = ["x", "y", "z"], ["<f4", "<f4", "<f4"]
    extra = None
    if "colors" in pcd.point:
        c = pcd.point["colors"].numpy().reshape(-1, 3)
        c = (c * 255).round() if c.dtype.kind == "f" else c
        c = c.astype(np.uint32)
        extra = ("rgb", "<u4", (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2])
    elif "intensity" in pcd.point:
        extra = ("intensity", "<f4", pcd.point["intensity"].numpy().reshape(-1))
    if extra is not None:
        names.append(extra[0])
        formats.append(extra[1])
    points = np.zeros(len(xyz), dtype={"names": names, "formats": formats})
    points["x"], points["y"], points["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    if extra is not None:
        points[extra[0]] = extra[2]
    return points


async def replay(
    url: str, device: str, files: list[Path], rate: float, loops: int
) -> dict[str, int]:
    clouds = [read_points(p) for p in files]
    async with EdgeClient(
        url, device_id=device, streams=[StreamSpec("replay", voxel_size=0.02)]
    ) as edge:
        period = 1.0 / rate
        start = time.monotonic()
        sent = 0
        for _ in range(loops):
            for points in clouds:
                await edge.publish("replay", points)
                sent += 1
                await asyncio.sleep(max(0.0, start + sent * period - time.monotonic()))
        await edge.drain(timeout=60)
    return {"frames": sent, "files": len(files), "points": int(sum(len(c) for c in clouds))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="ws://HOST:8080/v1/ingest or grpc://HOST:9090")
    p.add_argument("files", nargs="+", type=Path, help="PCD or PLY files, replayed in order")
    p.add_argument("--device", default="replay")
    p.add_argument("--rate", type=float, default=10.0, help="frames per second")
    p.add_argument("--loop", type=int, default=1, help="times through the list")
    args = p.parse_args()
    out = asyncio.run(replay(args.url, args.device, args.files, args.rate, args.loop))
    print(json.dumps({"device": args.device, **out}))


if __name__ == "__main__":
    main()
