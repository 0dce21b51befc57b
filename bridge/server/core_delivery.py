"""The core's delivery role (the ``Delivery`` port, driven by the sink pusher): batches from the
egress log, what the sink acknowledged, and the watermarks that say what it already holds.

A cumulative sink ack frees ring entries and moves each stream's ``delivered_seq``; a watermark
(from the sink, or an edge's resume learnt from another replica) drops what the sink holds and
is never accepted again. The send cursor and in-flight marks live in ``egress.EgressLog``.
"""

from __future__ import annotations

from bridge.server.core_state import CoreState
from bridge.server.egress import Outgoing
from bridge.server.ring import Entry
from bridge.server.session import Stream, StreamKey


class DeliveryRole(CoreState):
    def sink_ack(self, bridge_seq: int) -> list[Entry]:
        """Cumulative ack from the sink (or auto-ack): free ring entries, advance delivered.

        Returns the entries delivered by this ack (for delivery metrics); an ack at or below
        the last one changes nothing.
        """
        if bridge_seq <= self.egress.acked_bridge_seq:
            return []
        touched: dict[StreamKey, Stream] = {}
        delivered: list[Entry] = []
        for stream, entry in self.egress.pop_acked(bridge_seq):
            if entry.removed:
                continue
            delivered.append(entry)
            stream.ring.ack(entry.seq)
            stream.delivered_seq = max(stream.delivered_seq, entry.seq)
            touched[stream.key] = stream
        for stream in touched.values():
            self._mark_dirty(stream, urgent=True)
            self.listener.on_space(stream)
        return delivered

    def sink_connected(self, marks: list[tuple[StreamKey, int]]) -> None:
        """A new sink stream announced what it holds: never resend that, replay the rest."""
        self.sink_watermarks(marks)
        self.egress.rewind()

    def next_batch(self, limit: int) -> list[Entry]:
        return self.egress.take_batch(limit)

    def mark_sent(self, entry: Entry) -> Outgoing | None:
        return self.egress.mark_sent(entry)

    def sink_failed(self) -> None:
        self.egress.clear_in_flight()

    def sink_watermarks(self, marks: list[tuple[StreamKey, int]]) -> None:
        """The sink already holds these (device, stream) seqs: never send them again."""
        for key, seq in marks:
            stream = self.streams.get(key)
            if stream is None:
                if (
                    len(self._watermarks) < self.config.max_known_watermarks
                    or key in self._watermarks
                ):
                    self._watermarks[key] = max(seq, self._watermarks.get(key, 0))
                continue
            self._delivered_elsewhere(stream, seq)
        self.egress.trim_removed()

    def _delivered_elsewhere(self, stream: Stream, seq: int) -> None:
        """The sink holds ``stream`` up to ``seq`` (its watermark, or the edge's delivered_seq
        learnt from another replica): drop what the ring holds up to it, never accept it again."""
        if seq <= stream.delivered_seq:
            return
        stream.ring.ack(seq)
        stream.delivered_seq = seq
        stream.accepted_seq = max(stream.accepted_seq, seq)
        self._mark_dirty(stream, urgent=True)
        self.listener.on_space(stream)
