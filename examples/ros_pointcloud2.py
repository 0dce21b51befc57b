"""A ROS 2 ``sensor_msgs/msg/PointCloud2`` mapped to simbridge fields, without ROS.

    python examples/ros_pointcloud2.py ws://127.0.0.1:8080/v1/ingest --frames 10

In a ROS 2 node, call :func:`to_points` on the message your subscription receives (the
attribute names below are ``sensor_msgs.msg.PointCloud2``'s) and publish the array. Here a
Velodyne-style message is built by hand so the example runs anywhere.

Mapping (docs/protocol.md §4), PointCloud2 -> simbridge:

- ``fields[i].name / offset / datatype`` -> ``PackedField.name / offset / type``: the datatype
  numbers are the same (INT8=1 ... FLOAT64=8);
- ``fields[i].count`` > 1 -> expanded into ``name_0``, ``name_1``, ... (simbridge fields are
  scalars);
- ``point_step`` -> ``point_stride``;
- ``data`` (``height`` rows of ``row_step`` bytes) -> ``data``, without the row padding when
  ``row_step > width * point_step``;
- ``is_bigendian`` -> simbridge is little endian: a big-endian cloud is byte-swapped;
- ``header.frame_id`` -> ``PointCloud.frame_id``; ``header.stamp`` -> ``Frame.capture_time_ns``;
- ``is_dense`` -> not carried: NaN points are dropped by decimation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field

import numpy as np

from bridge.client import EdgeClient, StreamSpec
from bridge.client.payload import PreparedPayload

# sensor_msgs/msg/PointField datatypes -> NumPy (the same codes as simbridge's FieldType)
DATATYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}


@dataclass
class PointField:  # sensor_msgs/msg/PointField
    name: str
    offset: int
    datatype: int
    count: int = 1


@dataclass
class Time:  # builtin_interfaces/msg/Time
    sec: int = 0
    nanosec: int = 0


@dataclass
class Header:  # std_msgs/msg/Header
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class PointCloud2:  # sensor_msgs/msg/PointCloud2
    header: Header
    height: int
    width: int
    fields: list[PointField]
    is_bigendian: bool
    point_step: int
    row_step: int
    data: bytes
    is_dense: bool = False


def to_points(msg: PointCloud2) -> np.ndarray:
    """A little-endian structured array with the message's exact layout (a zero-copy view when
    the message is little endian and has no row padding)."""
    order = ">" if msg.is_bigendian else "<"
    names, formats, offsets = [], [], []
    for f in msg.fields:
        base = order + DATATYPES[f.datatype]
        size = np.dtype(base).itemsize
        for k in range(f.count):
            names.append(f.name if f.count == 1 else f"{f.name}_{k}")
            formats.append(base)
            offsets.append(f.offset + k * size)
    dtype = np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": msg.point_step}
    )
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(msg.height, msg.row_step)
    packed = np.ascontiguousarray(rows[:, : msg.width * msg.point_step]).reshape(-1)
    points = packed.view(dtype)
    if msg.is_bigendian:
        points = points.astype(dtype.newbyteorder("<"))
    return points


def stamp_ns(msg: PointCloud2) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def velodyne_like(i: int, beams: int = 16, azimuths: int = 900) -> PointCloud2:
    """What a Velodyne driver publishes: x y z intensity (float32), ring (uint16), time
    (float32): point_step 22, one row per beam padded to a multiple of 8 bytes."""
    fields = [
        PointField("x", 0, 7),
        PointField("y", 4, 7),
        PointField("z", 8, 7),
        PointField("intensity", 12, 7),
        PointField("ring", 16, 4),
        PointField("time", 18, 7),
    ]
    rec = np.zeros((beams, azimuths), dtype=np.dtype(
        {"names": ["x", "y", "z", "intensity", "ring", "time"],
         "formats": ["<f4", "<f4", "<f4", "<f4", "<u2", "<f4"],
         "offsets": [0, 4, 8, 12, 16, 18], "itemsize": 22}))  # fmt: skip
    el = np.radians(np.linspace(-15, 15, beams))[:, None]
    az = np.linspace(0, 2 * np.pi, azimuths, endpoint=False)[None, :] + 0.05 * i
    r = 8.0 + np.sin(4 * az)
    rec["x"], rec["y"], rec["z"] = (
        r * np.cos(el) * np.cos(az),
        r * np.cos(el) * np.sin(az),
        r * np.sin(el),
    )
    rec["intensity"] = (np.cos(az) + 1) * 50
    rec["ring"] = np.arange(beams)[:, None]
    rec["time"] = az / (2 * np.pi) * 0.1
    row_step = (azimuths * 22 + 7) // 8 * 8
    rows = np.zeros((beams, row_step), dtype=np.uint8)
    rows[:, : azimuths * 22] = rec.view(np.uint8).reshape(beams, -1)
    return PointCloud2(Header(Time(1_700_000_000 + i, 0), "velodyne"), beams, azimuths, fields,
                       False, 22, row_step, rows.tobytes(), True)  # fmt: skip


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="ws://HOST:8080/v1/ingest or grpc://HOST:9090")
    p.add_argument("--device", default="ros-edge")
    p.add_argument("--frames", type=int, default=10)
    args = p.parse_args()
    async with EdgeClient(
        args.url, device_id=args.device, streams=[StreamSpec("velodyne_points", voxel_size=0.2)]
    ) as edge:
        for i in range(args.frames):
            msg = velodyne_like(i)
            points = to_points(msg)
            payload = PreparedPayload.cloud(points, frame_id=msg.header.frame_id)
            await edge.publish("velodyne_points", payload, capture_time_ns=stamp_ns(msg))
        await edge.drain(timeout=30)
        summary = {"device": args.device, "frames": args.frames, "points_per_frame": len(points)}
        print(json.dumps({**summary, "fields": list(points.dtype.names or ())}))


if __name__ == "__main__":
    asyncio.run(main())
