"""What the pod's ops port asks of the supervisor: the narrow view :mod:`bridge.pod.ops_http`
reads (the supervisor implements it). A port of its own so that either side can change behind
it: the ops server never touches the supervisor's tables, only these answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class WorkerOps:
    """One ingest process as the ops port sees it."""

    index: int  # its slot, 0..N-1, stable across restarts
    pid: int  # this incarnation (a restart is another pid: its counters start at 0)
    ops: str | None  # "127.0.0.1:port" of its internal ops HTTP; None until it said up
    alive: bool  # running and up (a dead or restarting slot is not scraped)


class PodView(Protocol):
    """Answered on the supervisor's loop, at once (no I/O)."""

    def workers(self) -> list[WorkerOps]:
        """Every slot of the current plan (a slot that left the plan is not listed)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """(ready, why not): the pod takes traffic (``/readyz``)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The supervisor's own ``/debug/resources`` (plan, cgroup, ownership table size)."""
        ...
