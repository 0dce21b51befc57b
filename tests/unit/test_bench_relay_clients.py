"""The relay benchmark's bridge edges send the SDK's bytes, and those bytes carry the frame."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.relay.clients import bridge_encoder
from bridge.client.payload import PreparedPayload, encode_frame
from bridge.v1 import bridge_pb2 as pb


@pytest.mark.parametrize("points", [1, 85, 100_000])
def test_the_bench_edge_encodes_each_frame_as_the_sdk_does(points: int) -> None:
    cloud = np.random.default_rng(points).uniform(-5, 5, (points, 3)).astype("<f4")
    encode = bridge_encoder(cloud.tobytes())
    prepared = PreparedPayload.cloud(cloud)
    for seq, now_ns in ((1, 0), (2, 1_733_000_000_123_456_789), (2**40, 5)):
        sent = encode(seq, now_ns)
        assert sent == encode_frame("cloud", seq, now_ns, prepared)
        frame = pb.EdgeMessage.FromString(sent).frame
        assert (frame.seq, frame.capture_time_ns) == (seq, now_ns)
        assert frame.point_cloud.data == cloud.tobytes()
