"""What the status panel shows per stream: rate, points, gaps, lag (sans-I/O; times passed in).

Lag has two readings, both from the frame's own timestamps against the view's clock when it
received the frame: ``latency`` from capture (edge clock) and ``bridge lag`` from ingest (the
bridge's clock), so a slow edge link and a backed-up bridge can be told apart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bridge.v1 import bridge_pb2 as pb

#: Rates are measured over this window (seconds).
RATE_WINDOW_S = 5.0
#: At most this many arrival times are kept per stream for the rate.
_MAX_TIMES = 4096


@dataclass
class StreamStats:
    device: str
    stream: str
    kind: str = ""
    frames: int = 0
    points_in: int = 0
    points_out: int = 0
    last_seq: int = 0
    gaps: int = 0
    gap_frames: int = 0
    duplicates: int = 0
    viewer_drops: int = 0
    latency_ms: float = 0.0
    bridge_lag_ms: float = 0.0
    backend: str = ""
    _times: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_TIMES))

    def rate(self, now_s: float) -> float:
        while self._times and now_s - self._times[0] > RATE_WINDOW_S:
            self._times.popleft()
        if not self._times:
            return 0.0
        span = max(now_s - self._times[0], 1e-3)
        return len(self._times) / max(span, min(RATE_WINDOW_S, 1.0))

    def as_dict(self, now_s: float) -> dict[str, Any]:
        return {
            "topic": f"/{self.device}/{self.stream}",
            "device": self.device,
            "stream": self.stream,
            "kind": self.kind,
            "frames": self.frames,
            "rate_hz": round(self.rate(now_s), 2),
            "points_in": self.points_in,
            "points_out": self.points_out,
            "last_seq": self.last_seq,
            "gaps": self.gaps,
            "gap_frames": self.gap_frames,
            "duplicates": self.duplicates,
            "viewer_drops": self.viewer_drops,
            "latency_ms": round(self.latency_ms, 2),
            "bridge_lag_ms": round(self.bridge_lag_ms, 2),
            "backend": self.backend,
        }


class ViewStats:
    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], StreamStats] = {}

    def _get(self, device: str, stream: str) -> StreamStats:
        st = self.streams.get((device, stream))
        if st is None:
            st = self.streams[(device, stream)] = StreamStats(device, stream)
        return st

    def frame(self, frame: pb.ProcessedFrame, received_ns: int, now_s: float) -> None:
        st = self._get(frame.device_id, frame.stream_id)
        st.frames += 1
        st.last_seq = frame.seq
        st.kind = "point_cloud" if frame.HasField("point_cloud") else "telemetry"
        st.points_in = frame.decimation.input_points
        st.points_out = frame.decimation.output_points
        st.backend = frame.decimation.backend
        if frame.gap.count or frame.gap.last_seq:
            st.gaps += 1
            st.gap_frames += frame.gap.count
        if frame.capture_time_ns:
            st.latency_ms = (received_ns - frame.capture_time_ns) / 1e6
        if frame.ingest_time_ns:
            st.bridge_lag_ms = (received_ns - frame.ingest_time_ns) / 1e6
        st._times.append(now_s)

    def duplicate(self, device: str, stream: str) -> None:
        self._get(device, stream).duplicates += 1

    def viewer_drop(self, device: str, stream: str, count: int = 1) -> None:
        self._get(device, stream).viewer_drops += count

    def snapshot(self, now_s: float) -> list[dict[str, Any]]:
        return [st.as_dict(now_s) for _, st in sorted(self.streams.items())]
