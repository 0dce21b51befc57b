"""The adapter's plan tunables, derived from the bridge's settings in one place.

``simbridge serve`` (through :meth:`bridge.resources.adapt.Adapter.from_settings`) and
``simbridge resources`` both call :func:`plan_settings`, so the plan the command prints is the
plan the server applies.
"""

from __future__ import annotations

from bridge.config.settings import Settings
from bridge.resources.plan import PlanSettings

RESERVE_FRACTION = (
    0.25  # of the data budget, kept for forward progress (see bridge/server/governor.py)
)
MiB = 1 << 20


#: The interpreter's own growth, small protobuf objects and heap freed but not yet trimmed.
INTERPRETER_HEADROOM = 64 * MiB
#: The ops port's probe child (bridge.server.probe_child), a process of its own in the same
#: cgroup, outside the baseline the bridge measures of itself. Measured (AMD EPYC, Python 3.11):
#: VmRSS 12.7 MiB idle (PSS 7.2 MiB: its interpreter's file pages are the bridge's), 14.8 MiB
#: (PSS 9.3) with 256 connections each holding an 8 KiB head.
PROBE_CHILD_BYTES = 16 * MiB
#: Uncharged copies of one inbound message while it is received and parsed (websockets'
#: unmasked payload, then the parsed message); see docs/design.md "Where memory goes".
INBOUND_COPIES = 2
#: Heap that large messages touched and freed since the last trim (glibc keeps it resident; the
#: trim policy hands it back at most once a second past the budget, so under a flood it comes
#: back between trims). Measured in the container (issue 29, ignore-pause, 15 MiB frames, 256m
#: to 1g): resident memory 88-165 MiB above the charged bytes at its peaks, where the terms
#: above cover 96 MiB (docs/design.md, "Where memory goes").
HEAP_CHURN_FRAMES = 3
#: The way out adds nothing here: pushes (PUSH_COPIES), subscriber sends and backlog frames,
#: processed results and decimation are charged before they are allocated (same table).
OUTBOUND_COPIES = 0
#: Copies of a push alive while it is written: the joined message, and grpc's own copy of it
#: into a slice (``call.write`` holds the first until it returns). Measured (docs/design.md
#: "Where memory goes"): heap in use rose by 2 x 15 MiB over the ring's bytes per 15 MiB push.
#: The sink pusher (bridge.server.push_impl) charges this many, forced, per push in flight: what
#: forward progress charges at once, so the reserve never holds less (up to half the budget) and
#: a push never overdraws the budget. Defined here, below the server, which imports it.
PUSH_COPIES = 2


def memory_headroom_bytes(max_frame_bytes: int) -> int:
    """What the plan keeps out of the data budget for memory no component charges, term by
    term from the measured table in docs/design.md ("Where memory goes")."""
    copies = INBOUND_COPIES + HEAP_CHURN_FRAMES + OUTBOUND_COPIES
    return INTERPRETER_HEADROOM + PROBE_CHILD_BYTES + copies * max_frame_bytes


def plan_settings(settings: Settings) -> PlanSettings:
    """With unlimited memory the data budget is ``ring_budget_bytes``, as configured; with a
    limit it is the limit minus the baseline and :func:`memory_headroom_bytes`."""
    return PlanSettings(
        unlimited_memory_cap_bytes=settings.ring_budget_bytes,
        container=settings.container_name or None,
        reserve_fraction=RESERVE_FRACTION,
        headroom_bytes=memory_headroom_bytes(settings.max_frame_bytes),
        # One push in flight: a frame, or a batch of up to sink_batch_bytes (which may be the
        # larger; tests/unit/test_plan_reserve.py forces it against a full ring).
        min_reserve_bytes=PUSH_COPIES * max(settings.max_frame_bytes, settings.sink_batch_bytes),
    )
