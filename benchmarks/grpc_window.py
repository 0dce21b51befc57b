"""The gRPC receive window, measured both ways in one run (``make bench-grpc-window``).

``grpc_window_bytes`` is one value for the whole server, and it pulls two ways: on loopback a
larger window saves the bridge CPU per message (fewer WINDOW_UPDATE round trips per message);
on a slow uplink everything inside the window is ahead of a gRPC edge's next telemetry frame.
This runs, for each window, the relay cells (one busy connection, bridge CPU per message) and,
as root, the shaped-uplink scenario "grpc, lanes on" (telemetry latency behind 10 Hz clouds),
windows interleaved round by round so that load drifts hit every window alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WINDOWS = (16 * 1024, 32 * 1024, 64 * 1024, 256 * 1024, 1024 * 1024)


def relay_cells(window: int, sizes: str, seconds: float) -> dict[str, dict[str, float]]:
    """Bridge-grpc cells at one window: size -> us/msg, msgs/s, other CPU %."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "relay.json"
        cmd = [sys.executable, "-m", "benchmarks.relay.cli", "--targets", "bridge-grpc"]
        cmd += ["--sizes", sizes, "--conns", "1", "--seconds", str(seconds)]
        cmd += [f"--bridge-arg=--grpc-window-bytes={window}", "--json", str(out)]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        cells = json.loads(out.read_text())["cells"]
    return {
        c["size"]: {
            "us": c["relay_us_per_msg"],
            "msgs": c["msgs_per_s"],
            "other": c["other_cpu_pct"],
        }
        for c in cells
    }


def uplink_row(window: int, seconds: float) -> dict[str, float]:
    """The shaped-link gRPC lanes scenario with the bridge on this window."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "uplink.json"
        cmd = [sys.executable, "-m", "benchmarks.uplink", "--only", "grpc, lanes on"]
        cmd += ["--seconds", str(seconds), "--json", str(out)]
        env = {**os.environ, "BRIDGE_GRPC_WINDOW_BYTES": str(window)}
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
        run = json.loads(out.read_text())["runs"][0]
    return {k: run[k] for k in ("p50_ms", "p99_ms", "clouds_per_s", "load_avg")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="windows interleaved this often")
    parser.add_argument("--sizes", default="1KB,100KB,1.2MB", help="relay message sizes")
    parser.add_argument("--seconds", type=float, default=3.0, help="relay seconds per cell")
    parser.add_argument("--uplink-seconds", type=float, default=10.0)
    parser.add_argument("--no-uplink", action="store_true", help="skip the shaped link")
    args = parser.parse_args()
    shaped = not args.no_uplink and os.geteuid() == 0
    relay: dict[int, list[dict[str, dict[str, float]]]] = {w: [] for w in WINDOWS}
    uplink: dict[int, list[dict[str, float]]] = {w: [] for w in WINDOWS}
    for round_no in range(args.rounds):
        for window in WINDOWS:
            print(f"# round {round_no + 1}, window {window}", file=sys.stderr, flush=True)
            relay[window].append(relay_cells(window, args.sizes, args.seconds))
            if shaped:
                uplink[window].append(uplink_row(window, args.uplink_seconds))
    sizes = args.sizes.split(",")
    print("gRPC receive window (grpc_window_bytes): one busy gRPC edge on loopback, and on a")
    print("20 Mbit/s shaped uplink (telemetry behind 10 Hz 1.6 MB clouds, lanes on);")
    print(f"medians over {args.rounds} interleaved rounds; other = max CPU % of everything else")
    head = "window     " + "".join(f"{s + ' us/msg':>15}" for s in sizes)
    if shaped:
        head += f"{'tele p50 ms':>13}{'tele p99 ms':>13}{'clouds/s':>10}"
    print(head + f"{'other %':>9}")
    for window in WINDOWS:
        row = f"{window // 1024:>5} KiB  "
        for size in sizes:
            row += f"{statistics.median(r[size]['us'] for r in relay[window]):>15.0f}"
        if shaped:
            for key, fmt in (
                ("p50_ms", ">13.1f"),
                ("p99_ms", ">13.1f"),
                ("clouds_per_s", ">10.2f"),
            ):
                row += format(statistics.median(u[key] for u in uplink[window]), fmt)
        other = max(r[s]["other"] for r in relay[window] for s in sizes)
        print(row + f"{other:>9.0f}")
    if not shaped:
        print("(shaped uplink skipped: it needs root and a network namespace)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
