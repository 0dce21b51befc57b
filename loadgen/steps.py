"""The pieces of a run that are data, not control: the payloads the edges replay, the record of
each resize step, and the summaries computed from edges and the sink's record.

Why apart: :mod:`loadgen.runner` is the control flow (start, publish, resize, finish); what it
collects and how it is summed up is here, testable without a bridge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen import phases
from loadgen.clouds import Open3DUnavailable, load_cloud, synthetic
from loadgen.edge import EdgeClient, PreparedPayload
from loadgen.record import FrameRecord, decode
from loadgen.resize import Applied
from loadgen.scenario import ResizeStep, Scenario


def prepare_clouds(s: Scenario) -> tuple[list[PreparedPayload], str]:
    """The clouds the edges replay, and a sentence saying what they are.

    A file the scenario names that does not exist is an error (FileNotFoundError), never a quiet
    switch to synthetic clouds. Reading files needs Open3D; without it the run uses synthetic
    clouds and says so in the report (visible, not fatal)."""
    if s.clouds:
        files = s.cloud_files()
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"scenario {s.name}: no cloud file at {', '.join(map(repr, missing))} "
                f"(paths and globs are relative to the current directory, {Path.cwd()})"
            )
        try:
            loaded = [load_cloud(f) for f in files]
            pts = sum(c.num_points for c in loaded) // max(1, len(loaded))
            return [PreparedPayload.of(c.to_proto()) for c in loaded], (
                f"{len(loaded)} file(s) replayed in a loop ({pts} points on average): "
                + ", ".join(Path(f).name for f in files)
            )
        except Open3DUnavailable as exc:
            note = f"SKIPPED cloud files (Open3D unavailable: {exc}); synthetic instead: "
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"scenario {s.name}: cannot read a cloud file: {exc}") from exc
    else:
        note = ""
    payloads = [
        PreparedPayload.of(synthetic(s.points, s.seed + k, color=s.color).to_proto())
        for k in range(4)
    ]
    kind = "xyz+rgb" if s.color else "xyz+intensity"
    return payloads, note + f"synthetic lidar, {s.points} points ({kind}, seed {s.seed})"


@dataclass
class StepRecord:
    index: int
    step: ResizeStep
    applied: Applied | None = None
    planned_ns: int | None = None  # the plan first showed the new memory (else cpu) limit
    adapted_ns: int | None = None  # the plan showed all new limits (after they were written)
    plan: dict[str, Any] = field(default_factory=dict)
    restart_exit_code: int | None = None
    error: str | None = None

    def as_dict(self, t0_ns: int) -> dict[str, Any]:
        a = self.applied

        def rel(ns: int | None) -> float | None:
            return None if ns is None else round((ns - t0_ns) / 1e9, 4)

        tta = None
        if a is not None and a.written_ns is not None and self.adapted_ns is not None:
            tta = round(max(0, self.adapted_ns - a.written_ns) / 1e6, 3)
        return {
            "index": self.index,
            "at_s": self.step.at_s,
            "cpu": a.target_cpu if a else self.step.cpu,
            "memory_bytes": a.target_memory if a else self.step.memory,
            "below_usage": self.step.memory_below_usage,
            "usage_at_request_bytes": a.usage_at_request if a else None,
            "requested_s": rel(a.requested_ns if a else None),
            "written_s": rel(a.written_ns if a else None),
            "planned_s": rel(self.planned_ns),
            "adapted_s": rel(self.adapted_ns),
            "time_to_adapt_ms": tta,
            "held": bool(a and a.held),
            "hold_s": a.hold_s if a else None,
            "resolved": bool(a and a.resolved and a.written_ns and self.adapted_ns),
            "plan": {
                k: self.plan.get(k)
                for k in ("workers", "ring_budget_bytes", "cpu_limit_cores", "memory_limit_bytes")
            },
            "restart_exit_code": self.restart_exit_code,
            "notes": (a.notes if a else []) + ([self.error] if self.error else []),
        }


def edge_summary(edges: list[EdgeClient]) -> dict[str, Any]:
    keys = ("published", "sent", "resent", "acked_delivered", "disconnects", "reconnects")
    out: dict[str, Any] = {k: sum(getattr(e.stats, k) for e in edges) for k in keys}
    out["drains"] = sum(e.stats.drains for e in edges)
    out["connect_failures"] = sum(e.stats.connect_failures for e in edges)
    out["undelivered"] = sum(e.core.buffered_frames for e in edges)
    out["by_transport"] = {
        t: sum(1 for e in edges if e.transport == t) for t in sorted({e.transport for e in edges})
    }
    return out


def ttas_summary(values: list[float]) -> dict[str, Any]:
    xs = sorted(values)
    if not xs:
        return {"count": 0, "p50": None, "max": None}
    return {"count": len(xs), "p50": phases.percentile(xs, 50), "max": xs[-1]}


def read_record(path: Path) -> list[tuple[FrameRecord, bool]]:
    """The sink's JSON-lines record, in arrival order (duplicates marked)."""
    out: list[tuple[FrameRecord, bool]] = []
    if not path.exists():
        return out
    with path.open() as f:
        for line in f:
            if line.endswith("\n"):
                out.append(decode(line))
    return out
