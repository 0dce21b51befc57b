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


def good_edge_at_sink(
    record: Path, device_prefix: str, window_ns: tuple[int, int], publish: dict[str, Any]
) -> GoodEdge:
    """Exactly-once and stall figures of the devices named ``device_prefix*`` in a sink record
    file; ``window_ns`` (wall clock): sink up .. attackers stopped."""
    out = GoodEdge()
    seen: set[tuple[str, str, int]] = set()
    arrivals: list[int] = []
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
    out.delivered, out.duplicated = len(seen), total - len(seen)
    if "published" in publish:
        out.published = int(publish["published"])
        out.lost = out.published - out.delivered
        out.undelivered_at_edge = int(publish.get("undelivered", -1)) + int(
            publish.get("dropped_resend_overflow", 0)
        )
        out.disconnects = int(publish.get("disconnects", -1))
    start, end = window_ns
    if end > start:
        inside = sorted(t for t in arrivals if start <= t <= end)
        marks = [start, *inside, end]
        out.stall_s = max(b - a for a, b in itertools.pairwise(marks)) / 1e9
        out.first_after_s = (inside[0] - start) / 1e9 if inside else (end - start) / 1e9
    return out
