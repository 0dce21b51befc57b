"""ChannelHold (bridge/view/foxglove_hold.py): what a Foxglove channel keeps for its first
subscriber, its bounds, and which losses count as viewer drops."""

from __future__ import annotations

import pytest

pytest.importorskip("foxglove", reason="foxglove-sdk not installed (pip install simbridge[view])")

from bridge.view.convert import GAP, POINT_CLOUD, OutMessage
from bridge.view.foxglove_hold import ChannelHold


def msg(topic: str, i: int, size: int = 10, kind: str = POINT_CLOUD) -> OutMessage:
    device, stream = topic.strip("/").split("/")[:2]
    return OutMessage(topic, kind, bytes([i % 256]) * size, i, i, device, stream)


def test_keeps_in_order_and_hands_over_once() -> None:
    hold = ChannelHold(max_messages=8, max_bytes=1000)
    for i in range(3):
        hold.put(msg("/d/a", i), watching=True)
    hold.put(msg("/d/b", 9), watching=True)
    assert hold.holds("/d/a") and len(hold) == 4 and hold.bytes == 40
    taken = hold.take("/d/a")
    assert [m.log_time for m in taken.messages] == [0, 1, 2] and taken.missed == {}
    assert not hold.holds("/d/a") and hold.bytes == 10
    assert hold.take("/d/a").messages == []


def test_count_bound_keeps_the_newest_and_counts_misses_while_watched() -> None:
    hold = ChannelHold(max_messages=2, max_bytes=1000)
    for i in range(5):
        hold.put(msg("/d/a", i), watching=True)
    hold.put(msg("/d/a/gaps", 0, kind=GAP), watching=True)
    for i in range(3):
        hold.put(msg("/d/a/gaps", i + 1, kind=GAP), watching=True)
    taken = hold.take("/d/a")
    assert [m.log_time for m in taken.messages] == [3, 4]
    assert taken.missed == {("d", "a"): 3}
    assert hold.take("/d/a/gaps").missed == {}  # a gap marker is not a frame
    assert hold.evicted == 5 and hold.missed == 3


def test_no_miss_when_nobody_watched_or_the_channel_had_a_subscriber() -> None:
    hold = ChannelHold(max_messages=1, max_bytes=1000)
    for i in range(3):
        hold.put(msg("/d/a", i), watching=False)
    assert hold.take("/d/a").missed == {}
    for i in range(3):  # subscribed once, then left: a later subscriber is a late joiner
        hold.put(msg("/d/a", i), watching=True)
    assert hold.take("/d/a").missed == {} and hold.missed == 0


def test_byte_bound_drops_the_oldest_of_any_channel() -> None:
    hold = ChannelHold(max_messages=100, max_bytes=50)
    hold.put(msg("/d/a", 0, size=20), watching=False)
    hold.put(msg("/d/b", 1, size=20), watching=False)
    hold.put(msg("/d/a", 2, size=20), watching=False)
    assert hold.bytes == 40 and hold.holds("/d/a")
    assert [m.log_time for m in hold.take("/d/a").messages] == [2]
    assert [m.log_time for m in hold.take("/d/b").messages] == [1]
    hold.put(msg("/d/c", 3, size=51), watching=True)  # larger than the whole hold
    assert not hold.holds("/d/c") and hold.bytes == 0 and hold.missed == 1


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ChannelHold(max_messages=0)
