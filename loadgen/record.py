"""What the reference sink received: per-stream delivery accounting and its durable log.

Why a separate, pure accounting class: the sink is the source of truth for delivery, so its
verdicts (in order, duplicate, lost, announced gap, late arrival) decide whether a test passes.
:class:`SinkRecord` does no I/O and knows nothing about gRPC; it is fed :class:`FrameRecord`s in
arrival order and can be unit-tested exhaustively. :class:`RecordFile` is the thin durable log:
one JSON object per line, in arrival order, replayed through a fresh :class:`SinkRecord` on
restart so watermarks and every counter survive.

Per ``(device_id, stream_id)``, with ``highest`` the largest seq seen so far:

- ``seq == highest + 1``: in order.
- ``seq > highest + 1``: the seqs in between are *announced gap* frames where the frame's
  ``gap`` marker covers them and *lost* otherwise (until they arrive late).
- ``seq <= highest``: a *late* arrival (a reorder) if that seq was lost so far, a
  *gap contradiction* if the bridge had announced it dropped, else a *duplicate*.

Duplicates are counted but not recorded as frames: their log line is marked ``"dup": 1`` and
carries only identifiers, so a reader that skips those lines sees every frame exactly once.
The watermark of a stream is the highest seq below which nothing is missing (announced gaps
count as settled: the bridge will never send those frames).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

#: Latency samples kept for percentiles; beyond it a uniform reservoir sample is kept.
LATENCY_RESERVOIR = 200_000


@dataclass(frozen=True, slots=True)
class FrameRecord:
    """The metadata of one received ProcessedFrame (never the payload)."""

    device_id: str
    stream_id: str
    seq: int
    bridge_seq: int = 0
    capture_ns: int = 0
    ingest_ns: int = 0
    processed_ns: int = 0
    received_ns: int = 0
    input_points: int = 0
    output_points: int = 0
    #: points actually present in the payload; -1 when the payload is not a point cloud
    payload_points: int = -1
    voxel_size: float = 0.0
    backend: str = ""
    gap_first: int = 0
    gap_last: int = 0
    gap_count: int = 0
    gap_reason: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.device_id, self.stream_id)

    @property
    def has_gap(self) -> bool:
        return self.gap_count > 0 or self.gap_last > 0


_FIELD_NAMES = frozenset(f.name for f in fields(FrameRecord))
_DUP_KEYS = ("device_id", "stream_id", "seq", "bridge_seq", "received_ns")


def encode(rec: FrameRecord, *, duplicate: bool = False) -> str:
    """One log line (with the newline). Duplicates keep only their identifiers."""
    if duplicate:
        d: dict[str, Any] = {"dup": 1, **{k: getattr(rec, k) for k in _DUP_KEYS}}
    else:
        d = asdict(rec)
    return json.dumps(d, separators=(",", ":")) + "\n"


def decode(line: str) -> tuple[FrameRecord, bool]:
    """Parse one log line into ``(record, was_duplicate)``; unknown keys are ignored."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise ValueError("record line is not a JSON object")
    dup = bool(d.pop("dup", 0))
    return FrameRecord(**{k: v for k, v in d.items() if k in _FIELD_NAMES}), dup


# ---------------------------------------------------------------------------------------------
# Accounting


def latency_summary(samples_ns: Iterable[int]) -> dict[str, float]:
    """count, mean, p50, p90, p99, max in milliseconds (nearest-rank percentiles)."""
    xs = sorted(samples_ns)
    if not xs:
        return {"count": 0}

    def pct(p: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(p / 100.0 * len(xs)) - 1))] / 1e6

    return {
        "count": len(xs),
        "mean_ms": sum(xs) / len(xs) / 1e6,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": xs[-1] / 1e6,
    }


def _runs(sorted_seqs: list[int]) -> Iterator[tuple[int, int]]:
    """Maximal runs of consecutive integers as (first, last)."""
    if not sorted_seqs:
        return
    first = last = sorted_seqs[0]
    for s in sorted_seqs[1:]:
        if s != last + 1:
            yield first, last
            first = s
        last = s
    yield first, last


class _Ranges:
    """A set of seqs kept as sorted disjoint inclusive ranges (announced gaps can be long)."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def add(self, first: int, last: int) -> None:
        """Add [first, last]; callers only add seqs not yet present."""
        i = bisect.bisect_left(self._firsts, first)
        self._firsts.insert(i, first)
        self._lasts.insert(i, last)
        # merge with neighbours that touch
        if i + 1 < len(self._firsts) and self._firsts[i + 1] == self._lasts[i] + 1:
            self._lasts[i] = self._lasts.pop(i + 1)
            self._firsts.pop(i + 1)
        if i > 0 and self._lasts[i - 1] + 1 == self._firsts[i]:
            self._lasts[i - 1] = self._lasts.pop(i)
            self._firsts.pop(i)

    def discard(self, seq: int) -> bool:
        """Remove ``seq``; True if it was present."""
        i = bisect.bisect_right(self._firsts, seq) - 1
        if i < 0 or seq > self._lasts[i]:
            return False
        first, last = self._firsts[i], self._lasts[i]
        del self._firsts[i], self._lasts[i]
        if seq + 1 <= last:
            self._firsts.insert(i, seq + 1)
            self._lasts.insert(i, last)
        if first <= seq - 1:
            self._firsts.insert(i, first)
            self._lasts.insert(i, seq - 1)
        return True


@dataclass(slots=True)
class StreamStats:
    """Counters of one (device, stream); ``lost`` and ``max_loss_burst`` are derived on report."""

    received: int = 0
    delivered: int = 0
    duplicates: int = 0
    reorders: int = 0
    gap_frames: int = 0
    gap_markers: int = 0
    gap_contradictions: int = 0
    decimation_mismatches: int = 0
    input_points: int = 0
    output_points: int = 0
    highest: int = 0
    latency_sum_ns: int = 0
    latency_max_ns: int = 0
    holes: set[int] = field(default_factory=set)
    gapped: _Ranges = field(default_factory=_Ranges)

    @property
    def lost(self) -> int:
        return len(self.holes)

    @property
    def watermark(self) -> int:
        return min(self.holes) - 1 if self.holes else self.highest

    @property
    def max_loss_burst(self) -> int:
        return max((b - a + 1 for a, b in _runs(sorted(self.holes))), default=0)

    def report(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "delivered": self.delivered,
            "duplicates": self.duplicates,
            "lost": self.lost,
            "gap_frames": self.gap_frames,
            "gap_markers": self.gap_markers,
            "gap_contradictions": self.gap_contradictions,
            "reorders": self.reorders,
            "max_loss_burst": self.max_loss_burst,
            "highest_seq": self.highest,
            "watermark": self.watermark,
            "input_points": self.input_points,
            "output_points": self.output_points,
            "decimation_mismatches": self.decimation_mismatches,
            "latency_mean_ms": (self.latency_sum_ns / self.delivered / 1e6)
            if self.delivered
            else 0,
            "latency_max_ms": self.latency_max_ns / 1e6,
        }


_TOTALS = (
    "received",
    "delivered",
    "duplicates",
    "lost",
    "gap_frames",
    "gap_markers",
    "gap_contradictions",
    "reorders",
    "decimation_mismatches",
    "input_points",
    "output_points",
)


class SinkRecord:
    """Delivery accounting over all (device, stream) pairs; feed records in arrival order."""

    def __init__(self, *, latency_reservoir: int = LATENCY_RESERVOIR, seed: int = 0) -> None:
        self.streams: dict[tuple[str, str], StreamStats] = {}
        self._latency: list[int] = []
        self._latency_seen = 0
        self._reservoir = latency_reservoir
        self._rng = random.Random(seed)

    def stats(self, device_id: str, stream_id: str) -> StreamStats:
        return self.streams.setdefault((device_id, stream_id), StreamStats())

    def feed(self, rec: FrameRecord) -> bool:
        """Account one received frame. True if it is new (to be recorded), False if a duplicate."""
        st = self.stats(rec.device_id, rec.stream_id)
        st.received += 1
        seq = rec.seq
        if rec.has_gap:  # idempotent: a resent frame re-announces nothing new
            self._announce(st, rec.gap_first, rec.gap_last, below=seq)
        if seq > st.highest:
            if seq > st.highest + 1:
                st.holes.update(range(st.highest + 1, seq))  # gap-covered ones were removed above
            st.highest = seq
        elif seq in st.holes:
            st.holes.discard(seq)
            st.reorders += 1
        elif st.gapped.discard(seq):
            st.gap_contradictions += 1
            st.gap_frames -= 1
        else:
            st.duplicates += 1
            return False
        st.delivered += 1
        st.gap_markers += rec.has_gap
        st.input_points += rec.input_points
        st.output_points += rec.output_points
        if (
            rec.payload_points >= 0
            and rec.output_points
            and rec.payload_points != rec.output_points
        ):
            st.decimation_mismatches += 1
        if rec.received_ns and rec.capture_ns:
            lat = max(0, rec.received_ns - rec.capture_ns)
            st.latency_sum_ns += lat
            st.latency_max_ns = max(st.latency_max_ns, lat)
            self._sample(lat)
        return True

    def _announce(self, st: StreamStats, first: int, last: int, *, below: int) -> None:
        """Mark seqs ``first..last`` (only those < ``below``) as dropped by the bridge's policy."""
        last = min(last, below - 1)
        if first < 1 or last < first:
            return
        # Seqs already known missing become announced; seqs above `highest` are pre-announced
        # so the hole that the carrying frame opens does not count them as lost.
        newly: list[int] = [s for s in st.holes if first <= s <= last]
        st.holes.difference_update(newly)
        for a, b in _runs(sorted(newly)):
            st.gapped.add(a, b)
        count = len(newly)
        if first > st.highest + 1:  # frames between the last seen and the gap are lost
            st.holes.update(range(st.highest + 1, first))
        ahead_first = max(first, st.highest + 1)
        if ahead_first <= last:
            st.gapped.add(ahead_first, last)
            count += last - ahead_first + 1
            # raise `highest` so feed() opens no hole for them
            st.highest = last
        st.gap_frames += count

    def _sample(self, lat: int) -> None:
        self._latency_seen += 1
        if len(self._latency) < self._reservoir:
            self._latency.append(lat)
        else:
            j = self._rng.randrange(self._latency_seen)
            if j < self._reservoir:
                self._latency[j] = lat

    def watermarks(self) -> list[tuple[str, str, int]]:
        """Sorted (device_id, stream_id, highest contiguous seq held) for the SinkAck handshake."""
        return sorted((d, s, st.watermark) for (d, s), st in self.streams.items())

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(_TOTALS, 0)
        for st in self.streams.values():
            for k in _TOTALS:
                out[k] += getattr(st, k)
        out["streams"] = len(self.streams)
        out["max_loss_burst"] = max((st.max_loss_burst for st in self.streams.values()), default=0)
        return out

    def report(self) -> dict[str, Any]:
        return {
            "totals": self.totals(),
            "latency": latency_summary(self._latency),
            "streams": {f"{d}/{s}": st.report() for (d, s), st in sorted(self.streams.items())},
        }


# ---------------------------------------------------------------------------------------------
# Durable log


class RecordFile:
    """Append-only JSON-lines log of received frames (blocking I/O: call from a worker thread).

    ``load`` replays an existing file into a :class:`SinkRecord` and cuts off a torn last line
    (a crash mid-write), so appending afterwards never glues two records together.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fh: BinaryIO | None = None
        self.torn_bytes = 0

    def load(self, record: SinkRecord) -> int:
        """Replay the file (if any) into ``record``; return the number of lines replayed."""
        n = 0
        if self.path.exists():
            good = 0
            with self.path.open("rb") as fh:
                for raw in fh:
                    if not raw.endswith(b"\n"):
                        break
                    try:
                        rec, _dup = decode(raw.decode())
                    except (ValueError, TypeError):
                        break
                    record.feed(rec)
                    good += len(raw)
                    n += 1
            size = self.path.stat().st_size
            if good < size:
                self.torn_bytes = size - good
                with self.path.open("r+b") as fh:
                    fh.truncate(good)
        self._fh = self.path.open("ab")
        return n

    def append(self, lines: list[str]) -> None:
        """Write the lines, flush and (by default) fsync: durable before the sink acks."""
        if self._fh is None:
            self._fh = self.path.open("ab")
        self._fh.write("".join(lines).encode())
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
