"""``simbridge``: the bridge's command line (serve, resources, decimate, view).

Only this module calls ``sys.exit``. ``serve`` installs signal handlers: SIGTERM (or a first
SIGINT) drains and exits 0, or 3 when the grace period ended with frames undelivered (the edges
resend them to the next bridge); a second SIGINT forces an immediate exit (130). Invalid
settings and listeners that cannot be bound exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from bridge import logs
from bridge.config import settings as settings_mod
from bridge.protocol.errors import BridgeError, ConfigError
from bridge.protocol.podcontrol import ENV_CONTROL as POD_CONTROL_ENV

log = logging.getLogger("bridge.cli")

EXIT_DRAIN_INCOMPLETE = 3  # SIGTERM: the grace period ended with frames still undelivered


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="simbridge serve",
        description="Run the bridge: WebSocket + gRPC ingest, decimation, gRPC egress to a sink "
        "and subscribers, /metrics on the HTTP port. Flags override env BRIDGE_* which "
        "override the config file.",
    )
    settings_mod.add_arguments(parser)
    ns = parser.parse_args(argv)
    unknown = settings_mod.unknown_env()
    try:
        settings = settings_mod.from_args(ns)
    except ConfigError as exc:
        for line in unknown:  # a misspelt variable may be why a setting is missing
            print(f"simbridge: warning: {line}", file=sys.stderr)
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2
    pod = settings.processes.strip().lower() != "1" and not os.environ.get(POD_CONTROL_ENV)
    busy = ports_in_use(settings.replace(reuse_port=False) if pod else settings)
    if busy:
        print(f"simbridge: {busy[0]}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    for line in unknown if not os.environ.get(POD_CONTROL_ENV) else ():  # the pod's once
        log.warning("%s", line)
    if settings.tune_allocator:
        from bridge.server.memtrim import tune_allocator

        tune_allocator()
    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        if pod:  # the supervisor of several ingest processes (docs/scaling.md)
            from bridge.pod.run import run_pod

            def pod_line(ws: int, grpc: int, http: int) -> str:
                return ready_line(ws, grpc, http, settings.log_format)

            ok = runner(run_pod(settings, argv, pod_line, stop_on_signals))
        else:
            ok = runner(_serve_async(settings))
    except BridgeError as exc:
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else EXIT_DRAIN_INCOMPLETE


def ports_in_use(settings: settings_mod.Settings) -> list[str]:
    """Listeners whose port another process holds, found before gRPC binds: gRPC reports that as
    C-level ``E...`` log lines and "Failed to bind", without the cause. Bound and released at
    once (SO_REUSEADDR, as the listeners themselves); the listeners still report a later race."""
    host = settings.host.strip("[]")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a host name: the listeners resolve it and report what they find
        return []
    if settings.reuse_port:  # sharing ports with other bridge processes is the point
        return []
    busy = []
    for label, port in (
        ("gRPC", settings.grpc_port),
        ("WebSocket", settings.ws_port),
        ("HTTP", settings.http_port),
    ):
        if not port:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                busy.append(f"cannot listen on {settings.host}:{port} ({label}): {exc.strerror}")
    return busy


def stop_on_signals(request_stop: Callable[[], None]) -> None:
    """SIGTERM or a first SIGINT asks for a drain; a second SIGINT exits at once (130). The
    same for a single bridge and a pod's supervisor (``bridge.pod.run`` is handed this)."""
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            log.error("second interrupt: exiting now")
            os._exit(130)
        request_stop()

    loop.add_signal_handler(signal.SIGTERM, request_stop)
    loop.add_signal_handler(signal.SIGINT, on_sigint)


async def _serve_async(settings: settings_mod.Settings) -> bool:
    from bridge.server.app import BridgeService
    from bridge.server.rebalance import Rebalancer

    service = BridgeService(settings)
    stop_on_signals(service.request_stop)
    await service.start()
    Rebalancer.install(service)  # POST /admin/rebalance on the ops port
    ports = service.ports
    assert ports is not None
    # One machine-readable line so supervisors (tests, the demo) learn ports chosen with 0. In a
    # pod the supervisor prints the pod's line once every process is up.
    if not os.environ.get(POD_CONTROL_ENV):
        print(ready_line(ports.ws, ports.grpc, ports.http, settings.log_format), flush=True)
    await service.wait_stopped()
    return await service.shutdown()


def ready_line(ws: int, grpc: int, http: int, log_format: str) -> str:
    """``SIMBRIDGE_READY ws=.. grpc=.. http=..``; with ``--log-format json`` the same facts as one
    JSON object (``"msg": "SIMBRIDGE_READY"``), so a JSON log pipeline never sees plain text."""
    if log_format != "json":
        return f"SIMBRIDGE_READY ws={ws} grpc={grpc} http={http}"
    now = time.time()
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    entry = {"ts": ts, "level": "info", "logger": "bridge.cli", "msg": "SIMBRIDGE_READY"}
    return json.dumps({**entry, "ws": ws, "grpc": grpc, "http": http})


def _resources(argv: list[str]) -> int:
    from bridge.resources.cli import main as resources_main

    return resources_main(argv)


def _decimate(argv: list[str]) -> int:
    from bridge.decimate.filecli import main as decimate_main

    return decimate_main(argv)


def _view(argv: list[str]) -> int:
    from bridge.view.cli import main as view_main

    return view_main(argv)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (_serve, "run the bridge"),
    "resources": (_resources, "print the limits the bridge sees and where each came from"),
    "decimate": (_decimate, "voxel-downsample a PCD/PLY file"),
    "view": (_view, "visualization sink: Foxglove WebSocket, MCAP record, browser page"),
}


def version() -> str:
    """The installed distribution's version (the one pip and the image tag agree on)."""
    try:
        return importlib.metadata.version("simbridge")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--version", "-V"):
        print(f"simbridge {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: simbridge COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\n`simbridge COMMAND --help` describes each command; --version prints the version.")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except BridgeError as exc:
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
