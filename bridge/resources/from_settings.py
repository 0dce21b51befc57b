"""The adapter's plan tunables, derived from the bridge's settings in one place.

``simbridge serve`` (through :meth:`bridge.resources.adapt.Adapter.from_settings`) and
``simbridge resources`` both call :func:`plan_settings`, so the plan the command prints is the
plan the server applies.
"""

from __future__ import annotations

from bridge.resources.plan import PlanSettings
from bridge.settings import Settings

RESERVE_FRACTION = 0.25  # of the data budget, kept for forward progress (see bridge/governor.py)
MiB = 1 << 20


def memory_headroom_bytes(max_frame_bytes: int) -> int:
    """What the plan keeps out of the data budget for memory no component charges: the
    interpreter's own growth, protobuf objects and transient copies while a message is parsed
    (websockets copies a payload twice while unmasking it; decoding copies it once more)."""
    return 64 * MiB + 2 * max_frame_bytes


def plan_settings(settings: Settings) -> PlanSettings:
    """With unlimited memory the data budget is ``ring_budget_bytes``, as configured; with a
    limit it is the limit minus the baseline and :func:`memory_headroom_bytes`."""
    return PlanSettings(
        unlimited_memory_cap_bytes=settings.ring_budget_bytes,
        container=settings.container_name or None,
        reserve_fraction=RESERVE_FRACTION,
        headroom_bytes=memory_headroom_bytes(settings.max_frame_bytes),
    )
