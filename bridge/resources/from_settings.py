"""The adapter's plan tunables, derived from the bridge's settings in one place.

``simbridge serve`` (through :meth:`bridge.resources.adapt.Adapter.from_settings`) and
``simbridge resources`` both call :func:`plan_settings`, so the plan the command prints is the
plan the server applies.
"""

from __future__ import annotations

from bridge.resources.plan import PlanSettings
from bridge.settings import Settings


def plan_settings(settings: Settings) -> PlanSettings:
    """With unlimited memory the ring budget is ``ring_budget_bytes``, as configured."""
    return PlanSettings(
        unlimited_memory_cap_bytes=settings.ring_budget_bytes,
        container=settings.container_name or None,
    )
