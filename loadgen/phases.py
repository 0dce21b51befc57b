"""Per-phase delivery accounting from the sink's record: the numbers the benchmark compares.

Why its own pure module: the verdict "in place lost nothing, the restart stalled for 1.3 s" must
come from what the *sink* received, never from the bridge's own metrics, and it must be exact.
:func:`account` takes three plain inputs and does no I/O, so a unit test can plant a record and
check every count by hand:

- ``published``: every frame the edges published, ``(device, stream, seq, scheduled_ns)``;
  the scheduled send time is when the frame *should* have left (open loop), so a stalled bridge
  shows up as latency, and it decides which phase a frame belongs to;
- ``records``: the sink's record lines in arrival order, ``(FrameRecord, was_duplicate)``;
- ``windows``: the phases, half-open ``[start_ns, end_ns)`` on the same wall clock.

Definitions (per window, over the frames scheduled in it):
``delivered`` distinct frames the sink recorded; ``lost`` published, never delivered and not
announced as dropped; ``gap_frames`` announced by the bridge (``gap`` marker) and never delivered;
``duplicates`` extra copies; ``reorders`` frames that arrived after a higher seq of their stream;
``max_loss_burst`` the longest run of consecutive lost seqs of one stream; latency is
``received - scheduled``; ``max_stall_s`` the longest interval without any delivery, while edges
were publishing, inside the window (clipped to it; the overall window sees each stall whole).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.record import FrameRecord

Key = tuple[str, str, int]  # device, stream, seq


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    kind: str  # warmup | steady | resize | overall
    start_ns: int
    end_ns: int

    def __contains__(self, t_ns: object) -> bool:
        return isinstance(t_ns, int) and self.start_ns <= t_ns < self.end_ns


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (the sink's convention)."""
    if not sorted_xs:
        return math.nan
    rank = min(len(sorted_xs) - 1, max(0, math.ceil(p / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[rank]


def latency_ms(samples_ns: Iterable[int]) -> dict[str, Any]:
    xs = sorted(samples_ns)
    if not xs:
        return {"count": 0, "p50": None, "p99": None, "max": None}
    return {
        "count": len(xs),
        "p50": round(percentile(xs, 50) / 1e6, 3),
        "p99": round(percentile(xs, 99) / 1e6, 3),
        "max": round(xs[-1] / 1e6, 3),
    }


def _max_run(seqs: list[int]) -> int:
    best = run = 0
    prev = None
    for s in sorted(seqs):
        run = run + 1 if prev is not None and s == prev + 1 else 1
        best = max(best, run)
        prev = s
    return best


def stall_intervals(
    delivery_ns: Sequence[int], start_ns: int, end_ns: int
) -> list[tuple[int, int]]:
    """The intervals without a delivery inside ``[start_ns, end_ns]`` (publishing time)."""
    inside = [t for t in sorted(delivery_ns) if start_ns <= t <= end_ns]
    points = [start_ns, *inside, end_ns]
    return [(a, b) for a, b in itertools.pairwise(points) if b > a]


def max_stall_s(intervals: Sequence[tuple[int, int]], window: Window) -> float:
    """Longest interval without delivery inside ``window`` (clipped to it). Clipped, because a
    stall that began 10 ms before a restart must not be charged in full to the steady phase
    before it; the overall window sees every stall whole."""
    best = 0
    for a, b in intervals:
        best = max(best, min(b, window.end_ns) - max(a, window.start_ns))
    return round(best / 1e9, 4)


def account(
    published: Iterable[tuple[str, str, int, int]],
    records: Iterable[tuple[FrameRecord, bool]],
    windows: Sequence[Window],
    *,
    publishing: tuple[int, int],
    disconnects_ns: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """One dict per window (same order); see the module docstring for the definitions."""
    scheduled: dict[Key, int] = {}
    for dev, stream, seq, t in published:
        scheduled[(dev, stream, seq)] = t
    delivered: dict[Key, int] = {}  # key -> received_ns (first copy)
    dups: list[Key] = []
    reordered: set[Key] = set()
    highest: dict[tuple[str, str], int] = defaultdict(int)
    announced: set[Key] = set()
    for rec, was_dup in records:
        key = (rec.device_id, rec.stream_id, rec.seq)
        if rec.has_gap and rec.gap_last >= rec.gap_first >= 1:
            for gap_seq in range(rec.gap_first, min(rec.gap_last, rec.seq - 1) + 1):
                announced.add((rec.device_id, rec.stream_id, gap_seq))
        if was_dup or key in delivered:
            dups.append(key)
            continue
        delivered[key] = rec.received_ns
        scheduled.setdefault(key, rec.capture_ns)  # a frame we did not log: trust its capture
        sk = (rec.device_id, rec.stream_id)
        if rec.seq < highest[sk]:
            reordered.add(key)
        highest[sk] = max(highest[sk], rec.seq)
    delivery_times = sorted(delivered.values())
    stalls = stall_intervals(delivery_times, *publishing)
    dis = sorted(disconnects_ns)

    out = []
    for w in windows:
        in_w = [k for k, t in scheduled.items() if w.start_ns <= t < w.end_ns]
        got = [k for k in in_w if k in delivered]
        missing = [k for k in in_w if k not in delivered]
        lost = [k for k in missing if k not in announced]
        per_stream: dict[tuple[str, str], list[int]] = defaultdict(list)
        for dev, stream, seq in lost:
            per_stream[(dev, stream)].append(seq)
        in_set = set(in_w)
        out.append(
            {
                "name": w.name,
                "kind": w.kind,
                "start_ns": w.start_ns,
                "end_ns": w.end_ns,
                "published": len(in_w),
                "delivered": len(got),
                "lost": len(lost),
                "gap_frames": len(missing) - len(lost),
                "duplicates": sum(1 for k in dups if k in in_set),
                "reorders": sum(1 for k in got if k in reordered),
                "max_loss_burst": max((_max_run(v) for v in per_stream.values()), default=0),
                "latency_ms": latency_ms(delivered[k] - scheduled[k] for k in got),
                "max_stall_s": max_stall_s(stalls, w),
                "disconnects": bisect.bisect_left(dis, w.end_ns)
                - bisect.bisect_left(dis, w.start_ns),
            }
        )
    return out


def timeline(
    published: Iterable[tuple[str, str, int, int]],
    records: Iterable[tuple[FrameRecord, bool]],
    *,
    start_ns: int,
    end_ns: int,
    bucket_s: float = 0.5,
    disconnects_ns: Sequence[int] = (),
) -> dict[str, list[Any]]:
    """Series for the plot: per bucket (by *received* time) delivered/s and latency p50/p99,
    published/s (by scheduled time) and the cumulative disconnects."""
    step = int(bucket_s * 1e9)
    n = max(1, math.ceil((end_ns - start_ns) / step))
    pub = [0] * n
    sched: dict[Key, int] = {}
    for dev, stream, seq, t in published:
        sched[(dev, stream, seq)] = t
        i = (t - start_ns) // step
        if 0 <= i < n:
            pub[i] += 1
    lat: list[list[int]] = [[] for _ in range(n)]
    seen: set[Key] = set()
    for rec, was_dup in records:
        key = (rec.device_id, rec.stream_id, rec.seq)
        if was_dup or key in seen:
            continue
        seen.add(key)
        i = (rec.received_ns - start_ns) // step
        if 0 <= i < n:
            lat[i].append(rec.received_ns - sched.get(key, rec.capture_ns))
    dis = sorted(disconnects_ns)
    series: dict[str, list[Any]] = {
        "t_s": [],
        "published_per_s": [],
        "delivered_per_s": [],
        "latency_p50_ms": [],
        "latency_p99_ms": [],
        "disconnects": [],
    }
    for i in range(n):
        xs = sorted(lat[i])
        series["t_s"].append(round(i * bucket_s, 3))
        series["published_per_s"].append(round(pub[i] / bucket_s, 2))
        series["delivered_per_s"].append(round(len(xs) / bucket_s, 2))
        series["latency_p50_ms"].append(round(percentile(xs, 50) / 1e6, 3) if xs else None)
        series["latency_p99_ms"].append(round(percentile(xs, 99) / 1e6, 3) if xs else None)
        series["disconnects"].append(bisect.bisect_right(dis, start_ns + (i + 1) * step))
    return series
