"""The report's PNG: delivered throughput, latency percentiles and disconnects over time, with
the resize steps marked, one column per run (in place | restart) on shared axes.

Why shared axes: the point of the picture is the difference between the columns (a flat line vs a
cliff and a resend spike); separate scales would hide it. Matplotlib's Agg backend, no display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    fig, axes = plt.subplots(
        3, len(runs), figsize=(6.5 * len(runs), 8), sharex=True, sharey="row", squeeze=False
    )
    for col, run in enumerate(runs):
        tl = run["timeline"]
        t = tl["t_s"]
        ax_thr, ax_lat, ax_dis = axes[0][col], axes[1][col], axes[2][col]
        ax_thr.plot(t, tl["delivered_per_s"], label="delivered/s", color="tab:blue")
        ax_thr.plot(t, tl["published_per_s"], label="published/s", color="tab:gray", lw=0.8)
        ax_thr.set_title(
            f"{run['mode']} ({run['backend']}): lost {run['totals']['lost']}, "
            f"disconnects {run['totals']['disconnects']}"
        )
        p50 = [float("nan") if v is None else v for v in tl["latency_p50_ms"]]
        p99 = [float("nan") if v is None else v for v in tl["latency_p99_ms"]]
        ax_lat.plot(t, p50, label="p50", color="tab:green")
        ax_lat.plot(t, p99, label="p99", color="tab:red")
        ax_lat.set_yscale("log")
        ax_dis.step(t, tl["disconnects"], where="post", color="tab:purple", label="disconnects")
        for ax in (ax_thr, ax_lat, ax_dis):
            for x in run["resizes"]:
                if x["requested_s"] is not None:
                    ax.axvline(x["requested_s"], color="orange", lw=0.8, ls="--")
            ax.grid(alpha=0.3)
        if col == 0:
            ax_thr.set_ylabel("frames/s")
            ax_lat.set_ylabel("latency ms (log)")
            ax_dis.set_ylabel("disconnects (cumulative)")
        ax_dis.set_xlabel("s since publishing started (dashed: resize steps)")
        ax_thr.legend(loc="lower left", fontsize=8)
        ax_lat.legend(loc="upper left", fontsize=8)
    sc = report["scenario"]
    fig.suptitle(
        f"simbridge {sc['name']}: {sc['edges']} edges @ {sc['rate_hz']:g} Hz, "
        f"{len(sc['resizes'])} resizes; in-place vs restart"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
