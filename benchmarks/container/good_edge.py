"""The well-behaved edge of a hostile container case, as the sink's record file saw it:
exactly-once and its longest stall while the attack ran."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.record import decode


@dataclass(slots=True)
class GoodEdge:
    """The well-behaved edge as the sink saw it (its record file) and as it reported."""

    published: int = -1
    delivered: int = 0  # distinct seqs at the sink
    duplicated: int = 0
    lost: int = -1  # published - delivered (-1: the edge gave no report)
    undelivered_at_edge: int = -1
    disconnects: int = -1
    stall_s: float = -1.0  # longest time without a good frame at the sink, sink up..attack end
    first_after_s: float = -1.0  # sink up → its first good frame
    #: Where the longest stall went, from the frame that ended it (its own timestamps, one
    #: clock: the container shares the host's): edge capture → bridge accept → processed →
    #: at the sink, and the longest gap between the edge's captures over the window (the edge
    #: itself lagging: the publisher, not the bridge). -1 when unknown.
    stall_end_delays_s: tuple[float, float, float] = (-1.0, -1.0, -1.0)
    capture_gap_s: float = -1.0
    #: The edge published its last frame this long before the window's end (its run is a
    #: fixed length, and a slow start of the sink shifts the window): the stall is measured
    #: only up to that frame's arrival, since no frame was due after it. 0 when it published
    #: to the end.
    published_until_s_before_end: float = 0.0


def good_edge_at_sink(
    record: Path, device_prefix: str, window_ns: tuple[int, int], publish: dict[str, Any]
) -> GoodEdge:
    """Exactly-once and stall figures of the devices named ``device_prefix*`` in a sink record
    file; ``window_ns`` (wall clock): sink up .. attackers stopped."""
    out = GoodEdge()
    seen: set[tuple[str, str, int]] = set()
    arrivals: list[int] = []
    stamps: dict[int, tuple[int, int, int]] = {}  # received_ns -> capture, ingest, processed
    total = 0
    if record.exists():
        with record.open() as f:
            for line in f:
                rec, _dup = decode(line)
                if not rec.device_id.startswith(device_prefix):
                    continue
                total += 1
                seen.add((rec.device_id, rec.stream_id, rec.seq))
                arrivals.append(rec.received_ns)
                stamps[rec.received_ns] = (rec.capture_ns, rec.ingest_ns, rec.processed_ns)
    out.delivered, out.duplicated = len(seen), total - len(seen)
    if "published" in publish:
        out.published = int(publish["published"])
        out.lost = out.published - out.delivered
        out.undelivered_at_edge = int(publish.get("undelivered", -1)) + int(
            publish.get("dropped_resend_overflow", 0)
        )
        out.disconnects = int(publish.get("disconnects", -1))
    start, end = window_ns
    last_capture = max((c for c, _, _ in stamps.values()), default=0)
    if 0 < last_capture < end:
        out.published_until_s_before_end = (end - last_capture) / 1e9
        last_arrival = max(t for t, (c, _, _) in stamps.items() if c == last_capture)
        end = max(start, min(end, last_arrival))
    if end > start:
        inside = sorted(t for t in arrivals if start <= t <= end)
        marks = [start, *inside, end]
        out.stall_s = max(b - a for a, b in itertools.pairwise(marks)) / 1e9
        out.first_after_s = (inside[0] - start) / 1e9 if inside else (end - start) / 1e9
        ended_by = max(itertools.pairwise(marks), key=lambda ab: ab[1] - ab[0])[1]
        if ended_by in stamps and all(stamps[ended_by]):
            capture, ingest, processed = stamps[ended_by]
            out.stall_end_delays_s = (
                (ingest - capture) / 1e9,
                (processed - ingest) / 1e9,
                (ended_by - processed) / 1e9,
            )
        captures = sorted(stamps[t][0] for t in inside if stamps[t][0])
        if len(captures) > 1:
            out.capture_gap_s = max(b - a for a, b in itertools.pairwise(captures)) / 1e9
    return out
