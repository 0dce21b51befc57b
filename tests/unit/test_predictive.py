"""Predictive xyz coding (bridge.protocol.predictive): the decoder rebuilds exactly the quantized
values, for any content, order, size and depth, extremes included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bridge.protocol import predictive

LIMIT = predictive.MAX_QUANTUM - 1
values = st.one_of(
    st.integers(-LIMIT, LIMIT),
    st.sampled_from([-LIMIT, LIMIT, 0, 1, -1]),  # the corners where products and sums peak
)


@settings(max_examples=300, deadline=None)
@given(
    axes=st.integers(0, 200).flatmap(lambda n: hnp.arrays(np.int64, (3, n), elements=values)),
    levels=st.integers(0, 7),
)
def test_any_points_round_trip_exactly(axes: np.ndarray, levels: int) -> None:
    block = predictive.encode(axes, levels)
    assert len(block) == predictive.block_bytes(axes.shape[1], levels)
    out = predictive.decode(np.frombuffer(block, np.uint8), axes.shape[1], levels)
    assert np.array_equal(out, axes)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), levels=st.integers(0, 6))
def test_scan_like_rays_round_trip_exactly(seed: int, levels: int) -> None:
    """Points along rays with range noise, where the along-ray prediction does its work."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    az = np.linspace(0, 2 * np.pi, n) + rng.normal(0, 1e-4, n)
    r = 20_000 + rng.normal(0, 20, n) * rng.choice([1, 1000], n)
    axes = np.rint(np.stack([r * np.cos(az), r * np.sin(az), 0.1 * r])).astype(np.int64)
    out = predictive.decode(np.frombuffer(predictive.encode(axes, levels), np.uint8), n, levels)
    assert np.array_equal(out, axes)
