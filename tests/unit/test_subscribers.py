"""SubscriberSet with real asyncio queues: filtering, the backlog from the egress log, a slow
viewer that alone gets exact ``slow_subscriber`` gaps, and queues bounded in bytes that share one
charged buffer per frame."""

from __future__ import annotations

import pytest

from bridge.server.egress import EgressLog, frame_bytes, gap_trailer
from bridge.server.governor import Component, Governor
from bridge.server.ring import Entry, Gap
from bridge.server.session import Stream
from bridge.server.subscribers import Subscriber, SubscriberSet, send_bytes
from bridge.v1 import bridge_pb2 as pb
from tests.unit.test_egress import committed, stream


def decode(data: bytes | None) -> pb.ProcessedFrame:
    assert data is not None
    return pb.ProcessedFrame.FromString(data)


def pairs(s: Stream, entries: list[Entry]) -> list[tuple[Stream, Entry]]:
    return [(s, e) for e in entries]


async def test_fanout_filters_by_stream_and_a_slow_viewer_gets_an_exact_gap() -> None:
    log = EgressLog()
    lidar, tele = stream("lidar"), stream("tele")
    subs = SubscriberSet(log, Governor(1 << 30, 1 << 28))
    everything = Subscriber(set(), queue_frames=10)
    slow = Subscriber({"lidar"}, queue_frames=2)
    subs.attach(everything, 0)
    subs.attach(slow, 0)
    assert len(subs) == 2
    entries = committed(log, lidar, 1, 2, 3, 4)
    assert subs.fanout(pairs(lidar, entries)) == 2  # seqs 3 and 4 do not fit the slow queue
    assert subs.fanout(pairs(tele, committed(log, tele, 1))) == 0  # slow does not want tele
    assert [decode(await slow.get()).seq for _ in range(2)] == [1, 2]
    assert subs.fanout(pairs(lidar, committed(log, lidar, 5))) == 0
    got = decode(await slow.get())
    assert got.seq == 5
    assert (got.gap.first_seq, got.gap.last_seq, got.gap.count) == (3, 4, 2)
    assert got.gap.reason == "slow_subscriber"
    assert [decode(await everything.get()).seq for _ in range(6)] == [1, 2, 3, 4, 1, 5]


async def test_backlog_comes_from_the_log_and_old_positions_are_refused() -> None:
    log = EgressLog()
    lidar = stream()
    subs = SubscriberSet(log, Governor(1 << 30, 1 << 28))
    committed(log, lidar, 1, 2, 3)
    backlog = subs.attach(Subscriber(set(), 10), from_bridge_seq=1)
    assert [decode(b).bridge_seq for b in backlog] == [2, 3]
    log.pop_acked(2)
    with pytest.raises(ValueError, match="no longer held"):
        subs.attach(Subscriber(set(), 10), from_bridge_seq=1)
    assert len(subs) == 1


async def test_close_ends_a_subscription_even_when_its_queue_is_full() -> None:
    log = EgressLog()
    subs = SubscriberSet(log, Governor(1 << 30, 1 << 28))
    sub = Subscriber(set(), queue_frames=1)
    subs.attach(sub, 0)
    lidar = stream()
    subs.fanout(pairs(lidar, committed(log, lidar, 1)))
    subs.close_all()
    assert decode(await sub.get()).seq == 1  # what was queued, then the end
    assert await sub.get() is None
    subs.detach(sub)
    assert len(subs) == 0


async def test_one_shared_buffer_per_frame_charged_once_and_queues_bounded_in_bytes() -> None:
    log = EgressLog()
    lidar = stream()
    entries = committed(log, lidar, 1, 2, 3, 4)
    gov = Governor(1 << 20, reserve_bytes=0)
    subs = SubscriberSet(log, gov)
    a, b = Subscriber(set(), queue_frames=100), Subscriber(set(), queue_frames=100)
    subs.attach(a, 0)
    subs.attach(b, 0)
    one = len(frame_bytes(entries[0]))
    # the reserve is 0: no room for viewers at all, both get exact gaps, nothing is charged
    assert subs.fanout(pairs(lidar, entries[:1])) == 2
    assert gov.charged(Component.SUBSCRIBERS) == 0
    gov.set_budget(1 << 20, reserve_bytes=2 * 2 * one)  # each viewer's share: one frame
    assert subs.fanout(pairs(lidar, entries[1:3])) == 2  # frame 2 for both, frame 3 for none
    # one shared buffer, charged once, with each viewer's copies while it is sent (grpc's copy,
    # and the frame joined with the gap trailer each of them gets: frame 1 was missed)
    trailer = len(gap_trailer(entries[1], Gap(1, 1, 1, "slow_subscriber")))
    held = one + 2 * send_bytes(one, trailer)
    assert gov.charged(Component.SUBSCRIBERS) == held
    first_a, first_b = decode(await a.get()), decode(await b.get())
    assert first_a.seq == first_b.seq == 2 and first_a.gap.count == 1  # frame 1 missed
    # the bytes handed out are still being sent: charged until each viewer asks for more
    assert gov.charged(Component.SUBSCRIBERS) == held and gov.live_charges == 1
    subs.fanout(pairs(lidar, entries[3:]))
    subs.detach(a)
    subs.detach(b)  # queued frames are given back when viewers leave
    assert gov.total_bytes == 0 and gov.live_charges == 0


async def test_a_backlog_frame_is_charged_for_its_copies_until_the_next_is_asked_for() -> None:
    log = EgressLog()
    lidar = stream()
    entries = committed(log, lidar, 1, 2, 3)
    gov = Governor(1 << 20, reserve_bytes=0)
    subs = SubscriberSet(log, gov)
    backlog = subs.attach(Subscriber(set(), 10), from_bridge_seq=1)
    first = next(backlog)  # the join and grpc's copy of it, while the caller sends it
    assert gov.charged(Component.SUBSCRIBERS) == 2 * len(first) == 2 * len(frame_bytes(entries[1]))
    second = next(backlog)
    assert gov.charged(Component.SUBSCRIBERS) == 2 * len(second) and gov.live_charges == 1
    assert [decode(first).bridge_seq, decode(second).bridge_seq] == [2, 3]
    assert list(backlog) == [] and gov.live_charges == 0
