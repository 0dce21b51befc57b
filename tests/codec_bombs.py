"""Codec bombs: a few hundred bytes that a codec stream's headers say inflate to a maximum cloud
(for the uplink's unit tests, the integration tests and the container's hostile cases)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import numpy as np
import zstandard
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.protocol import compress
from bridge.protocol.cloud import make_layout
from bridge.v1 import bridge_pb2 as pb

FIELDS = [("x", 0, pb.FLOAT32), ("y", 4, pb.FLOAT32), ("z", 8, pb.FLOAT32)]
FIELDS += [("ring", 12, pb.UINT16)]
STRIDE = 16


def quantized_bomb(points: int, *, poisoned: bool) -> bytes:
    """~1 KB of quantized data declaring ``points`` records of zeros. ``poisoned``: the last
    palette index points past the palette, which the decoder finds only once everything is
    inflated (the most work an edge can make us do for a refusal)."""
    layout = make_layout(STRIDE, FIELDS)  # type: ignore[arg-type]
    spec = compress.CodecSpec(compress.QUANTIZED, 0.01)
    good = compress.encode(layout, np.zeros(points, layout.structured_dtype).tobytes(), spec)
    if not poisoned:
        return good
    header = compress._QHEADER.size + compress._FIELD.size  # one non-coordinate field
    xyz_len = compress._QHEADER.unpack_from(good)[1]
    steps = np.zeros(points, np.uint8)
    steps[-1] = 1  # cumulative index 1 on a palette of one value
    rest = np.zeros(1, "<u2").tobytes() + steps.tobytes()
    rest_block = zstandard.ZstdCompressor(write_content_size=True).compress(rest)
    return good[: header + xyz_len] + rest_block


def frame(stream: str, seq: int, data: bytes) -> pb.Frame:
    cloud = pb.PointCloud(point_stride=STRIDE, data=data)
    cloud.fields.extend(pb.PackedField(name=n, offset=o, type=t) for n, o, t in FIELDS)  # type: ignore[misc]
    return pb.Frame(stream_id=stream, seq=seq, point_cloud=cloud)


def quantized_stream(stream_id: str) -> pb.StreamSpec:
    return pb.StreamSpec(
        stream_id=stream_id,
        kind=pb.POINT_CLOUD,
        codec=pb.CODEC_QUANTIZED,
        codec_params=pb.CodecParams(step=0.01),
    )


def batch_of(frames: list[pb.Frame]) -> bytes:
    """One ``EdgeMessage{batch}`` carrying ``frames``."""
    return pb.EdgeMessage(batch=pb.FrameBatch(frames=frames)).SerializeToString()


async def ws_bomber(
    url: str,
    device_id: str,
    messages: Iterable[bytes],
    *,
    read_timeout_s: float,
    yield_each: bool = False,
) -> tuple[int | None, list[pb.Error]]:
    """Say Hello on stream ``q`` (:func:`quantized_stream`), send ``messages`` until the bridge
    closes the connection, then read to its end (within ``read_timeout_s``): (close code,
    Errors received). ``yield_each``: give the loop a turn after each send."""
    errors: list[pb.Error] = []
    async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
        hello = pb.Hello(device_id=device_id, streams=[quantized_stream("q")])
        await ws.send(pb.EdgeMessage(hello=hello).SerializeToString())

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for raw in ws:
                    msg = pb.BridgeMessage.FromString(raw)  # type: ignore[arg-type]
                    if msg.WhichOneof("kind") == "error":
                        errors.append(msg.error)

        reader = asyncio.create_task(read())
        with contextlib.suppress(ConnectionClosed):
            for message in messages:
                await ws.send(message)
                if yield_each:
                    await asyncio.sleep(0)
        await asyncio.wait_for(reader, read_timeout_s)
        return ws.close_code, errors
