"""Resident memory against the memory limit, whatever the ledger says (sans-I/O: the caller
reads the resident size and the limit, and applies what this returns).

Why a second guard behind the governor: the governor bounds what is *charged*, and the plan
keeps a headroom for what nothing charges (the interpreter, transient copies while a message is
parsed, freed frames that glibc keeps in the heap until it is trimmed). Measured in the
project's container with 15 MiB frames from edges that ignore PAUSE, that slop reached 100-180
MiB while the sink drained the ring, more than the headroom, and the kernel killed the pod at
768 MiB and 1 GiB. Like Envoy's overload manager, this acts on the real figure at set points:
past the *pressure line* (the limit less a margin) admission holds back by as much as resident
memory is over the line, so nothing new is read until it falls. Forward progress (decimation,
pushes to the sink) is never held, since that is what brings resident memory back down. Free
heap is left to :class:`bridge.trimpolicy.HeapTrimPolicy` (trimming on every check below the
limit would make the kernel fault the same pages in again, see there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pressure:
    """One check's verdict: ``hold_bytes`` of admission to hold back (0: none)."""

    line_bytes: int
    hold_bytes: int


@dataclass(frozen=True, slots=True)
class PressurePolicy:
    """``margin_fraction`` of the limit (at least ``min_margin_bytes``, typically two maximum
    frames: what can arrive between two checks) is kept free below the limit."""

    margin_fraction: float = 0.10
    min_margin_bytes: int = 0

    def line(self, limit: int) -> int:
        return max(0, limit - max(int(limit * self.margin_fraction), self.min_margin_bytes))

    def check(self, resident: int, limit: int | None) -> Pressure:
        """``resident``: the process's resident bytes now; ``limit``: the memory limit the
        plan is sized for (None: unlimited, nothing to guard)."""
        if limit is None:
            return Pressure(0, 0)
        line = self.line(limit)
        return Pressure(line, max(0, resident - line))
