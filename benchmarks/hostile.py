"""Hostile edges and subscribers, one async function per attack (issue 29, "one misbehaving edge
costs only itself").

Why a module of its own: the container e2e runs these attacks in a child process against the
bridge in its image (``python -m benchmarks.hostile --attack ws-pause:3 ...``, so the attacker's
own CPU never delays the harness's probes), and in-process tests can await the same functions
against a bridge on 127.0.0.1:0. Every attack runs until cancelled, counts what it did in its
:class:`AttackStats`, and reconnects when the bridge closes it (a real attacker does), so a
bridge that merely drops the first connection has not won.

The attacks:
  * ``ws_ignore_pause`` / ``grpc_ignore_pause``: large frames as fast as the transport takes
    them, never reading (no PAUSE, ack or error is ever seen);
  * ``subscribers_never_read``: ``Visualization/Subscribe`` calls that never read a frame;
  * ``codec_bombs``: point clouds declared with a codec whose tiny encoded data inflates to
    ``max_frame_bytes`` (:func:`quantized_bomb`, :func:`zstd_bomb`), sent without pause;
  * ``chunk_hold``: ``FrameChunk`` frames opened on many streams and never finished, on a live
    connection that reads and answers pings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, WebSocketException

from bridge.protocol import compress
from bridge.protocol.cloud import make_layout
from bridge.v1 import bridge_pb2 as pb

MiB = 1 << 20
STRIDE = 12  # x, y, z float32
RECONNECT_S = 0.2  # an attacker that is closed comes back this soon
GRPC_MAX_MESSAGE = 64 * MiB
INGEST_CONNECT = "/bridge.v1.Ingest/Connect"
SUBSCRIBE = "/bridge.v1.Visualization/Subscribe"
BOMB_STEP = 0.01  # the quantized codec's coordinate step the bomb streams declare
STOP_WAIT_S = 3.0  # how long the CLI waits for cancelled attacks before it reports


@dataclass(slots=True)
class AttackStats:
    """What one attacker did: the harness checks ``messages > 0`` so that a case whose attack
    never ran cannot pass."""

    name: str
    connects: int = 0
    messages: int = 0
    bytes_sent: int = 0
    closes: int = 0
    last_close: str = ""
    error: str = ""

    def closed(self, why: BaseException) -> None:
        self.closes += 1
        self.last_close = f"{type(why).__name__}: {why}"[:300]

    def sent(self, n: int) -> None:
        self.messages += 1
        self.bytes_sent += n


# ----------------------------------------------------------------------------- messages (pure)


def xyz_fields() -> list[pb.PackedField]:
    return [pb.PackedField(name=n, offset=4 * i, type=pb.FLOAT32) for i, n in enumerate("xyz")]


def stream_spec(
    stream_id: str, *, codec: int = compress.NONE, step: float = 0.0, passthrough: bool = True
) -> pb.StreamSpec:
    """A point-cloud stream; ``passthrough`` by default: an attacker's frames then cost the
    bridge no decimation CPU and reach the sink at full size (the worst case for egress)."""
    spec = pb.StreamSpec(stream_id=stream_id, kind=pb.POINT_CLOUD, passthrough=passthrough)
    if codec != compress.NONE:
        spec.codec = codec  # type: ignore[assignment]
        spec.codec_params.CopyFrom(pb.CodecParams(step=step))
    return spec


def hello_message(device: str, specs: Sequence[pb.StreamSpec]) -> bytes:
    hello = pb.Hello(device_id=device, streams=list(specs))
    return pb.EdgeMessage(hello=hello).SerializeToString()


def cloud_message(stream: str, seq: int, data: bytes) -> bytes:
    """``EdgeMessage{frame}`` carrying an xyz cloud whose ``data`` is ``data`` as given (raw
    records, or a codec's encoding)."""
    cloud = pb.PointCloud(point_stride=STRIDE, fields=xyz_fields(), data=data)
    frame = pb.Frame(stream_id=stream, seq=seq, point_cloud=cloud)
    return pb.EdgeMessage(frame=frame).SerializeToString()


def chunk_message(stream: str, seq: int, total: int, offset: int, data: bytes) -> bytes:
    chunk = pb.FrameChunk(stream_id=stream, seq=seq, total_bytes=total, offset=offset, data=data)
    return pb.EdgeMessage(chunk=chunk).SerializeToString()


def random_cloud(nbytes: int, seed: int = 0) -> bytes:
    """Raw xyz records (uniform in ±50 m) filling ``nbytes`` rounded down to whole points."""
    points = nbytes // STRIDE
    rng = np.random.default_rng(seed)
    return rng.uniform(-50, 50, (points, 3)).astype("<f4").tobytes()


def _xyz_layout() -> Any:
    return make_layout(STRIDE, [(f.name, f.offset, int(f.type)) for f in xyz_fields()])


def quantized_bomb(declared_bytes: int, min_encoded: int = 1024) -> bytes:
    """A valid ``CODEC_QUANTIZED`` encoding (step :data:`BOMB_STEP`) of a cloud of
    ``declared_bytes // 12`` points that is at least ``min_encoded`` bytes on the wire: all points
    at the origin except the first ``k`` random ones, ``k`` the least that reaches
    ``min_encoded`` (found by doubling, then bisection). ~1 KB encodes ~16 MiB; 64 KiB is the
    size from which the bridge decodes off its event loop
    (``bridge.server.uplink.OFFLOAD_BYTES``)."""
    points = declared_bytes // STRIDE
    layout = _xyz_layout()
    spec = compress.CodecSpec(compress.QUANTIZED, BOMB_STEP)
    noise = np.random.default_rng(29).uniform(-50, 50, (points, 3)).astype("<f4")

    def encoded(k: int) -> bytes:
        xyz = np.zeros((points, 3), "<f4")
        xyz[:k] = noise[:k]
        return compress.encode(layout, xyz.tobytes(), spec)

    lo, hi = 0, 16
    while len(encoded(hi)) < min_encoded:
        lo, hi = hi, min(points, hi * 2)
        if hi == points:
            break
    while hi - lo > max(1, hi // 64):  # within ~1.5 % of the least k: close enough
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(encoded(mid)) >= min_encoded else (mid, hi)
    return encoded(hi)


def zstd_bomb(declared_bytes: int) -> bytes:
    """A valid ``CODEC_ZSTD`` encoding of ``declared_bytes // 12`` points at the origin: one zstd
    frame that states its content size (~530 bytes for 16 MiB)."""
    points = declared_bytes // STRIDE
    spec = compress.CodecSpec(compress.ZSTD)
    return compress.encode(_xyz_layout(), bytes(points * STRIDE), spec)


# ----------------------------------------------------------------------------- connections


async def _ws_forever(
    url: str, stats: AttackStats, session: Callable[[ClientConnection], Awaitable[None]]
) -> None:
    """Run ``session`` on a fresh WebSocket connection, again whenever the bridge closes it."""
    while True:
        try:
            async with connect(
                url,
                max_size=None,
                compression=None,
                ping_interval=None,
                open_timeout=10,
                close_timeout=0.2,
            ) as ws:
                stats.connects += 1
                await session(ws)
        except (WebSocketException, InvalidHandshake, OSError, TimeoutError) as e:
            stats.closed(e)
        await asyncio.sleep(RECONNECT_S)


async def _send(ws: ClientConnection, data: bytes, stats: AttackStats) -> None:
    await ws.send(data)
    stats.sent(len(data))
    await asyncio.sleep(0)  # ws.send does not yield while the socket takes data (docs/design.md)


async def _drain(ws: ClientConnection) -> None:
    """Read and discard: keeps the connection healthy (pings answered, acks taken)."""
    with contextlib.suppress(WebSocketException):
        async for _ in ws:
            pass


def _grpc_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        target,
        options=[
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
        ],
    )


# ----------------------------------------------------------------------------- the attacks


async def ws_ignore_pause(
    url: str, device: str, stats: AttackStats, *, frame_bytes: int = 15 * MiB, seed: int = 0
) -> None:
    """A WebSocket edge sending ``frame_bytes`` clouds as fast as TCP takes them; it never
    reads, so PAUSE, acks and errors go unseen."""
    data = random_cloud(frame_bytes - 128, seed)
    seq = 0

    async def session(ws: ClientConnection) -> None:
        nonlocal seq
        await _send(ws, hello_message(device, [stream_spec("s")]), stats)
        while True:
            seq += 1
            await _send(ws, cloud_message("s", seq, data), stats)

    await _ws_forever(url, stats, session)


async def grpc_ignore_pause(
    target: str, device: str, stats: AttackStats, *, frame_bytes: int = 15 * MiB, seed: int = 0
) -> None:
    """The same over ``Ingest/Connect``: writes as fast as HTTP/2 flow control lets it, never
    reads the response stream."""
    data = random_cloud(frame_bytes - 128, seed)
    seq = 0
    while True:
        channel = _grpc_channel(target)
        call = channel.stream_stream(INGEST_CONNECT)()
        stats.connects += 1
        try:
            hello = hello_message(device, [stream_spec("s")])
            await call.write(hello)
            stats.sent(len(hello))
            while True:
                seq += 1
                msg = cloud_message("s", seq, data)
                await call.write(msg)
                stats.sent(len(msg))
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            stats.closed(e)
        finally:
            call.cancel()
            await channel.close()
        await asyncio.sleep(RECONNECT_S)


async def subscribers_never_read(target: str, stats: AttackStats, *, count: int = 4) -> None:
    """``count`` ``Subscribe`` calls (all streams, live) on one channel that never read a frame;
    each call still open a second later counts as one message sent (the bridge sends no headers
    before its first frame, so there is nothing else to wait for)."""
    channel = _grpc_channel(target)
    subscribe = channel.unary_stream(
        SUBSCRIBE, request_serializer=pb.SubscribeRequest.SerializeToString
    )
    calls = [subscribe(pb.SubscribeRequest()) for _ in range(count)]
    stats.connects += 1
    try:
        await asyncio.sleep(1.0)
        for call in calls:
            if call.done():
                stats.closed(RuntimeError(f"Subscribe ended: {await call.code()}"))
            else:
                stats.sent(0)
        await asyncio.Event().wait()
    finally:
        for call in calls:
            call.cancel()
        await channel.close()


async def codec_bombs(
    url: str, device: str, stats: AttackStats, *, bomb: bytes, codec: int
) -> None:
    """Clouds on a stream declared with ``codec`` whose data is ``bomb`` (see
    :func:`quantized_bomb`, :func:`zstd_bomb`), as fast as TCP takes them, never reading."""
    step = BOMB_STEP if codec == compress.QUANTIZED else 0.0
    seq = 0

    async def session(ws: ClientConnection) -> None:
        nonlocal seq
        spec = stream_spec("bomb", codec=codec, step=step)
        await _send(ws, hello_message(device, [spec]), stats)
        while True:
            seq += 1
            await _send(ws, cloud_message("bomb", seq, bomb), stats)

    await _ws_forever(url, stats, session)


async def chunk_hold(
    url: str,
    device: str,
    stats: AttackStats,
    *,
    streams: int = 64,
    frame_bytes: int = 15 * MiB,
    piece_bytes: int = MiB,
    hold_s: float = 30.0,
) -> None:
    """One connection declares ``streams`` streams and sends every ``FrameChunk`` of a
    ``frame_bytes`` frame on each but the last piece, round robin, ignoring PAUSE; then holds
    them ``hold_s`` (reading, so it stays a live, healthy connection) and starts over with new
    seqs. Never finishes a frame."""
    names = [f"c{i}" for i in range(streams)]
    piece = bytes(piece_bytes)
    pieces = max(1, frame_bytes // piece_bytes - 1)  # all but the last
    seq = 0

    async def session(ws: ClientConnection) -> None:
        nonlocal seq
        reader = asyncio.ensure_future(_drain(ws))
        try:
            await _send(ws, hello_message(device, [stream_spec(n) for n in names]), stats)
            while True:
                seq += 1
                for k in range(pieces):
                    for name in names:
                        msg = chunk_message(name, seq, frame_bytes, k * piece_bytes, piece)
                        await _send(ws, msg, stats)
                await asyncio.sleep(hold_s)
        finally:
            reader.cancel()

    await _ws_forever(url, stats, session)


# ----------------------------------------------------------------------------- the CLI


@dataclass(frozen=True, slots=True)
class Targets:
    ws_url: str
    grpc_target: str
    frame_bytes: int  # the flooding and chunking attackers' frames
    max_frame_bytes: int  # the bridge's: what a bomb declares


def _bombs(kind: str, max_frame_bytes: int) -> tuple[bytes, int]:
    declared = max_frame_bytes - 4096  # the decoded cloud fits max_frame_bytes with its header
    if kind == "bomb-quantized":
        return quantized_bomb(declared, 1024), compress.QUANTIZED
    if kind == "bomb-quantized-padded":
        return quantized_bomb(declared, 64 * 1024), compress.QUANTIZED
    return zstd_bomb(declared), compress.ZSTD


#: name -> (targets, index, stats) -> the attack coroutine. ``subscribers:N`` opens N calls in
#: one attacker; every other ``NAME:N`` runs N attackers.
ATTACKS: dict[str, Callable[[Targets, int, AttackStats], Awaitable[None]]] = {
    "ws-pause": lambda t, i, s: ws_ignore_pause(
        t.ws_url, f"bad-ws-{i}", s, frame_bytes=t.frame_bytes, seed=i
    ),
    "grpc-pause": lambda t, i, s: grpc_ignore_pause(
        t.grpc_target, f"bad-grpc-{i}", s, frame_bytes=t.frame_bytes, seed=100 + i
    ),
    "chunk-hold": lambda t, i, s: chunk_hold(
        t.ws_url, f"bad-chunk-{i}", s, frame_bytes=t.frame_bytes
    ),
}
BOMBS = ("bomb-quantized", "bomb-quantized-padded", "bomb-zstd")


def plan(specs: Sequence[str], targets: Targets) -> list[tuple[AttackStats, Awaitable[None]]]:
    """The attack coroutines for ``NAME[:COUNT]`` specs (payloads built here, before any
    connection, so the attack starts at full rate)."""
    out: list[tuple[AttackStats, Awaitable[None]]] = []
    for spec in specs:
        name, _, n = spec.partition(":")
        count = int(n or 1)
        if name == "subscribers":
            stats = AttackStats(spec)
            out.append((stats, subscribers_never_read(targets.grpc_target, stats, count=count)))
        elif name in BOMBS:
            bomb, codec = _bombs(name, targets.max_frame_bytes)
            for i in range(count):
                stats = AttackStats(f"{name}-{i}")
                coro = codec_bombs(targets.ws_url, f"{name}-{i}", stats, bomb=bomb, codec=codec)
                out.append((stats, coro))
        elif name in ATTACKS:
            for i in range(count):
                stats = AttackStats(f"{name}-{i}")
                out.append((stats, ATTACKS[name](targets, i, stats)))
        else:
            raise ValueError(f"unknown attack {name!r}; known: {sorted([*ATTACKS, *BOMBS])}")
    return out


async def run(specs: Sequence[str], targets: Targets, duration_s: float) -> list[AttackStats]:
    """Every attack at once until ``duration_s`` or SIGTERM/SIGINT; their stats."""
    planned = plan(specs, targets)
    tasks = [asyncio.ensure_future(coro) for _, coro in planned]
    print("attacks running", flush=True)  # the harness starts its clock on this line
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), duration_s)
    for task in tasks:
        task.cancel()
    # A send to a bridge that stopped reading may not end at once: the stats are already
    # counted, so they are reported after a short wait whatever the tasks still do.
    await asyncio.wait(tasks, timeout=STOP_WAIT_S)
    for (stats, _), task in zip(planned, tasks, strict=True):
        if task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            stats.error = f"{type(exc).__name__}: {exc}"[:300]
    return [stats for stats, _ in planned]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hostile", description=__doc__)
    p.add_argument("--ws", required=True, metavar="URL", help="ws://HOST:PORT/v1/ingest")
    p.add_argument("--grpc", required=True, metavar="HOST:PORT")
    p.add_argument(
        "--attack",
        action="append",
        required=True,
        metavar="NAME[:N]",
        help=f"one of {', '.join(sorted([*ATTACKS, *BOMBS, 'subscribers']))}; repeatable",
    )
    p.add_argument("--frame-bytes", type=int, default=15 * MiB, metavar="N")
    p.add_argument("--max-frame-bytes", type=int, default=16 * MiB, metavar="N")
    p.add_argument("--duration", type=float, default=3600.0, metavar="S")
    args = p.parse_args(argv)
    targets = Targets(args.ws, args.grpc, args.frame_bytes, args.max_frame_bytes)
    loop = asyncio.new_event_loop()
    stats = loop.run_until_complete(run(args.attack, targets, args.duration))
    print(json.dumps({s.name: asdict(s) for s in stats}), flush=True)
    os._exit(0)  # not asyncio.run's shutdown: it would wait on a send the bridge never reads


if __name__ == "__main__":
    sys.exit(main())
