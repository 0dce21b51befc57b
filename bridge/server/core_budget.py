"""The core's budget role: the memory plan's budget, each stream's fair share of it, and room
made for waiting receive grants from ``drop_oldest`` streams (they chose to lose old frames
rather than stall). Driven by ``capacity.Capacity`` and admission through the ports.
"""

from __future__ import annotations

from bridge.server.core_state import CoreState
from bridge.server.ring import Policy


class BudgetRole(CoreState):
    def set_memory_budget(self, budget_bytes: int, reserve_bytes: int) -> None:
        """Follow a new memory plan: the governor's budget changes at once and the rings'
        fair shares with it (held frames drain; nothing is admitted above the new limit)."""
        self.governor.set_budget(budget_bytes, reserve_bytes)
        self._rebalance_rings()

    def reclaim_for_waiters(self) -> int:
        """Receive grants are waiting: make room for them from ``drop_oldest`` streams."""
        return self.reclaim(max(1, self.governor.waiting_bytes))

    def reclaim(self, nbytes: int) -> int:
        """Admission is waiting for ``nbytes``: evict from ``drop_oldest`` streams, fullest
        first. Returns the bytes freed."""
        freed = 0
        droppable = [s for s in self.streams.values() if s.config.policy is Policy.DROP_OLDEST]
        for stream in sorted(droppable, key=lambda s: s.ring.occupancy_bytes, reverse=True):
            if freed >= nbytes:
                break
            before = stream.ring.occupancy_bytes
            evicted = stream.ring.evict_bytes(nbytes - freed)
            if evicted:
                freed += before - stream.ring.occupancy_bytes
                self.listener.on_evicted(stream, len(evicted))
        if freed:
            self.egress.trim_removed()
        return freed

    def _rebalance_rings(self) -> None:
        per_stream = self.ring_capacity_per_stream
        for stream in self.streams.values():
            before = stream.ring.capacity_bytes
            evicted = stream.ring.resize(per_stream)
            if evicted:
                self.listener.on_evicted(stream, len(evicted))
                self.egress.trim_removed()
            if per_stream > before or evicted:
                self.listener.on_space(stream)

    @property
    def ring_capacity_per_stream(self) -> int:
        """Each stream's fair share of the admission limit; no floor."""
        return self.governor.fair_share(len(self.streams))

    @property
    def buffered_frames(self) -> int:
        return sum(len(s.ring) for s in self.streams.values())

    @property
    def buffered_bytes(self) -> int:
        return sum(s.ring.occupancy_bytes for s in self.streams.values())
