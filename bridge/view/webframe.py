"""The compact cloud the browser page draws (sans-I/O).

Why not send the wire bytes: the page would need a decoder for every field type and layout.
Instead each frame becomes one little-endian binary message the page reads with typed-array
views and no parsing loop::

    "SBV1" | u32 header length H | H bytes of JSON (space-padded to a multiple of 4)
    float32 x,y,z * n | [float32 intensity * n] | [u8 r,g,b,a * n]

A frame above ``max_points`` is thinned by taking every k-th point (the page is a preview; the
full cloud goes to Foxglove and MCAP).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from bridge.protocol.cloud import PACKED_COLOR_NAMES, field_view, make_layout, xyz_view
from bridge.protocol.errors import BridgeError
from bridge.v1 import bridge_pb2 as pb

MAGIC = b"SBV1"


def encode(frame: pb.ProcessedFrame, max_points: int) -> bytes | None:
    """The page's message for a point-cloud frame; None for telemetry or an unusable layout."""
    if not frame.HasField("point_cloud"):
        return None
    cloud = frame.point_cloud
    try:
        layout = make_layout(cloud.point_stride, [(f.name, f.offset, f.type) for f in cloud.fields])
        xyz = xyz_view(layout, cloud.data)
    except (BridgeError, ValueError):
        return None
    total = len(xyz)
    step = max(1, math.ceil(total / max_points)) if max_points > 0 else 1
    xyz = np.ascontiguousarray(xyz[::step], dtype="<f4")
    n = len(xyz)
    header: dict[str, Any] = {
        "device": frame.device_id,
        "stream": frame.stream_id,
        "topic": f"/{frame.device_id}/{frame.stream_id}",
        "seq": frame.seq,
        "capture_ns": frame.capture_time_ns,
        "n": n,
        "total": total,
        "intensity": False,
        "rgb": False,
    }
    parts = [xyz.tobytes()]
    names = {f.name: f for f in layout.fields}
    if "intensity" in names:
        inten = field_view(layout, cloud.data, "intensity")[::step].astype("<f4")
        finite = inten[np.isfinite(inten)]
        header["intensity"] = True
        header["imin"] = float(finite.min()) if len(finite) else 0.0
        header["imax"] = float(finite.max()) if len(finite) else 1.0
        parts.append(inten.tobytes())
    color = next((f for f in layout.fields if f.is_packed_color), None)
    if color is not None and color.name in PACKED_COLOR_NAMES:
        raw = np.frombuffer(cloud.data, dtype=np.uint8).reshape(total, layout.stride)
        bgr = raw[::step, color.offset : color.offset + 3]  # little-endian 0x00RRGGBB: B, G, R
        rgba = np.empty((n, 4), dtype=np.uint8)
        rgba[:, 0] = bgr[:, 2]
        rgba[:, 1] = bgr[:, 1]
        rgba[:, 2] = bgr[:, 0]
        rgba[:, 3] = 255
        header["rgb"] = True
        parts.append(rgba.tobytes())
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 4)
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, *parts])


def decode(
    message: bytes,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The inverse of :func:`encode` (the page does the same in JS; tests use this one)."""
    if message[:4] != MAGIC:
        raise ValueError("not a simbridge view frame")
    (hlen,) = struct.unpack_from("<I", message, 4)
    header = json.loads(message[8 : 8 + hlen])
    n = header["n"]
    off = 8 + hlen
    xyz = np.frombuffer(message, dtype="<f4", count=n * 3, offset=off).reshape(n, 3)
    off += n * 12
    inten = None
    if header["intensity"]:
        inten = np.frombuffer(message, dtype="<f4", count=n, offset=off)
        off += n * 4
    rgba = None
    if header["rgb"]:
        rgba = np.frombuffer(message, dtype=np.uint8, count=n * 4, offset=off).reshape(n, 4)
    return header, xyz, inten, rgba
