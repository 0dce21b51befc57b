"""Codec decoding at the uplink (bridge.server.uplink, sans-I/O): a decode is sized and refused by
what its headers declare, never by its encoded size, and refused decode work is bounded per
connection."""

from __future__ import annotations

import pytest

from bridge.protocol import codec
from bridge.protocol.errors import CodecError, DecodeBudgetSpent
from bridge.server.governor import Component, Governor
from bridge.server.uplink import INLINE_DECODE_BYTES, Uplink
from bridge.v1 import bridge_pb2 as pb
from tests.codec_bombs import STRIDE, frame, quantized_bomb

LIMITS = codec.Limits(max_frame_bytes=16 << 20, max_points=4_000_000, max_streams_per_session=8)


def uplink(budget: int = 32 << 20) -> Uplink:
    specs = [
        pb.StreamSpec(
            stream_id="q",
            kind=pb.POINT_CLOUD,
            codec=pb.CODEC_QUANTIZED,
            codec_params=pb.CodecParams(step=0.01),
        ),
        pb.StreamSpec(stream_id="z", kind=pb.POINT_CLOUD, codec=pb.CODEC_ZSTD),
    ]
    return Uplink(pb.Hello(device_id="d", streams=specs), {"q", "z"}, LIMITS, budget)


def test_a_small_message_that_declares_a_large_cloud_is_not_decoded_inline() -> None:
    """1 KB declaring 16 MiB: the decode goes to a worker after its peak is granted; decoding
    it inline would hold the event loop for its whole inflation."""
    up = uplink()
    bomb = frame("q", 1, quantized_bomb(1 << 20, poisoned=False))
    assert len(bomb.point_cloud.data) < 4096
    governor = Governor(1 << 30)
    charge = governor.force(Component.TRANSPORT, 1024)
    ready = up.take(pb.EdgeMessage(frame=bomb), 1024, charge, now=0.0)
    assert ready.encoded and ready.errors == []
    assert ready.frame is not None and len(ready.frame.point_cloud.data) < 4096  # not inflated
    assert up.plan(bomb).peak_bytes > INLINE_DECODE_BYTES  # type: ignore[union-attr]
    charge.release()


def test_a_small_declared_decode_runs_inline_with_its_peak_charged_first() -> None:
    up = uplink()
    small = frame("q", 1, quantized_bomb(1000, poisoned=False))
    governor = Governor(1 << 30)
    charge = governor.force(Component.TRANSPORT, len(small.point_cloud.data))
    ready = up.take(pb.EdgeMessage(frame=small), charge.nbytes, charge, now=0.0)
    assert not ready.encoded and ready.frame is not None
    assert len(ready.frame.point_cloud.data) == 1000 * STRIDE
    # the peak was charged while decoding (counted as the high-water mark), then given back
    assert governor.stats.overdraft_peak_bytes == 0
    assert charge.nbytes == ready.size == 1000 * STRIDE
    charge.release()
    assert governor.live_charges == 0


def test_refused_decodes_close_the_connection_past_their_budget() -> None:
    """Each poisoned bomb costs a full inflation before its refusal; past the budget the next
    frame is refused before any work, fatally."""
    up = uplink(budget=3 * (4096 * STRIDE))
    poisoned = quantized_bomb(4096, poisoned=True)
    refused = 0
    with pytest.raises(DecodeBudgetSpent) as ended:
        for seq in range(1, 100):
            bomb = frame("q", seq, poisoned)
            plan = up.plan(bomb)
            assert plan is not None
            with pytest.raises(CodecError, match="palette index"):
                up.decode_data(bomb, plan)
            up.refusals.refused(plan.decoded_bytes)
            refused += 1
    assert refused == 4  # the budget, then one more, then no work at all
    assert ended.value.fatal and ended.value.frame is not None and ended.value.frame.seq == 5


def test_good_decodes_pay_back_refused_work() -> None:
    """An edge whose frames are sometimes corrupt (a bit flip) is never closed: each good
    frame's decoded bytes pay back what the refused ones cost."""
    up = uplink(budget=2 * (1000 * STRIDE))
    governor = Governor(1 << 30)
    good, poisoned = quantized_bomb(1000, poisoned=False), quantized_bomb(1000, poisoned=True)
    for seq in range(1, 200, 2):
        for n, data in ((seq, poisoned), (seq + 1, good)):
            charge = governor.force(Component.TRANSPORT, len(data))
            ready = up.take(pb.EdgeMessage(frame=frame("q", n, data)), len(data), charge, 0.0)
            assert not ready.encoded  # small: decoded inline
            assert (ready.frame is None) == (data is poisoned)
            if ready.charge is not None:
                ready.charge.release()
    assert up.refusals.owed_bytes <= 1000 * STRIDE
    assert governor.live_charges == 0


def test_a_declared_size_over_the_limits_is_refused_before_any_work() -> None:
    up = uplink()
    bomb = frame("q", 7, quantized_bomb(1 << 20, poisoned=False))
    small = codec.Limits(max_frame_bytes=1 << 20, max_points=4_000_000, max_streams_per_session=8)
    up.limits = small
    with pytest.raises(CodecError, match="claims") as refused:
        up.plan(bomb)
    assert refused.value.frame is not None and refused.value.frame.seq == 7
