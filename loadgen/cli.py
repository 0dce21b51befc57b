"""``simbridge-loadgen``: the reference sink and the open-loop publisher from the command line.

Subcommands live in a registry (name → parser setup + handler) so later ones (``demo``, ``run``,
resize drivers) plug in without touching the dispatcher. Only :func:`main` returns an exit code;
handlers never call ``sys.exit``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from loadgen.aio import run_async
from loadgen.edge import DEFAULT_MAX_MESSAGE_BYTES, Publisher, Transport
from loadgen.procs import publish_procs
from loadgen.sink import SinkServer


@dataclass(frozen=True)
class Command:
    name: str
    help: str  # one line, shown in the command list
    description: str  # shown by `simbridge-loadgen NAME --help`
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def register(cmd: Command) -> Command:
    COMMANDS[cmd.name] = cmd
    return cmd


def _print(text: str, out: TextIO | None = None) -> None:
    print(text, file=out or sys.stdout, flush=True)


# ---------------------------------------------------------------------------------------------
# sink


def _configure_sink(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="address to serve VisualizationSink on; port 0 picks a free one (default %(default)s)",
    )
    p.add_argument(
        "--record",
        metavar="FILE",
        help="JSON-lines record file: replayed at start (watermarks and counts survive a "
        "restart), appended and fsynced before every ack. Without it, state is in memory only.",
    )
    p.add_argument(
        "--report-every",
        type=float,
        default=0.0,
        metavar="S",
        help="print a one-line progress report every S seconds (0 = only at exit)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        metavar="N",
        help="largest ProcessedFrame accepted (gRPC's default of 4 MiB is too small for clouds)",
    )
    p.add_argument(
        "--ack-batch", type=int, default=64, metavar="N", help="max frames per ack / fsync batch"
    )
    p.add_argument("--no-fsync", action="store_true", help="flush but do not fsync the record")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")


def _progress_line(sink: SinkServer) -> str:
    t = sink.record.totals()
    return (
        f"sink: streams={t['streams']} received={t['received']} delivered={t['delivered']} "
        f"duplicates={t['duplicates']} lost={t['lost']} gap_frames={t['gap_frames']} "
        f"reorders={t['reorders']} push_streams={sink.active_push_streams}"
    )


def format_sink_report(rep: dict[str, Any]) -> str:
    t, lat = rep["totals"], rep["latency"]
    lines = [
        f"streams {t['streams']}: received {t['received']}, delivered {t['delivered']}, "
        f"duplicates {t['duplicates']}, lost {t['lost']} (max burst {t['max_loss_burst']}), "
        f"announced gap frames {t['gap_frames']}, reorders {t['reorders']}",
        f"points in {t['input_points']} -> out {t['output_points']}, "
        f"decimation mismatches {t['decimation_mismatches']}",
        "latency capture -> sink: " + _format_latency(lat),
    ]
    lines += [
        f"  {name}: delivered {s['delivered']} lost {s['lost']} dup {s['duplicates']} "
        f"gap {s['gap_frames']} watermark {s['watermark']}"
        for name, s in rep["streams"].items()
    ]
    lines += [
        f"  bridge {b['bridge_id'] or '(unnamed)'}: acked bridge_seq {b['acked_bridge_seq']}, "
        f"frames {b['frames_received']}, push streams {b['push_streams']}"
        + (" (connected)" if b["connected"] else "")
        for b in rep.get("server", {}).get("bridges", ())
    ]
    return "\n".join(lines)


def _format_latency(lat: dict[str, float]) -> str:
    if not lat.get("count"):
        return "no samples"
    return (
        f"n={int(lat['count'])} p50 {lat['p50_ms']:.2f} ms, p90 {lat['p90_ms']:.2f} ms, "
        f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms"
    )


async def _sink_main(args: argparse.Namespace) -> int:
    sink = SinkServer(
        listen=args.listen,
        record_path=args.record,
        max_message_bytes=args.max_message_bytes,
        ack_batch_frames=args.ack_batch,
        fsync=not args.no_fsync,
    )
    await sink.start()
    _print(f"sink listening on {sink.address}")
    if sink.replayed:
        _print(f"replayed {sink.replayed} records from {args.record}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            timeout = args.report_every if args.report_every > 0 else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            if not stop.is_set():
                _print(_progress_line(sink))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await sink.stop(grace=1.0)
    rep = sink.report()
    _print(json.dumps(rep, indent=2) if args.json else format_sink_report(rep))
    return 0


register(
    Command(
        name="sink",
        help="run the reference visualization sink (the bridge pushes processed frames to it)",
        description="Serve bridge.v1.VisualizationSink/Push. On every Push stream the sink first "
        "sends its per-stream watermarks, then acknowledges cumulatively by bridge_seq once a "
        "batch is recorded. It counts losses, duplicates, reorders and announced gaps per "
        "(device, stream) and prints a summary on SIGINT/SIGTERM.",
        configure=_configure_sink,
        run=lambda args: run_async(_sink_main(args)),
    )
)


# ---------------------------------------------------------------------------------------------
# publish


def _configure_publish(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--ws", metavar="URL", help="WebSocket ingest, e.g. ws://127.0.0.1:8080/v1/ingest"
    )
    target.add_argument("--grpc", metavar="HOST:PORT", help="gRPC ingest, e.g. 127.0.0.1:9090")
    p.add_argument("--edges", type=int, default=1, metavar="K", help="edge devices (default 1)")
    p.add_argument(
        "--streams-per-edge",
        type=int,
        default=1,
        metavar="S",
        help="point-cloud streams per edge (default 1)",
    )
    p.add_argument(
        "--rate", type=float, default=10.0, metavar="HZ", help="frames/s per stream (default 10)"
    )
    p.add_argument(
        "--points", type=int, default=10_000, metavar="N", help="points per cloud (default 10000)"
    )
    p.add_argument(
        "--duration", type=float, default=10.0, metavar="S", help="seconds to publish (default 10)"
    )
    p.add_argument("--telemetry", action="store_true", help="add one telemetry stream per edge")
    p.add_argument("--color", action="store_true", help="xyz+rgb clouds instead of xyz+intensity")
    p.add_argument(
        "--voxel-size",
        type=float,
        default=0.0,
        metavar="M",
        help="per-stream voxel (0 = bridge default)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic clouds")
    p.add_argument(
        "--device-prefix",
        default="loadgen",
        metavar="NAME",
        help="device ids are NAME-0..NAME-(K-1); distinct prefixes let publishers run side by side",
    )
    p.add_argument(
        "--resend-buffer-bytes",
        type=int,
        default=256 * 1024 * 1024,
        metavar="N",
        help="per-edge bound on unacknowledged bytes; beyond it the oldest frame is dropped",
    )
    p.add_argument(
        "--resend-buffer-frames",
        type=int,
        default=10_000,
        metavar="N",
        help="per-edge bound on unacknowledged frames",
    )
    p.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="N")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="after publishing, wait this long for every frame to be reported delivered",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="give up (exit 1) if an edge gets no Welcome within S seconds",
    )
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        metavar="N",
        help="spread the edges over N processes, so the generator is not the bottleneck "
        "(default 1: this process)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def format_publish_report(rep: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"published {rep['published']} frames ({rep['publish_rate_hz']}/s) from "
            f"{rep['edges']} edges x {rep['streams_per_edge']} streams in {rep['elapsed_s']} s",
            f"sent {rep['sent']}, resent {rep['resent']}, accepted {rep['acked_accepted']}, "
            f"delivered {rep['acked_delivered']}, undelivered {rep['undelivered']}, "
            f"dropped (resend overflow) {rep['dropped_resend_overflow']}",
            f"disconnects {rep['disconnects']}, reconnects {rep['reconnects']}, "
            f"connect failures {rep['connect_failures']}, drains {rep['drains']}, "
            f"pauses {rep['pauses']}, errors {rep['errors'] or 'none'}",
            f"schedule: late ticks {rep['late_ticks']}, max lag {rep['max_schedule_lag_ms']} ms; "
            f"generator CPU {rep['generator_cpu_pct']} % over {rep.get('procs', 1)} process(es); "
            f"longest stall {rep['longest_stall_ms']} ms",
            "latency scheduled send -> delivered ack: " + _format_latency(rep["latency"]),
        ]
        + (
            [
                "WARNING: the generator fell behind its own schedule (over 1 % of ticks late): "
                "these figures measure the generator, not the bridge; use more --procs"
            ]
            if rep["schedule_lagged"]
            else []
        )
    )


async def _publish_main(args: argparse.Namespace) -> int:
    transport: Transport = "ws" if args.ws else "grpc"
    kwargs: dict[str, Any] = dict(
        transport=transport,
        url=args.ws or args.grpc,
        edges=args.edges,
        streams_per_edge=args.streams_per_edge,
        rate_hz=args.rate,
        duration_s=args.duration,
        points=args.points,
        telemetry=args.telemetry,
        voxel_size=args.voxel_size,
        color=args.color,
        seed=args.seed,
        device_prefix=args.device_prefix,
        resend_buffer_bytes=args.resend_buffer_bytes,
        resend_buffer_frames=args.resend_buffer_frames,
        max_message_bytes=args.max_message_bytes,
        drain_timeout_s=args.drain_timeout,
        connect_timeout_s=args.connect_timeout,
    )
    try:
        if args.procs > 1:
            rep = await publish_procs(args.procs, **kwargs)
        else:
            rep = await Publisher(**kwargs).run()
    except ConnectionError as exc:
        _print(f"error: {exc}", sys.stderr)
        return 1
    rep.pop("_delivered_at_ns", None)
    _print(json.dumps(rep, indent=2) if args.json else format_publish_report(rep))
    if rep["undelivered"]:  # a publisher that lost track of frames has not succeeded
        _print(f"error: {rep['undelivered']} frame(s) not delivered", sys.stderr)
        return 1
    return 0


def _run_publish(args: argparse.Namespace) -> int:
    try:
        return run_async(_publish_main(args))
    except ValueError as exc:  # invalid combination of numbers
        _print(f"error: {exc}", sys.stderr)
        return 2


register(
    Command(
        name="publish",
        help="publish synthetic lidar clouds from K edges at a fixed rate (open loop)",
        description="Connect K edge devices over WebSocket or gRPC and publish S point-cloud "
        "streams each at a fixed rate for a duration, on a schedule (latency counts from the "
        "scheduled send time, so a stalled bridge shows up as latency). Edges buffer every "
        "frame until the bridge reports it delivered, resend after reconnects, honour "
        "pause/resume and drain. Prints a summary; exit 1 if the bridge cannot be reached or "
        "frames are still undelivered after --drain-timeout.",
        configure=_configure_publish,
        run=_run_publish,
    )
)


# ---------------------------------------------------------------------------------------------
# scenario runner (loadgen/demo.py): demo, run, report

from loadgen import demo as _scen  # noqa: E402

register(
    Command(
        name="demo",
        help="local end-to-end demo: in-place resize vs restart, side by side (`make run`)",
        description="Start a bridge, a sink and edges on this machine with the built-in demo "
        "scenario (about 90 s): six in-place resizes, then the same plan as restarts. Prints "
        "the comparison and writes the JSON report and the PNG under --out.",
        configure=_scen.configure_demo,
        run=_scen.demo_command,
    )
)
register(
    Command(
        name="run",
        help="run a scenario (file or --builtin) in place, then the restart baseline",
        description="Run a load scenario against a child bridge: edges publish open loop while "
        "the resize plan is applied in place (backend local, kubesim or kubectl), then, unless "
        "--baseline none, the same plan by restarting the bridge. Frames lost, duplicated, "
        "reordered, stalls, latency and time-to-adapt are accounted per phase from the sink's "
        "record; the report (JSON + PNG) goes to --out. With --target, drive a bridge that "
        "already runs instead (see the 'external bridge' options).",
        configure=_scen.configure_run,
        run=_scen.run_command,
    )
)
register(
    Command(
        name="report",
        help="re-render the table and the PNG of a saved report JSON",
        description="Validate FILE.json against loadgen/report.schema.json, print the "
        "in-place vs restart table and write the PNG next to it (or to --png).",
        configure=_scen.configure_report,
        run=_scen.report_command,
    )
)


# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simbridge-loadgen",
        description="Load generator and reference visualization sink for simbridge.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description)
        cmd.configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
