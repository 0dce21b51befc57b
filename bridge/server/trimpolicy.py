"""When the bridge hands free heap pages back to the kernel (sans-I/O: the caller reads the
clock and the resident size, and calls ``malloc_trim`` when told to).

Why not simply "whenever the heap holds more than the data charged": under steady heavy load the
heap always holds some tens of MiB of frames freed a moment ago that the next frames reuse.
Trimming them once a second made the kernel fault the same pages in again: 1.2 MB gRPC relay
with 32 connections, ~50 page faults per message (the raw relay ~10) and ~8 % of the bridge's
CPU per message (``perf stat``, ``benchmarks.relay.cli``). Free pages are harmless while resident
memory stays inside what the plan gave the data budget, since the governor would let charged
frames fill them anyway; they are trimmed at once (at most once a second) when resident memory
passes baseline + budget (or the charged data, if higher), and otherwise once they have sat
unused for ``idle_seconds`` (a burst has ended: give the memory back). Past the budget this is
the old rule exactly, so the process never holds more than it did; an earlier draft let free
pages go a further ``slack_bytes`` past the budget, and a shrink to a quarter of the limit then
left RSS 16 MB above the new limit in CI.

Resident memory above the memory limit the plan is sized for (typically a decrease the node holds
while usage is above it, announced through ``memory.high`` or the Pod's spec) is trimmed on every
call for ``idle_seconds``, then at most once a second, whatever the slack: the node lowers the
limit only once usage falls under it, and frames in flight grow the heap back by some MiB within
250 ms of a trim, so one trim after the ring drained (or one a second) left RSS above it for a
whole 4 s hold in CI. Above ``memory.high`` the kernel also throttles the process by reclaim, so
the page faults this costs are the cheaper side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OVER_BUDGET = "over budget"
OVER_LIMIT = "over the memory limit"
IDLE = "idle"


@dataclass
class HeapTrimPolicy:
    """``slack_bytes``: how far resident memory may exceed baseline + charged data before the
    free heap counts; ``idle_seconds``: how long such an excess may last below the budget;
    ``min_interval_seconds``: trims never come closer together than this, except in the first
    ``idle_seconds`` above the planned memory limit (a limit RSS cannot get under, such as one
    below the libraries' resident pages, then costs one trim a second, not four)."""

    slack_bytes: int
    idle_seconds: float
    min_interval_seconds: float = 1.0
    _last_trim: float | None = field(default=None, init=False, repr=False)
    _excess_since: float | None = field(default=None, init=False, repr=False)
    _over_limit_since: float | None = field(default=None, init=False, repr=False)

    def decide(
        self,
        now: float,
        rss: int,
        baseline: int,
        charged: int,
        budget: int,
        limit: int | None = None,
    ) -> str | None:
        """The reason to trim now (``OVER_LIMIT``, ``OVER_BUDGET`` or ``IDLE``), or None.
        ``limit``: the memory limit the plan is sized for (None: unlimited)."""
        if limit is not None and rss > limit:
            if self._over_limit_since is None:
                self._over_limit_since = now
            if (
                now - self._over_limit_since >= self.idle_seconds
                and self._last_trim is not None
                and now - self._last_trim < self.min_interval_seconds
            ):
                return None
            self.trimmed(now)
            return OVER_LIMIT
        self._over_limit_since = None
        held = rss - baseline
        if held - charged <= self.slack_bytes:
            self._excess_since = None
            return None
        if self._excess_since is None:
            self._excess_since = now
        if self._last_trim is not None and now - self._last_trim < self.min_interval_seconds:
            return None
        if held > max(charged, budget):  # freed pages push the process past its data budget
            reason = OVER_BUDGET
        elif now - self._excess_since >= self.idle_seconds:
            reason = IDLE
        else:
            return None
        self.trimmed(now)
        return reason

    def trimmed(self, now: float) -> None:
        """A trim happened (this policy's or a planned shrink's): the excess is measured anew."""
        self._last_trim = now
        self._excess_since = None
