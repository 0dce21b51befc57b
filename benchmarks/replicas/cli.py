"""Bridge replicas behind HAProxy under load, scaled 3 -> 2 -> 3 and one replica SIGKILLed
(``make e2e-replicas``, issue 32).

Three ``simbridge serve`` processes push to one sink (``loadgen.sink.SinkServer``, in this
process); HAProxy (``examples/haproxy/haproxy.cfg``) hashes every device to one replica by the
SDK's ``x-simbridge-device`` header, WebSocket over HTTP/1.1 and gRPC over h2. Devices (the SDK's
``EdgeClient``, half over each transport) publish small clouds at a fixed rate throughout.

The timeline: warm up; scale in (r2 leaves HAProxy's rotation and gets SIGTERM: its devices are
drained to the others); scale out (a new replica takes slot r2 through the runtime API, then
``POST /admin/rebalance`` on r1 and r3 spreads their devices' reconnects over a few seconds, so
the ones whose key maps to r2 move there); SIGKILL
r3 (its devices reconnect elsewhere, resending what the sink had not acknowledged); a new r3;
r1 out of rotation with its connections cut, then back (its devices return to the stale
sessions it kept); stop publishing and wait until every frame is delivered.

What is measured: per device, every outage (connected -> connected again: "accepting again");
at the sink, unique frames against published ones (lost), frames received more than once (raw
resends the sink dropped), frames out of order, gaps announced; at the edges, frames resent;
after the rebalance, how many devices the new r2 holds (its ``bridge_sessions``) and when it
reached half its fair share (devices / replicas).

    python -m benchmarks.replicas.cli [--devices 24] [--rate 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.hostinfo import cpu_description
from benchmarks.replicas.haproxy import HAProxy, Unavailable
from benchmarks.replicas.ops import rebalance, sessions
from bridge.client import EdgeClient, StreamSpec
from bridge.v1 import bridge_pb2 as pb
from loadgen.launch import ChildProcess, serve_command
from loadgen.sink import SinkServer

__all__ = ["Config", "Unavailable", "run"]


@dataclass
class Config:
    devices: int = 24
    rate_hz: float = 10.0
    points: int = 100
    warm_seconds: float = 4.0
    phase_seconds: float = 6.0
    drain_timeout: float = 30.0
    serve_args: tuple[str, ...] = ()
    #: the replicas' auth_token (the rebalance route needs one; the edges send it too)
    token: str = "replicas-e2e-token"
    rebalance_spread_seconds: float = 4.0
    #: the new replica must hold half its fair share within the spread plus this
    rebalance_margin_seconds: float = 5.0


@dataclass
class Device:
    name: str
    transport: str
    edge: EdgeClient
    published: int = 0
    connected: bool = False
    lost_at: float | None = None
    outages: list[tuple[float, float]] = field(default_factory=list)  # (lost, back), monotonic


class Replica:
    def __init__(self, slot: str, child: ChildProcess) -> None:
        self.slot = slot
        self.child = child
        self.ports = {k: child.port(k) for k in ("ws", "grpc", "http")}

    @classmethod
    async def start(cls, slot: str, sink: str, extra: tuple[str, ...]) -> Replica:
        cmd = serve_command(
            "--ws-port=0", "--grpc-port=0", "--http-port=0", f"--sink-address={sink}", *extra
        )
        child = await ChildProcess.start(cmd, name=f"bridge-{slot}", env={"BRIDGE_ADAPT": "false"})
        return cls(slot, child)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, math.ceil(q * len(ranked)) - 1)]


async def _publish(device: Device, cloud: np.ndarray, period: float, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop.is_set():
        await device.edge.publish("lidar", cloud)
        device.published += 1
        next_at += period
        delay = next_at - loop.time()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        else:
            next_at = loop.time()  # behind (waited for room): no burst to catch up


async def _watch(devices: list[Device], stop: asyncio.Event, step: float = 0.01) -> None:
    """Every outage of every device, to ``step`` resolution."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        now = loop.time()
        for d in devices:
            up = d.edge.connected
            if d.connected and not up:
                d.lost_at = now
            elif up and not d.connected and d.lost_at is not None:
                d.outages.append((d.lost_at, now))
                d.lost_at = None
            d.connected = up
        await asyncio.sleep(step)


async def run(cfg: Config, workdir: Path, say: Any = print) -> dict[str, Any]:
    gaps: list[pb.Gap] = []

    def on_frame(frame: pb.ProcessedFrame) -> None:
        if frame.gap.count:
            gaps.append(frame.gap)

    loop = asyncio.get_running_loop()
    events: list[tuple[float, str]] = []

    def event(name: str) -> None:
        events.append((loop.time(), name))
        say(f"[replicas] {loop.time() - t0:6.1f} s  {name}")

    t0 = loop.time()
    replicas: dict[str, Replica] = {}
    gone: list[Replica] = []
    proxy: HAProxy | None = None
    devices: list[Device] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    sink = SinkServer(fsync=False, on_frame=on_frame)
    await sink.start()
    try:
        extra = (*cfg.serve_args, f"--auth-token={cfg.token}")
        for slot in ("r1", "r2", "r3"):
            replicas[slot] = await Replica.start(slot, sink.address, extra)
        proxy = HAProxy(workdir, [r.ports for r in replicas.values()])
        await proxy.start()
        event(f"3 replicas behind {proxy.version()}")
        cloud = np.random.default_rng(0).random((cfg.points, 3), dtype=np.float32)
        for i in range(cfg.devices):
            transport = "ws" if i % 2 == 0 else "grpc"
            url = (
                f"ws://127.0.0.1:{proxy.front['ws']}/v1/ingest"
                if transport == "ws"
                else f"grpc://127.0.0.1:{proxy.front['grpc']}"
            )
            name = f"robot-{i:02d}"
            edge = EdgeClient(
                url,
                device_id=name,
                streams=[StreamSpec("lidar")],
                connect_timeout=2.0,
                token=cfg.token,
            )
            devices.append(Device(name, transport, edge))
        await asyncio.gather(*(d.edge.start(timeout=20) for d in devices))
        tasks.append(asyncio.create_task(_watch(devices, stop)))
        for d in devices:
            tasks.append(asyncio.create_task(_publish(d, cloud, 1 / cfg.rate_hz, stop)))
        event(f"{cfg.devices} devices publishing at {cfg.rate_hz:g} Hz")
        await asyncio.sleep(cfg.warm_seconds)
        before = await proxy.servers()
        hash_share = {s: await sessions(r.ports["http"], cfg.token) for s, r in replicas.items()}

        # 3 -> 2: r2 leaves the rotation and drains.
        r2 = replicas.pop("r2")
        event("scale in: r2 to maint + SIGTERM")
        await proxy.set_state("r2", "maint")
        r2.child.signal(signal.SIGTERM)
        gone.append(r2)
        await asyncio.sleep(cfg.phase_seconds)
        r2_exit = await r2.child.wait(30)

        # 2 -> 3: a new process in slot r2.
        replicas["r2"] = await Replica.start("r2", sink.address, extra)
        await proxy.point("r2", replicas["r2"].ports)
        event("scale out: new r2 ready in HAProxy")
        spread = await _rebalance(cfg, replicas, hash_share["r2"], event)
        await asyncio.sleep(cfg.phase_seconds)
        after_scale_out = await proxy.servers()

        # SIGKILL r3, then replace it.
        r3 = replicas.pop("r3")
        event("SIGKILL r3")
        r3.child.kill()
        gone.append(r3)
        await asyncio.sleep(cfg.phase_seconds)
        replicas["r3"] = await Replica.start("r3", sink.address, extra)
        await proxy.point("r3", replicas["r3"].ports)
        event("new r3 ready in HAProxy")
        await asyncio.sleep(cfg.warm_seconds)

        # r1 leaves without stopping and comes back: its devices return to a replica that
        # still holds their detached sessions, with the other replicas' resume tokens.
        event("r1 out of rotation, its connections cut (sessions kept)")
        await proxy.set_state("r1", "maint")
        await proxy.cut("r1")
        await asyncio.sleep(cfg.phase_seconds / 2)
        event("r1 back; r2 and r3 connections cut (devices rehash)")
        await proxy.set_state("r1", "ready")
        await asyncio.sleep(0.5)  # ready takes effect before the edges reconnect
        await proxy.cut("r2")
        await proxy.cut("r3")
        await asyncio.sleep(cfg.warm_seconds)

        stop.set()
        await asyncio.gather(*tasks[1:])
        event("publishing stopped; draining")
        drained = await asyncio.gather(*(d.edge.wait_delivered(cfg.drain_timeout) for d in devices))
        event(f"drained: {sum(drained)}/{len(devices)} devices")
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
        for d in devices:
            await d.edge.close()
        rep = _report(
            cfg, devices, sink, gaps, events, t0, before, after_scale_out, r2_exit, proxy.version()
        )
        rep["rebalance"] = spread
        rep["sink_bridges"] = sink.report()["server"]["bridges"]
        return rep
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for d in devices:
            with contextlib.suppress(Exception):
                await d.edge.close()
        if proxy is not None:
            proxy.stop()
        for replica in [*replicas.values(), *gone]:
            with contextlib.suppress(Exception):
                await replica.child.stop(10)
        await sink.stop()


async def _rebalance(
    cfg: Config, replicas: dict[str, Replica], hash_share: int, event: Any
) -> dict[str, Any]:
    """Rebalance the old replicas (r1, r3) onto the new r2; follow r2's devices until it holds
    what the hash gives it (``hash_share``: the devices the slot held at the start, the same
    server name hashing the same keys) once every Drain is out, or the deadline passes."""
    loop = asyncio.get_running_loop()
    token, new = cfg.token, replicas["r2"].ports["http"]
    spread = cfg.rebalance_spread_seconds
    fair = cfg.devices / len(replicas)
    held_before = await sessions(new, token)
    event(f"rebalance r1 and r3 over {spread:g} s")
    started = loop.time()
    answers = {
        slot: await rebalance(r.ports["http"], token, spread)
        for slot, r in replicas.items()
        if slot != "r2"
    }
    deadline = started + spread + cfg.rebalance_margin_seconds
    half_at: float | None = None
    series: list[tuple[float, int]] = []
    while True:
        now = loop.time() - started
        held = await sessions(new, token)
        series.append((round(now, 2), held))
        if half_at is None and held >= fair / 2:
            half_at = round(now, 2)
        if (now >= spread and held >= hash_share) or loop.time() >= deadline:
            break
        await asyncio.sleep(0.2)
    event(f"rebalance followed: r2 holds {held} devices")
    return {
        "spread_seconds": spread,
        "deadline_seconds": spread + cfg.rebalance_margin_seconds,
        "drained": {slot: a["edges"] for slot, a in answers.items()},
        "fair_share": fair,
        "hash_share": hash_share,
        "r2_before": held_before,
        "r2_after": held,
        "half_fair_share_at_s": half_at,
        "r2_devices_over_time": series,
    }


def _report(
    cfg: Config,
    devices: list[Device],
    sink: SinkServer,
    gaps: list[pb.Gap],
    events: list[tuple[float, str]],
    t0: float,
    before: dict[str, dict[str, str]],
    after_scale_out: dict[str, dict[str, str]],
    r2_exit: int,
    haproxy_version: str,
) -> dict[str, Any]:
    per_device: list[dict[str, Any]] = []
    outages: list[float] = []
    by_event: dict[str, list[float]] = {}
    for d in devices:
        st = sink.record.streams.get((d.name, "lidar"))
        unique = st.delivered if st is not None else 0
        per_device.append(
            {
                "device": d.name,
                "transport": d.transport,
                "published": d.published,
                "delivered": unique,
                "lost": d.published - unique,
                "sink_duplicates": st.duplicates if st is not None else 0,
                "reorders": st.reorders if st is not None else 0,
                "resent": d.edge.stats.resent,
                "reconnects": d.edge.stats.reconnects,
                "outages_s": [round(b - a, 3) for a, b in d.outages],
            }
        )
        for lost, back in d.outages:
            outages.append(back - lost)
            earlier = [name for at, name in events if at <= lost]
            cause = earlier[-1] if earlier else "start"
            by_event.setdefault(cause, []).append(back - lost)
    totals = sink.record.totals()
    return {
        "cpu": cpu_description(),
        "haproxy": haproxy_version,
        "config": asdict(cfg),
        "events": [(round(t - t0, 2), name) for t, name in events],
        "published": sum(d.published for d in devices),
        "delivered_unique": sum(p["delivered"] for p in per_device),
        "lost": sum(max(0, p["lost"]) for p in per_device),
        "extra": sum(max(0, -p["lost"]) for p in per_device),
        "sink_raw_duplicates": totals.get("duplicates", 0),
        "reorders": totals.get("reorders", 0),
        "gaps_announced": len(gaps),
        "gap_frames_announced": sum(g.count for g in gaps),
        "edge_resent": sum(p["resent"] for p in per_device),
        "moved_devices": sum(1 for d in devices if d.outages),
        "outages": len(outages),
        "outage_p50_s": round(percentile(outages, 0.5), 3),
        "outage_p99_s": round(percentile(outages, 0.99), 3),
        "outage_max_s": round(max(outages, default=0.0), 3),
        "outages_by_event": {
            k: {"n": len(v), "p50_s": round(percentile(v, 0.5), 3), "max_s": round(max(v), 3)}
            for k, v in by_event.items()
        },
        "r2_sigterm_exit": r2_exit,
        "haproxy_before": before,
        "haproxy_after_scale_out": after_scale_out,
        "devices": per_device,
    }


def summary(rep: dict[str, Any]) -> str:
    lines = [
        f"replicas e2e on {rep['cpu']}, {rep['haproxy']}",
        f"  {rep['config']['devices']} devices at {rep['config']['rate_hz']:g} Hz, ws + grpc",
        f"  published {rep['published']}, delivered {rep['delivered_unique']} unique, "
        f"lost {rep['lost']}, extra {rep['extra']}, reordered {rep['reorders']}",
        f"  gaps announced {rep['gaps_announced']} ({rep['gap_frames_announced']} frames)",
        f"  raw resends: edges resent {rep['edge_resent']}, sink dropped "
        f"{rep['sink_raw_duplicates']} duplicates",
        f"  moved devices {rep['moved_devices']}, outages {rep['outages']}: "
        f"p50 {rep['outage_p50_s']} s, p99 {rep['outage_p99_s']} s, max {rep['outage_max_s']} s",
    ]
    rb = rep.get("rebalance")
    if rb:
        lines.append(
            f"  rebalance after the scale-up (spread {rb['spread_seconds']:g} s, drained "
            f"{rb['drained']}): new r2 held {rb['r2_before']} -> {rb['r2_after']} devices "
            f"(hash share {rb['hash_share']}, fair share {rb['fair_share']:g}); half the fair "
            f"share at {rb['half_fair_share_at_s']} s (bound {rb['deadline_seconds']:g} s)"
        )
    for cause, o in rep["outages_by_event"].items():
        lines.append(
            f"    after {cause!r}: {o['n']} outages, p50 {o['p50_s']} s, max {o['max_s']} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=Config.devices)
    ap.add_argument("--rate", type=float, default=Config.rate_hz)
    ap.add_argument("--phase-seconds", type=float, default=Config.phase_seconds)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = Config(devices=args.devices, rate_hz=args.rate, phase_seconds=args.phase_seconds)
    with tempfile.TemporaryDirectory(prefix="simbridge-replicas-") as tmp:
        try:
            rep = asyncio.run(run(cfg, Path(tmp), say=lambda m: print(m, file=sys.stderr)))
        except Unavailable as e:
            print(f"skipped: {e}", file=sys.stderr)
            return 0
    print(summary(rep))
    if args.json is not None:
        args.json.write_text(json.dumps(rep, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
