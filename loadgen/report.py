"""The benchmark report: JSON (validated against ``report.schema.json``), a console table with
in-place and restart side by side, and the PNG (:mod:`loadgen.plot`).

Why a schema: the JSON is what CI archives and what later runs are compared against; a schema
with a ``schema_version`` makes a silently renamed field an error instead of a wrong chart.
``simbridge-loadgen report FILE.json`` re-renders the table and the PNG from a saved report.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

SCHEMA_VERSION = "1.0"


def host_info() -> dict[str, Any]:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return {
        "cpus": cpus,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def schema() -> dict[str, Any]:
    text = resources.files("loadgen").joinpath("report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def validate(report: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` when the report does not match the schema."""
    import jsonschema  # type: ignore[import-untyped]  # no stubs installed

    jsonschema.validate(report, schema())


def load(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def write(report: dict[str, Any], out_dir: Path, stem: str) -> Path:
    """Validate, then write ``stem.json`` under ``out_dir``; return its path."""
    validate(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Console


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}{unit}" if abs(v) < 10 else f"{v:.1f}{unit}"
    return f"{v}{unit}"


ROWS: tuple[tuple[str, Any], ...] = (
    ("frames published", lambda r: r["totals"]["published"]),
    ("frames delivered", lambda r: r["totals"]["delivered"]),
    ("lost", lambda r: r["totals"]["lost"]),
    ("duplicates", lambda r: r["totals"]["duplicates"]),
    ("reorders", lambda r: r["totals"]["reorders"]),
    ("announced gap frames", lambda r: r["totals"]["gap_frames"]),
    ("max loss burst", lambda r: r["totals"]["max_loss_burst"]),
    ("disconnects (edges)", lambda r: r["totals"]["disconnects"]),
    ("frames resent (edges)", lambda r: r["totals"]["resent"]),
    ("latency p50 ms", lambda r: r["totals"]["latency_ms"]["p50"]),
    ("latency p99 ms", lambda r: r["totals"]["latency_ms"]["p99"]),
    ("latency max ms", lambda r: r["totals"]["latency_ms"]["max"]),
    ("max stall s", lambda r: r["totals"]["max_stall_s"]),
    (
        "longest request->adapted s",
        lambda r: max(
            (p["end_s"] - p["start_s"] for p in r["phases"] if p["kind"] == "resize"),
            default=None,
        ),
    ),
    ("time-to-adapt p50 ms", lambda r: r["time_to_adapt_ms"]["p50"]),
    ("time-to-adapt max ms", lambda r: r["time_to_adapt_ms"]["max"]),
    (
        "resizes adapted",
        lambda r: f"{sum(x['resolved'] for x in r['resizes'])}/{len(r['resizes'])}",
    ),
    (
        "worst resize-window p99 ms",
        lambda r: max(
            (p["latency_ms"]["p99"] or 0 for p in r["phases"] if p["kind"] == "resize"),
            default=None,
        ),
    ),
)


def comparison_table(report: dict[str, Any]) -> list[list[str]]:
    """Rows of [metric, run1, run2, ...] (header first)."""
    runs = report["runs"]
    rows = [["metric", *(f"{r['mode']} ({r['backend']})" for r in runs)]]
    for label, get in ROWS:
        cells = []
        for r in runs:
            try:
                cells.append(_fmt(get(r)))
            except (KeyError, TypeError, ValueError):
                cells.append("-")
        rows.append([label, *cells])
    return rows


def resize_rows(run: dict[str, Any]) -> list[list[str]]:
    rows = [["#", "at s", "cpu", "memory", "held s", "adapt ms", "ring budget", "workers", "note"]]
    for x in run["resizes"]:
        mem = x["memory_bytes"]
        rows.append(
            [
                str(x["index"] + 1),
                _fmt(x["at_s"]),
                _fmt(x["cpu"]),
                "-"
                if mem is None
                else f"{mem / (1 << 20):.0f}Mi" + (" (<usage)" if x["below_usage"] else ""),
                _fmt(x["hold_s"]) if x["held"] else "-",
                _fmt(x["time_to_adapt_ms"]),
                "-"
                if x["plan"].get("ring_budget_bytes") is None
                else f"{x['plan']['ring_budget_bytes'] / (1 << 20):.0f}Mi",
                _fmt(x["plan"].get("workers")),
                "; ".join(x["notes"])[:60] or ("ok" if x["resolved"] else "not adapted"),
            ]
        )
    return rows


def _plain(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_text(report: dict[str, Any]) -> str:
    """The whole console summary as plain text (also what --quiet prints at the end)."""
    sc = report["scenario"]
    out = [
        f"scenario {sc['name']}: {sc['edges']} edges ({sc['transport']}), {sc['rate_hz']:g} Hz, "
        f"{sc['duration_s']:g} s, {len(sc['resizes'])} resizes",
    ]
    for r in report["runs"]:
        out.append(f"{r['mode']}: cpu throttle {r['cpu_throttle']}; clouds: {r['clouds']}")
    out += ["", _plain(comparison_table(report))]
    for r in report["runs"]:
        out += ["", f"resizes ({r['mode']}):", _plain(resize_rows(r))]
    return "\n".join(out)


def print_report(report: dict[str, Any], file: TextIO | None = None, *, rich: bool = True) -> None:
    """A rich table on a terminal, plain text otherwise."""
    file = file or sys.stdout
    if rich and file.isatty():
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            pass
        else:
            console = Console(file=file)
            rows = comparison_table(report)
            table = Table(
                title=f"simbridge: in-place resize vs restart ({report['scenario']['name']})"
            )
            for i, h in enumerate(rows[0]):
                table.add_column(h, justify="left" if i == 0 else "right")
            for row in rows[1:]:
                table.add_row(*row)
            console.print(table)
            for r in report["runs"]:
                rr = resize_rows(r)
                t = Table(title=f"resizes: {r['mode']} (cpu throttle {r['cpu_throttle']})")
                for i, h in enumerate(rr[0]):
                    t.add_column(h, justify="left" if i in (0, 8) else "right")
                for row in rr[1:]:
                    t.add_row(*row)
                console.print(t)
            return
    print(render_text(report), file=file, flush=True)
