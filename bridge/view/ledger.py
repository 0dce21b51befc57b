"""Per-stream watermarks of a sink and which frames are new (sans-I/O).

Why: the sink is the source of truth for delivery. It tells every (re)connecting bridge what it
already holds, and it must never record a frame twice: a bridge that restarted may resend what
the sink wrote just before an ack was lost. The watermark of ``(device, stream)`` is the highest
seq the sink holds; frames arrive per stream in seq order (gaps are announced), so a frame at or
below it is a duplicate.

Admission and commit are separate: a batch is admitted (duplicates filtered, also within the
batch), written durably, and only then committed. A failed write leaves the watermarks alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bridge.v1 import bridge_pb2 as pb

StreamKey = tuple[str, str]


@dataclass
class Admission:
    """The new frames of a batch, the duplicates skipped, and the watermarks after commit."""

    new: list[pb.ProcessedFrame] = field(default_factory=list)
    duplicates: int = 0
    high_bridge_seq: int = 0
    watermarks: dict[StreamKey, int] = field(default_factory=dict)


class Ledger:
    def __init__(self, watermarks: Iterable[tuple[str, str, int]] = ()) -> None:
        self._marks: dict[StreamKey, int] = {}
        for device, stream, seq in watermarks:
            self._marks[(device, stream)] = max(seq, self._marks.get((device, stream), 0))
        self.duplicates = 0

    def watermark(self, device: str, stream: str) -> int:
        return self._marks.get((device, stream), 0)

    def snapshot(self) -> list[tuple[str, str, int]]:
        return [(d, s, w) for (d, s), w in sorted(self._marks.items())]

    def admit(self, batch: Iterable[pb.ProcessedFrame]) -> Admission:
        adm = Admission()
        for frame in batch:
            adm.high_bridge_seq = max(adm.high_bridge_seq, frame.bridge_seq)
            key = (frame.device_id, frame.stream_id)
            mark = adm.watermarks.get(key, self._marks.get(key, 0))
            if frame.seq <= mark:
                adm.duplicates += 1
                continue
            adm.watermarks[key] = frame.seq
            adm.new.append(frame)
        return adm

    def commit(self, adm: Admission) -> None:
        """The admitted frames are durable: advance the watermarks."""
        for key, seq in adm.watermarks.items():
            self._marks[key] = max(seq, self._marks.get(key, 0))
        self.duplicates += adm.duplicates
