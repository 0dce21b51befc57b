"""A Foxglove client sees the first message of every channel (issue 33).

A channel is advertised when its first message is logged, and a client can subscribe only after
the advertisement reached it, so without the view's hold (:mod:`bridge.view.foxglove_hold`) the
first message of every new channel (a new stream, its first gap marker) reached no client. Real
``simbridge view`` process fed over ``VisualizationSink.Push``, real Foxglove WebSocket client
(subprotocol ``foxglove.sdk.v1``) that subscribes to each channel as soon as it is advertised.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from bridge.client.client import cancel_and_wait
from bridge.v1 import bridge_pb2 as pb
from tests.integration.test_view import FoxgloveClient, cloud
from tests.integration.viewproc import ViewProcess

pytest.importorskip("foxglove", reason="foxglove-sdk not installed (pip install simbridge[view])")

from bridge.view import convert
from bridge.view.fanout import Delivery
from bridge.view.foxglove_out import FoxgloveOutlet
from bridge.view.stats import ViewStats

SUBPROTOCOL = [Subprotocol("foxglove.sdk.v1")]


def frame(device: str, stream: str, seq: int, gap: int = 0) -> pb.ProcessedFrame:
    f = pb.ProcessedFrame(device_id=device, stream_id=stream, seq=seq)
    f.capture_time_ns = (
        1_700_000_000_000_000_000 + seq * 1_000_000 + zlib.crc32((device + stream).encode()) % 997
    )
    if stream == "imu":
        f.telemetry.values["speed"] = float(seq)
    else:
        f.point_cloud.CopyFrom(cloud(seq, n=200))
    if gap:
        f.gap.first_seq, f.gap.last_seq = seq - gap, seq - 1
        f.gap.count, f.gap.reason = gap, "drop_oldest"
    return f


async def wait_until(predicate: Any, timeout: float = 15.0) -> bool:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_foxglove_client_sees_the_first_message_of_every_channel() -> None:
    """Three streams start while the client watches; each starts with a gap marker (its
    first frames were dropped upstream) and has a second gap later. The client gets every
    message of every channel, the first ones included, in order."""
    from bridge.view.feed import ViewFeed

    streams = [("robot-1", "lidar"), ("robot-2", "lidar"), ("robot-1", "imu")]
    first, last, later_gap = 4, 43, 20  # seqs 1-3 dropped upstream; 19 too
    view = await ViewProcess.start("--foxglove-port", "0", "--web-port", "0")
    feed = ViewFeed(view.sink_address)
    topics = {convert.topic(d, s) for d, s in streams} | {
        convert.gap_topic(d, s) for d, s in streams
    }
    sent: dict[str, list[int]] = {}
    try:
        async with connect(
            f"ws://127.0.0.1:{view.foxglove}", subprotocols=SUBPROTOCOL, max_size=None
        ) as ws:
            fox = FoxgloveClient(ws)
            reader = asyncio.create_task(fox.run(topics))
            try:
                assert await wait_until(lambda: bool(fox.server_info), 10)
                for seq in range(first, last + 1):
                    if seq == later_gap - 1:
                        continue
                    for device, stream in streams:
                        gap = 3 if seq == first else 1 if seq == later_gap else 0
                        f = frame(device, stream, seq, gap)
                        feed.offer(f)
                        sent.setdefault(convert.topic(device, stream), []).append(f.capture_time_ns)
                    await asyncio.sleep(0.01)
                want = sum(len(v) for v in sent.values()) + 2 * len(streams)
                await wait_until(lambda: len(fox.messages) >= want)
                await asyncio.sleep(0.3)  # nothing more should come
            finally:
                await cancel_and_wait(reader)
        status = await view.status()
    finally:
        await feed.close()
        view.kill()

    got: dict[str, list[tuple[int, bytes]]] = {}
    for topic, log_time, payload in fox.messages:
        got.setdefault(topic, []).append((log_time, payload))
    for device, stream in streams:
        t = convert.topic(device, stream)
        assert [lt for lt, _ in got.get(t, [])] == sent[t], f"{t}: first message missing?"
        gaps = [json.loads(p) for _, p in got.get(convert.gap_topic(device, stream), [])]
        assert [(g["seq"], g["count"], g["reason"]) for g in gaps] == [
            (first, 3, "drop_oldest"),
            (later_gap, 1, "drop_oldest"),
        ], f"{device}/{stream}: the first gap marker is missing?"
    assert all(s["viewer_drops"] == 0 for s in status["streams"]), status["streams"]
    assert status["foxglove"]["held_messages"] == 0  # everything kept was handed over


async def _offer(outlet: FoxgloveOutlet, frames: list[pb.ProcessedFrame]) -> None:
    for f in frames:
        outlet.offer(Delivery(f, convert.to_messages(f, 1, convert.FrameIds()), 1))
        await asyncio.sleep(0)
    await wait_until(lambda: len(outlet._queue) == 0)
    await asyncio.sleep(0.05)


async def test_a_late_client_gets_the_newest_kept_messages_and_real_misses_are_counted() -> None:
    """Bounded hold, in-process outlet on port 0: a client that connects after a stream went
    quiet gets its newest ``hold_messages`` at once (nobody watched: no viewer drop); a channel
    that a watching client opens late counts what did not fit as viewer drops and says so on
    its gaps channel."""
    stats = ViewStats()
    outlet = FoxgloveOutlet(stats, port=0, hold_messages=4)
    outlet.start()
    try:
        await _offer(outlet, [frame("edge", "done", seq) for seq in range(1, 11)])
        async with connect(
            f"ws://127.0.0.1:{outlet.port}", subprotocols=SUBPROTOCOL, max_size=None
        ) as ws:
            fox = FoxgloveClient(ws)
            reader = asyncio.create_task(fox.run({"/edge/done", "/edge/late/gaps"}))
            try:
                assert await wait_until(lambda: len(fox.messages) >= 4, 10)
                await asyncio.sleep(0.2)
                late = [m for m in fox.messages if m[0] == "/edge/done"]
                assert [lt for _, lt, _ in late] == [
                    frame("edge", "done", s).capture_time_ns for s in (7, 8, 9, 10)
                ]
                assert ("edge", "done") not in stats.streams  # no viewer drop: nobody watched
                # The client watches /edge/done; /edge/late starts and it opens it only later.
                await _offer(outlet, [frame("edge", "late", seq) for seq in range(1, 11)])
                ch = next(c for c in fox.channels.values() if c["topic"] == "/edge/late")
                fox.subs[99] = ch
                await ws.send(
                    json.dumps(
                        {"op": "subscribe", "subscriptions": [{"id": 99, "channelId": ch["id"]}]}
                    )
                )
                assert await wait_until(
                    lambda: sum(m[0] == "/edge/late/gaps" for m in fox.messages) >= 1, 10
                )
                await asyncio.sleep(0.2)
            finally:
                await cancel_and_wait(reader)
    finally:
        await outlet.stop()
    opened = [lt for topic, lt, _ in fox.messages if topic == "/edge/late"]
    assert opened == [frame("edge", "late", s).capture_time_ns for s in (7, 8, 9, 10)]
    assert stats.streams[("edge", "late")].viewer_drops == 6
    gap = json.loads(next(p for t, _, p in fox.messages if t == "/edge/late/gaps"))
    assert (gap["count"], gap["reason"]) == (6, "slow_viewer")
    assert outlet.status()["missed_before_subscribe"] == 6
