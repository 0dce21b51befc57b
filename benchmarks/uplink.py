"""A slow uplink, measured (``make bench-uplink`` = ``python -m benchmarks.uplink``, as root).

The benchmark builds its own network namespace, shapes traffic *to the bridge's ingest ports* on
that namespace's loopback with ``tbf`` (20 Mbit/s by default; an ``htb`` root with a ``u32``
filter only picks those packets, so the bridge → sink path and the acks are not limited), and
runs a bridge (``simbridge serve``, voxel 0.2 m), a sink and one edge process inside it. The edge
publishes 100k-point lidar clouds (xyz + intensity float32, 1.6 MB raw) at up to 10 Hz and
telemetry at 100 Hz. The synthetic intensity is float32 noise in [0, 1] (~3 bytes a point even
losslessly coded); rows marked "8-bit intensity" use the same scans with a sensor-like
reflectivity instead (k / 255 stored as float32, what 8-bit sensors report). A cloud is
published only while fewer than two are undelivered (a sensor that skips scans the link cannot
carry; published frames are never dropped).

Reported per scenario: telemetry latency p50 / p99 (capture on the edge → received by the sink),
clouds delivered per second, bytes per cloud on the wire, and CPU per cloud of the edge process
(encode + send) and of the bridge process (decode + decimation + everything else), over the
same window. A second table times encode and decode of each codec alone, in one process.

The namespace is deleted on every exit path (normal end, exception, SIGINT, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WS_PORT, GRPC_PORT = 18080, 19090
POINTS = 100_000


@dataclass(frozen=True)
class Scenario:
    name: str
    transport: str = "ws"
    lanes: bool = True
    codec: str = "none"
    step: float = 0.001
    attr_step: float = 0.0
    chunk_bytes: int = 0  # 0: the SDK's default
    lowat: int = -1  # -1: the SDK's default
    sysctl_lowat: int = 0  # net.ipv4.tcp_notsent_lowat in the namespace (0: the default)
    intensity: str = "random"  # "random": float32 noise in [0, 1]; "8bit": k / 255 (sensor-like)
    grpc_window: int = 0  # the bridge's grpc_window_bytes (0: its default)


SCENARIOS = [
    Scenario("ws, lanes off", lanes=False),
    Scenario("ws, lanes on"),
    Scenario("grpc, lanes off", transport="grpc", lanes=False),
    Scenario("grpc, lanes on", transport="grpc"),
    Scenario("grpc window 16 KiB, lanes on", transport="grpc", grpc_window=16 * 1024),
    Scenario("ws, lanes on, zstd", codec="zstd"),
    Scenario("ws, lanes on, quantized 1 mm", codec="quantized"),
    Scenario(
        "ws, lanes on, quantized 1 mm + intensity 1/256", codec="quantized", attr_step=1 / 256
    ),
    Scenario("ws, lanes on, quantized 1 mm, 8-bit intensity", codec="quantized", intensity="8bit"),
]
EXPLORE = [
    Scenario("x ws zstd", codec="zstd"),
    Scenario("x ws quantized 1 mm + intensity 1/256", codec="quantized", attr_step=1 / 256),
]


# -- outside: the namespace ------------------------------------------------------------------


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def shape(ns: str, rate: str) -> None:
    """Loopback up (MTU 1500); packets to the ingest ports through tbf at ``rate``, the rest
    unshaped."""
    run = ("ip", "netns", "exec", ns)
    # A real link's MTU: at loopback's 64 KiB a packet would not even fit tbf's bucket.
    _sh(*run, "ip", "link", "set", "lo", "mtu", "1500", "up")
    _sh(*run, "tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20")
    for cls in ("1:10", "1:20"):
        _sh(*run, "tc", "class", "add", "dev", "lo", "parent", "1:", "classid", cls, "htb",
            "rate", "10gbit", "quantum", "60000")  # fmt: skip
    _sh(*run, "tc", "qdisc", "add", "dev", "lo", "parent", "1:10", "handle", "10:", "tbf",
        "rate", rate, "burst", "32kbit", "latency", "50ms")  # fmt: skip
    for port in (WS_PORT, GRPC_PORT):
        _sh(*run, "tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio",
            "1", "u32", "match", "ip", "dport", str(port), "0xffff", "flowid", "1:10")  # fmt: skip


def outside(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("bench-uplink needs root (it creates a network namespace)", file=sys.stderr)
        return 2
    ns = f"sbuplink{os.getpid()}"
    inner: subprocess.Popen[str] | None = None

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        _sh("ip", "netns", "add", ns)
        shape(ns, args.rate)
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "benchmarks.uplink", "--inside"]
        cmd += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
        cmd += ["--only", args.only] if args.only else []
        # Its own process group: the bridge and edge it starts are stopped with it.
        inner = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        out, _ = inner.communicate()
        if inner.returncode != 0:
            print(out, file=sys.stderr)
            return inner.returncode
        report = json.loads(out.strip().splitlines()[-1])
        print(render(report, args.rate))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    finally:
        if inner is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(inner.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    inner.wait(5)
                except subprocess.TimeoutExpired:
                    continue
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def render(report: dict[str, Any], rate: str) -> str:
    raw = report["raw_bytes"]
    lines = [
        f"uplink {rate} (tbf), {POINTS:,}-point xyz+intensity clouds ({raw / 1e6:.2f} MB raw) "
        "at up to 10 Hz + telemetry at 100 Hz, one edge",
        "",
        f"{'scenario':<48} {'p50 ms':>7} {'p99 ms':>7} {'uplink p50':>10} {'uplink p99':>10} "
        f"{'clouds/s':>8} "
        f"{'kB/cloud':>9} {'ratio':>6} {'edge ms/cloud':>13} {'bridge ms/cloud':>15} "
        f"{'drops':>5} {'retrans':>7} {'load':>5}",
    ]
    for r in report["runs"]:
        lines.append(
            f"{r['name']:<48} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['uplink_p50_ms']:>10.1f} "
            f"{r['uplink_p99_ms']:>10.1f} {r['clouds_per_s']:>8.2f} "
            f"{r['bytes_per_cloud'] / 1e3:>9.0f} {raw / r['bytes_per_cloud']:>6.2f} "
            f"{r['edge_cpu_ms_per_cloud']:>13.1f} {r['bridge_cpu_ms_per_cloud']:>15.1f} "
            f"{r['link_drops']:>5} {r['retransmits']:>7} {r['load_avg']:>5.1f}"
        )
    lines += ["", f"{'codec alone (one process)':<48} {'kB/cloud':>9} {'ratio':>6} "
              f"{'encode ms':>10} {'decode ms':>10} {'xyz max error':>13} "
              f"{'intensity':>9}"]  # fmt: skip
    for c in report["codecs"]:
        lines.append(
            f"{c['name']:<48} {c['bytes'] / 1e3:>9.0f} {c['raw'] / c['bytes']:>6.2f} "
            f"{c['encode_ms']:>10.1f} {c['decode_ms']:>10.1f} {c['max_error']:>13.2g} "
            f"{'exact' if c['intensity_exact'] else 'lossy':>9}"
        )
    lines.append("")
    lines.append(
        "telemetry: 100 Hz, capture on the edge → received by the sink; clouds/s, telemetry and "
        "CPU over the same window; ms/cloud = process CPU in the window / clouds delivered;\n"
        "drops: packets the shaped link dropped (queue full), retrans: TCP retransmissions in the "
        "namespace, load: the host's 1-minute load average at the end of the run"
    )
    return "\n".join(lines)


# -- inside the namespace ---------------------------------------------------------------------


def _retransmits() -> int:
    """TCP segments retransmitted in this network namespace so far (``/proc/net/snmp``)."""
    lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()]
    head, values = [ln for ln in lines if ln[0] == "Tcp:"][:2]
    return int(values[head.index("RetransSegs")])


def _tbf_drops() -> int:
    """Packets the shaped link dropped so far (its queue was full)."""
    out = subprocess.run(
        ["tc", "-s", "qdisc", "show", "dev", "lo", "parent", "1:10"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    words = out.replace(",", " ").split()
    return int(words[words.index("dropped") + 1]) if "dropped" in words else 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_scenario(sc: Scenario, seconds: float, warmup: float) -> dict[str, Any]:
    from loadgen.launch import ChildProcess, serve_command
    from loadgen.sink import SinkServer

    window: list[float] = [0.0, 0.0]
    latencies: list[float] = []
    uplink: list[float] = []
    clouds = [0]

    def on_frame(f: Any) -> None:
        now = time.time_ns()
        if not window[0] <= now / 1e9 <= window[1]:
            return
        if f.stream_id == "status":
            latencies.append((now - f.capture_time_ns) / 1e6)
            uplink.append((f.ingest_time_ns - f.capture_time_ns) / 1e6)
        else:
            clouds[0] += 1

    # Per namespace: every socket in it, gRPC's included (which the SDK cannot reach).
    lowat = str(sc.sysctl_lowat or 4294967295)
    setting = f"net.ipv4.tcp_notsent_lowat={lowat}"
    await asyncio.to_thread(subprocess.run, ["sysctl", "-qw", setting], check=True)
    async with SinkServer(fsync=False, on_frame=on_frame) as sink:
        cmd = serve_command(
            "--ws-port", str(WS_PORT), "--grpc-port", str(GRPC_PORT), "--http-port", "0",
            "--sink-address", sink.address, "--voxel-size", "0.2",
            *([f"--grpc-window-bytes={sc.grpc_window}"] if sc.grpc_window else []),
        )  # fmt: skip
        bridge = await ChildProcess.start(cmd, env={"BRIDGE_ADAPT": "false"}, cwd=ROOT)
        edge = None
        try:
            edge = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.uplink", "--edge", json.dumps(asdict(sc)),
                "--seconds", str(seconds), "--warmup", str(warmup),
                cwd=ROOT, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert edge.stdout is not None
            ready = await asyncio.wait_for(edge.stdout.readline(), 60)
            if not ready.startswith(b"ready"):
                raise RuntimeError(f"edge did not start: {ready!r}")
            await asyncio.sleep(warmup)
            window[:] = [time.time(), time.time() + seconds]
            cpu0, retrans0 = _cpu_seconds(bridge.proc.pid), _retransmits()
            drops0 = await asyncio.to_thread(_tbf_drops)
            await asyncio.sleep(seconds)
            bridge_cpu = _cpu_seconds(bridge.proc.pid) - cpu0
            retransmits = _retransmits() - retrans0
            drops = await asyncio.to_thread(_tbf_drops) - drops0
            out = await asyncio.wait_for(edge.stdout.read(), 120)
            await edge.wait()
            edge_report = json.loads(out.decode().strip().splitlines()[-1])
        finally:
            if edge is not None and edge.returncode is None:
                edge.kill()
                await edge.wait()
            bridge.kill()
    latencies.sort()
    uplink.sort()
    n = max(1, clouds[0])
    return {
        **asdict(sc),
        "p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "uplink_p50_ms": statistics.median(uplink) if uplink else float("nan"),
        "uplink_p99_ms": uplink[int(0.99 * (len(uplink) - 1))] if uplink else float("nan"),
        "telemetry": len(latencies),
        "retransmits": retransmits,
        "link_drops": drops,
        "load_avg": os.getloadavg()[0],
        "clouds": clouds[0],
        "clouds_per_s": clouds[0] / seconds,
        "bytes_per_cloud": edge_report["bytes_per_cloud"],
        "edge_cpu_ms_per_cloud": 1e3 * edge_report["cpu_s"] / n,
        "bridge_cpu_ms_per_cloud": 1e3 * bridge_cpu / n,
        "edge": edge_report,
    }


def sensor_like(data: bytes) -> bytes:
    """The scan with an 8-bit reflectivity (k / 255 as float32) instead of float32 noise."""
    import numpy as np

    rec = np.frombuffer(data, "<f4").reshape(-1, 4).copy()
    rec[:, 3] = np.rint(rec[:, 3] * 255) / 255
    return rec.tobytes()


def scan_data(intensity: str, seed: int) -> Any:
    """A 100k-point scan as a ``PointCloud`` with the given kind of intensity."""
    from loadgen.clouds import lidar_xyzi

    cloud = lidar_xyzi(POINTS, seed=seed).to_proto()
    if intensity == "8bit":
        cloud.data = sensor_like(cloud.data)
    return cloud


def codec_table() -> list[dict[str, Any]]:
    """Encode and decode of each codec alone, in this process (CPU time, median of 5)."""
    import numpy as np

    from bridge.protocol import compress
    from bridge.protocol.cloud import make_layout

    rows = []
    for name, intensity, spec in [
        ("zstd (lossless)", "random", compress.CodecSpec(compress.ZSTD)),
        ("quantized 1 mm", "random", compress.CodecSpec(compress.QUANTIZED, 0.001)),
        ("quantized 1 mm + intensity 1/256", "random",
         compress.CodecSpec(compress.QUANTIZED, 0.001, 1 / 256)),
        ("zstd (lossless), 8-bit intensity", "8bit", compress.CodecSpec(compress.ZSTD)),
        ("quantized 1 mm, 8-bit intensity", "8bit",
         compress.CodecSpec(compress.QUANTIZED, 0.001)),
    ]:  # fmt: skip
        cloud = scan_data(intensity, 1)
        layout = make_layout(cloud.point_stride, [(f.name, f.offset, f.type) for f in cloud.fields])
        original = np.frombuffer(cloud.data, "<f4").reshape(-1, 4)
        enc, dec = [], []
        for _ in range(5):
            t0 = time.process_time()
            data = compress.encode(layout, cloud.data, spec)
            enc.append(time.process_time() - t0)
            pc = pb_copy(cloud)
            pc.data = data
            t0 = time.process_time()
            compress.decode_cloud(pc, spec, POINTS, 1 << 30)
            dec.append(time.process_time() - t0)
        decoded = np.frombuffer(pc.data, "<f4").reshape(-1, 4)
        rows.append(
            {
                "name": name,
                "raw": len(cloud.data),
                "bytes": len(data),
                "encode_ms": 1e3 * statistics.median(enc),
                "decode_ms": 1e3 * statistics.median(dec),
                "max_error": float(np.abs(decoded[:, :3] - original[:, :3]).max()),
                "intensity_exact": bool(np.array_equal(decoded[:, 3], original[:, 3])),
            }
        )
    return rows


def pb_copy(cloud: Any) -> Any:
    out = type(cloud)()
    out.CopyFrom(cloud)
    return out


async def inside(args: argparse.Namespace) -> None:
    runs = []
    for sc in SCENARIOS + EXPLORE:
        if (sc in EXPLORE) != args.only.startswith("x "):
            continue
        if args.only and args.only not in sc.name:
            continue
        runs.append(await run_scenario(sc, args.seconds, args.warmup))
        print(f"# {sc.name}: done", file=sys.stderr, flush=True)
    print(json.dumps({"raw_bytes": POINTS * 16, "runs": runs, "codecs": codec_table()}))


# -- the edge process -------------------------------------------------------------------------


async def edge_main(sc: Scenario, seconds: float, warmup: float) -> None:
    from bridge.client import EdgeClient, StreamSpec

    url = (
        f"ws://127.0.0.1:{WS_PORT}/v1/ingest" if sc.transport == "ws" else f"grpc://127.0.0.1:{GRPC_PORT}"
    )  # fmt: skip
    lidar = StreamSpec("lidar", codec=sc.codec, step=sc.step, attr_step=sc.attr_step)  # type: ignore[arg-type]
    streams = [lidar, StreamSpec("status", kind="telemetry")]
    scans = [scan_data(sc.intensity, s) for s in range(4)]
    client: dict[str, Any] = {} if sc.lanes else {"chunk_bytes": 0}
    if sc.lanes and sc.chunk_bytes:
        client["chunk_bytes"] = sc.chunk_bytes
    if sc.lowat >= 0:
        client["send_lowat_bytes"] = sc.lowat
    sizes: list[int] = []
    published = skipped = 0
    async with EdgeClient(url, device_id="robot", streams=streams, **client) as edge:
        print("ready", flush=True)
        start = time.monotonic()
        measure_from, end = start + warmup, start + warmup + seconds
        cpu0: float | None = None

        async def telemetry() -> None:
            i = 0
            while time.monotonic() < end:
                await edge.publish("status", {"i": float(i), "battery": 0.5})
                i += 1
                await asyncio.sleep(max(0.0, start + i * 0.01 - time.monotonic()))

        async def lidar_task() -> None:
            nonlocal published, skipped
            i = 0
            while time.monotonic() < end:
                if len(edge.core.streams["lidar"].buf) >= 2:
                    skipped += 1
                else:
                    # Encoding takes milliseconds: off the loop, or telemetry waits for it.
                    scan = scans[i % len(scans)]
                    payload = await asyncio.to_thread(edge.prepare, "lidar", scan)
                    sizes.append(payload.nbytes)
                    await edge.publish("lidar", payload)
                    published += 1
                i += 1
                await asyncio.sleep(max(0.0, start + i * 0.1 - time.monotonic()))

        async def cpu_window() -> float:
            nonlocal cpu0
            await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
            cpu0 = time.process_time()
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            return time.process_time() - cpu0

        _, _, cpu = await asyncio.gather(telemetry(), lidar_task(), cpu_window())
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "published": published,
                "skipped": skipped,
                "bytes_per_cloud": statistics.mean(sizes) if sizes else 0,
                "stats": edge.stats.as_dict(),
                "chunks": edge.lanes.chunks_sent if edge.lanes is not None else 0,
            }
        ),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="20mbit", help="tbf rate of the uplink (tc syntax)")
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    parser.add_argument("--json", default="", help="also write the report here")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--edge", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.edge:
        asyncio.run(edge_main(Scenario(**json.loads(args.edge)), args.seconds, args.warmup))
        return 0
    if args.inside:
        asyncio.run(inside(args))
        return 0
    return outside(args)


if __name__ == "__main__":
    sys.exit(main())
