"""The container hostile harness's pure parts: the codec bombs are what they claim (a tiny
encoding that really decodes to the declared size, so the bridge cannot refuse them by size
alone), and the good edge's exactly-once and stall figures are computed from the sink's record
as the checks assume."""

from __future__ import annotations

from pathlib import Path

import pytest
import zstandard

from benchmarks.container.hostile import good_edge_at_sink
from benchmarks.hostile import (
    STRIDE,
    cloud_message,
    quantized_bomb,
    stream_spec,
    xyz_fields,
    zstd_bomb,
)
from bridge.protocol import compress
from bridge.v1 import bridge_pb2 as pb
from loadgen.record import FrameRecord, encode

MiB = 1 << 20
DECLARED = 2 * MiB


def _decoded(data: bytes, codec: int) -> int:
    cloud = pb.PointCloud(point_stride=STRIDE, fields=xyz_fields(), data=data)
    spec = compress.spec_of(stream_spec("b", codec=codec, step=0.01))
    return compress.decode_cloud(cloud, spec, 4_000_000, DECLARED)[1]


def test_quantized_bombs_are_small_and_decode_to_the_declared_size() -> None:
    inline = quantized_bomb(DECLARED, 1024)
    padded = quantized_bomb(DECLARED, 64 * 1024)
    assert 1024 <= len(inline) < 2048
    assert 64 * 1024 <= len(padded) < 80 * 1024
    points = DECLARED // STRIDE
    assert _decoded(inline, compress.QUANTIZED) == points * STRIDE
    assert _decoded(padded, compress.QUANTIZED) == points * STRIDE


def test_zstd_bomb_states_its_content_size() -> None:
    bomb = zstd_bomb(DECLARED)
    points = DECLARED // STRIDE
    assert len(bomb) < 1024
    assert zstandard.frame_content_size(bomb) == points * STRIDE
    assert _decoded(bomb, compress.ZSTD) == points * STRIDE


def test_cloud_message_carries_the_data_as_given() -> None:
    msg = pb.EdgeMessage.FromString(cloud_message("s", 7, b"\x01" * 24))
    assert (msg.frame.stream_id, msg.frame.seq, msg.frame.point_cloud.data) == (
        "s",
        7,
        b"\x01" * 24,
    )


def _record(path: Path, rows: list[tuple[str, int, int, bool]]) -> None:
    with path.open("w") as f:
        for device, seq, received_ns, dup in rows:
            rec = FrameRecord(
                device_id=device, stream_id="lidar0", seq=seq, received_ns=received_ns
            )
            f.write(encode(rec, duplicate=dup))


@pytest.mark.parametrize(
    ("rows", "published", "lost", "dups", "stall"),
    [
        # every seq once, 0.5 s apart inside a 0..2 s window: the longest gap is 0.5 s
        ([("good-0", s, int(s * 0.5e9), False) for s in range(1, 4)], 3, 0, 0, 0.5),
        # seq 2 missing, seq 3 twice; the attacker's frames are not the good edge's
        (
            [
                ("good-0", 1, int(0.2e9), False),
                ("good-0", 3, int(0.4e9), False),
                ("good-0", 3, int(0.6e9), True),
                ("bad-ws-0", 1, int(1.0e9), False),
            ],
            3,
            1,
            1,
            1.4,  # 0.6 s → the window's end at 2.0 s
        ),
    ],
)
def test_good_edge_at_sink_counts_loss_duplicates_and_the_longest_stall(
    tmp_path: Path,
    rows: list[tuple[str, int, int, bool]],
    published: int,
    lost: int,
    dups: int,
    stall: float,
) -> None:
    path = tmp_path / "sink.jsonl"
    _record(path, rows)
    pub = {"published": published, "undelivered": 0, "disconnects": 0}
    good = good_edge_at_sink(path, "good-", (0, int(2e9)), pub)
    assert (good.lost, good.duplicated) == (lost, dups)
    assert good.stall_s == pytest.approx(stall)


def test_good_edge_without_a_report_is_not_counted_as_lossless(tmp_path: Path) -> None:
    path = tmp_path / "sink.jsonl"
    _record(path, [("good-0", 1, 1, False)])
    good = good_edge_at_sink(path, "good-", (0, 10), {"error": "killed"})
    assert good.lost == -1 and good.published == -1


def test_the_longest_stall_is_attributed_to_its_ending_frame(tmp_path: Path) -> None:
    """The frame that ends the longest stall says where the time went: here it was captured
    on time (0.1 s after the previous), accepted 0.2 s later, processed in 0.1 s and then sat
    1.5 s before the sink got it (delivery, not the edge, not processing)."""
    s = int(1e9)
    rows = [
        FrameRecord("good-0", "a", 1, capture_ns=s // 10, ingest_ns=s // 10, processed_ns=s // 10,
                    received_ns=2 * s // 10),
        FrameRecord("good-0", "a", 2, capture_ns=2 * s // 10, ingest_ns=4 * s // 10,
                    processed_ns=5 * s // 10, received_ns=20 * s // 10),
    ]  # fmt: skip
    path = tmp_path / "sink.jsonl"
    path.write_text("".join(encode(r) for r in rows))
    good = good_edge_at_sink(path, "good-", (0, 21 * s // 10), {"published": 2})
    assert good.stall_s == pytest.approx(1.8)
    assert good.stall_end_delays_s == pytest.approx((0.2, 0.1, 1.5))
    assert good.capture_gap_s == pytest.approx(0.1)


def test_the_stall_window_ends_with_the_edges_last_frame(tmp_path: Path) -> None:
    """The good edge publishes for a fixed time; when the sink came up late its run ended
    before the attackers stopped (CI on 3b13508: 'stall 2.79 s' that was only the publisher
    being done). Its last frame's arrival ends the window, and the report says so."""
    s = int(1e9)
    rows = [
        FrameRecord("good-0", "a", n, capture_ns=n * s // 10, ingest_ns=n * s // 10,
                    processed_ns=n * s // 10, received_ns=n * s // 10 + s // 20)
        for n in range(1, 11)
    ]  # fmt: skip
    path = tmp_path / "sink.jsonl"
    path.write_text("".join(encode(r) for r in rows))
    good = good_edge_at_sink(path, "good-", (0, 3 * s), {"published": 10})
    assert good.published_until_s_before_end == pytest.approx(2.0)
    assert good.stall_s == pytest.approx(0.15)  # window start → first arrival; then 0.1 apart
