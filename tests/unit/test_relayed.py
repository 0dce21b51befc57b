"""A relayed frame's head (bridge.server.relayed): read from the bytes a sibling sent, the trailer
that announces what this process skipped."""

from __future__ import annotations

import pytest

from bridge.server.egress import frame_bytes
from bridge.server.relayed import relay_trailer, scan_head
from bridge.server.ring import Entry, Gap
from bridge.v1 import bridge_pb2 as pb


def sibling_frame(seq: int, bridge_seq: int, gap: Gap | None = None) -> bytes:
    core = pb.ProcessedFrame(
        stream_id="lidar",
        seq=seq,
        device_id="robot-7",
        capture_time_ns=123,
        point_cloud=pb.PointCloud(point_stride=12, data=b"\x01" * 1200),
    ).SerializeToString()
    entry = Entry(seq=seq, size=len(core), item=core, gap=gap, bridge_seq=bridge_seq)
    return frame_bytes(entry)


def test_the_head_is_read_without_the_payload_and_repeated_fields_merge() -> None:
    data = sibling_frame(9, 41, Gap(5, 8, 4, "drop_oldest"))
    # What a sibling's subscriber appends: a later bridge_seq/gap trailer overrides field-wise.
    data += pb.ProcessedFrame(
        bridge_seq=41, gap=pb.Gap(first_seq=3, last_seq=8, count=6, reason="mixed")
    ).SerializeToString()
    head = scan_head(data)
    assert head.key == ("robot-7", "lidar")
    assert (head.seq, head.bridge_seq) == (9, 41)
    assert head.gap == Gap(3, 8, 6, "mixed")
    assert scan_head(sibling_frame(1, 2)).gap is None


def test_the_trailer_announces_what_was_skipped_merged_with_the_frames_own_gap() -> None:
    data = sibling_frame(12, 50, Gap(11, 11, 1, "drop_oldest"))
    head = scan_head(data)
    parsed = pb.ProcessedFrame.FromString(
        data + relay_trailer(head, Gap(9, 10, 2, "slow_subscriber"))
    )
    assert (parsed.seq, parsed.bridge_seq) == (12, 50)
    assert (parsed.gap.first_seq, parsed.gap.last_seq, parsed.gap.count) == (9, 11, 3)
    assert parsed.gap.reason == "mixed"
    assert len(parsed.point_cloud.data) == 1200


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05lid",  # truncated length-delimited field
        b"\x10",  # truncated varint
        b"\x0b",  # wire type 3 (groups): never in a ProcessedFrame
        pb.ProcessedFrame(stream_id="lidar", seq=1).SerializeToString(),  # no device
    ],
)
def test_bytes_that_are_not_a_frame_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        scan_head(data)
