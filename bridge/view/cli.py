"""``simbridge view``: the visualization sink's command line.

Prints one machine-readable line once everything listens (``SIMBRIDGE_VIEW_READY grpc=…
foxglove=… web=…``, 0 = off) and human hints on stderr. SIGTERM or Ctrl-C stops it cleanly: the
Push server first, then the MCAP file is finished with its watermarks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

from bridge import logs

if TYPE_CHECKING:
    from bridge.view.service import ViewService

log = logging.getLogger("bridge.view.cli")


def _port_or_off(text: str) -> int | None:
    if text.lower() in ("off", "none", "-1"):
        return None
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 or 'off', got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simbridge view",
        description="A visualization sink for the bridge (point it at this with "
        "`simbridge serve --sink-address HOST:PORT`): serves VisualizationSink.Push and shows "
        "the processed frames live in Foxglove (WebSocket) and a browser page, and records them "
        "to rotating MCAP files, acknowledging to the bridge only once they are on disk.",
    )
    p.add_argument("--listen", default="127.0.0.1:50051", help="Push server address (%(default)s)")
    g = p.add_argument_group("TLS (like the bridge's sink_* settings, from PEM files)")
    g.add_argument("--tls-cert-file", default="", help="server certificate chain")
    g.add_argument("--tls-key-file", default="", help="server private key")
    g.add_argument(
        "--tls-client-ca-file", default="", help="require bridge client certificates (mTLS)"
    )
    g = p.add_argument_group("MCAP record")
    g.add_argument("--mcap", metavar="DIR", default="", help="record to rotating MCAP files here")
    g.add_argument("--mcap-max-bytes", type=int, default=512 * 1024 * 1024, help="rotate at size")
    g.add_argument("--mcap-max-seconds", type=float, default=600.0, help="rotate at age")
    g.add_argument("--mcap-compression", choices=("none", "zstd", "lz4"), default="none")
    g.add_argument("--no-fsync", action="store_true", help="flush only (faster, not crash-safe)")
    g = p.add_argument_group("Foxglove WebSocket server")
    g.add_argument("--foxglove-host", default="127.0.0.1")
    g.add_argument(
        "--foxglove-port", type=_port_or_off, default=8765, help="0 = any, 'off' = no server"
    )
    g.add_argument(
        "--frame-id",
        action="append",
        default=[],
        metavar="[DEVICE/]STREAM=ID",
        help="frame_id for a stream's clouds (repeatable); else the cloud's own, else the default",
    )
    g.add_argument("--default-frame-id", default="world")
    g.add_argument(
        "--foxglove-hold-messages",
        type=int,
        default=64,
        help="newest messages a channel keeps while nobody subscribes to it, for its first "
        "subscriber (%(default)s)",
    )
    g.add_argument(
        "--foxglove-hold-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="bytes all channels keep that way together (%(default)s)",
    )
    g = p.add_argument_group("browser page")
    g.add_argument("--web-host", default="127.0.0.1")
    g.add_argument("--web-port", type=_port_or_off, default=None, help="serve the page here")
    g.add_argument("--web-max-points", type=int, default=200_000, help="points per cloud shown")
    p.add_argument("--ack-batch-frames", type=int, default=64, help="frames per MCAP chunk/ack")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    return p


def main(argv: list[str]) -> int:
    ns = parser().parse_args(argv)
    logs.configure(ns.log_format, ns.log_level)
    try:
        from bridge.view.service import ViewService, ViewSettings
    except ImportError as exc:  # foxglove-sdk / mcap come with the [view] extra
        print(f"simbridge view: {exc}; install with `pip install simbridge[view]`", file=sys.stderr)
        return 2
    settings = ViewSettings(
        listen=ns.listen,
        tls_cert_file=ns.tls_cert_file,
        tls_key_file=ns.tls_key_file,
        tls_client_ca_file=ns.tls_client_ca_file,
        mcap_dir=ns.mcap,
        mcap_max_bytes=ns.mcap_max_bytes,
        mcap_max_seconds=ns.mcap_max_seconds,
        mcap_compression=ns.mcap_compression,
        fsync=not ns.no_fsync,
        foxglove_host=ns.foxglove_host,
        foxglove_port=ns.foxglove_port,
        frame_ids=tuple(ns.frame_id),
        default_frame_id=ns.default_frame_id,
        foxglove_hold_messages=ns.foxglove_hold_messages,
        foxglove_hold_bytes=ns.foxglove_hold_bytes,
        web_host=ns.web_host,
        web_port=ns.web_port,
        web_max_points=ns.web_max_points,
        ack_batch_frames=ns.ack_batch_frames,
    )
    try:
        return asyncio.run(_run(ViewService(settings)))
    except (ValueError, OSError) as exc:
        print(f"simbridge view: {exc}", file=sys.stderr)
        return 2


async def _run(service: ViewService) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        ports = await service.start()
    except BaseException:
        await service.stop()  # whatever had started (Foxglove, the page) goes down with it
        raise
    print(
        f"SIMBRIDGE_VIEW_READY grpc={ports.grpc} foxglove={ports.foxglove} web={ports.web}",
        flush=True,
    )
    s = service.settings
    host = s.listen.rpartition(":")[0] or "127.0.0.1"
    hints = [f"sink for the bridge: --sink-address {host}:{ports.grpc}"]
    if ports.foxglove:
        hints.append(f"Foxglove: open connection -> ws://{s.foxglove_host}:{ports.foxglove}")
    if ports.web:
        hints.append(f"browser: http://{s.web_host}:{ports.web}/")
    if s.mcap_dir:
        hints.append(f"recording: {s.mcap_dir}/simbridge-*.mcap")
    for line in hints:
        log.info("%s", line)
    await stop.wait()
    log.info("stopping: finishing the MCAP record")
    await service.stop()
    return 0
