"""The adapter's plan tunables, derived from the bridge's settings in one place.

``simbridge serve`` (through :class:`bridge.app.BridgeService`) and ``simbridge resources`` both
call :func:`plan_settings`, so the plan the command prints is the plan the server applies.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.resources.adapt import ENV_CONTAINER
from bridge.resources.plan import PlanSettings
from bridge.settings import Settings


def plan_settings(settings: Settings, env: Mapping[str, str] | None = None) -> PlanSettings:
    """With unlimited memory the ring budget is ``ring_budget_bytes``, as configured."""
    container = (env or {}).get(ENV_CONTAINER) or None
    return PlanSettings(unlimited_memory_cap_bytes=settings.ring_budget_bytes, container=container)
