"""Sans-I/O pieces of the hardening work: the ladder's pass bound, rate-limited logs, the
telemetry pre-scan and settings that refuse bad addresses."""

from __future__ import annotations

import logging

import pytest

from bridge.config.settings import load
from bridge.decimate.ladder import MAX_PASSES, fit_budget, rungs
from bridge.logs import RateLimitedLog
from bridge.protocol import codec
from bridge.protocol.errors import ConfigError, TelemetryTooLarge
from bridge.v1 import bridge_pb2 as pb


def surface_cloud(n_points: int, extent: float):  # type: ignore[no-untyped-def]
    """A fake decimation run: a surface of ``n_points`` spanning ``extent`` (count ~ v**-2)."""
    calls: list[float] = []

    def run(v: float) -> tuple[bytes, int]:
        calls.append(v)
        return b"", max(1, min(n_points, int((extent / v) ** 2)))

    return run, calls


def test_ladder_passes_are_bounded_for_a_tiny_voxel_and_budget() -> None:
    run, calls = surface_cloud(1_000_000, 100.0)
    _, _count, v = fit_budget(run, 1e-6, 8, lambda: 100.0)
    assert len(calls) <= MAX_PASSES
    assert v > 1e-6


def test_ladder_still_picks_the_first_rung_that_fits() -> None:
    run, _calls = surface_cloud(200_000, 50.0)
    _, count, v = fit_budget(run, 0.05, 5_000, lambda: 50.0)
    assert count <= 5_000
    ladder = list(rungs(0.05))
    previous = ladder[ladder.index(v) - 1]
    assert run(previous)[1] > 5_000  # the rung below would not have fit


def test_rate_limited_log_counts_what_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("t"), interval_seconds=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "t"):
        assert limited.log("malformed", "refused %s", "a")
        for _ in range(50):
            assert not limited.log("malformed", "refused %s", "b")
        assert limited.log("too_large", "refused %s", "c")  # another kind is not held back
        now[0] = 11.0
        assert limited.log("malformed", "refused %s", "d")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused a (malformed)",
        "refused c (too_large)",
        "refused d (malformed; 50 more since the last line)",
    ]


LIMITS = codec.Limits(
    max_frame_bytes=1 << 24,
    max_points=1000,
    max_streams_per_session=4,
    max_telemetry_bytes=1000,
    max_telemetry_entries=10,
)


def test_big_telemetry_is_refused_before_parsing_with_its_stream_and_seq() -> None:
    frame = pb.Frame(stream_id="imu", seq=7, telemetry=pb.Telemetry(blob=b"x" * 2000))
    with pytest.raises(TelemetryTooLarge) as err:
        codec.decode_edge(pb.EdgeMessage(frame=frame).SerializeToString(), LIMITS)
    assert err.value.frame is not None
    assert (err.value.frame.stream_id, err.value.frame.seq) == ("imu", 7)
    assert not err.value.fatal


def test_telemetry_entries_are_counted() -> None:
    frame = pb.Frame(stream_id="imu", seq=3)
    frame.telemetry.values.update({str(i): 1.0 for i in range(11)})
    with pytest.raises(TelemetryTooLarge, match="11 entries"):
        codec.decode_edge(pb.EdgeMessage(frame=frame).SerializeToString(), LIMITS)
    del frame.telemetry.values["0"]
    assert (
        len(
            codec.decode_edge(
                pb.EdgeMessage(frame=frame).SerializeToString(), LIMITS
            ).frame.telemetry.values
        )
        == 10
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"BRIDGE_HOST": "no such host!"}, "host:"),
        ({"BRIDGE_SINK_ADDRESS": "garbage"}, "sink_address:"),
        ({"BRIDGE_SINK_ADDRESS": "sink:99999"}, "sink_address:"),
        ({"BRIDGE_WS_PORT": "7000", "BRIDGE_GRPC_PORT": "7000"}, "grpc_port: port 7000"),
        ({"BRIDGE_METRICS_AUTH": "maybe"}, "metrics_auth:"),
    ],
)
def test_addresses_and_choices_are_checked_when_settings_load(
    env: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(env=env)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("address", ["sink:50051", "10.0.0.1:1", "[::1]:443", "a.b-c.d:8080"])
def test_good_sink_addresses_load(address: str) -> None:
    assert load(env={"BRIDGE_SINK_ADDRESS": address}).sink_address == address
