"""``simbridge``: the bridge's command line (serve, resources, decimate, bench).

Only this module calls ``sys.exit``. ``serve`` installs signal handlers: SIGTERM (or a first
SIGINT) drains and exits 0; a second SIGINT forces an immediate exit.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from bridge import logs
from bridge import settings as settings_mod
from bridge.errors import BridgeError, ConfigError

log = logging.getLogger("bridge.cli")


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="simbridge serve",
        description="Run the bridge: WebSocket + gRPC ingest, decimation, gRPC egress to a sink "
        "and subscribers, /metrics on the HTTP port. Flags override env BRIDGE_* which "
        "override the config file.",
    )
    settings_mod.add_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        settings = settings_mod.from_args(ns)
    except ConfigError as exc:
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level)
    if settings.tune_allocator:
        from bridge.memtrim import tune_allocator

        tune_allocator()
    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        ok = runner(_serve_async(settings))
    except BridgeError as exc:
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


async def _serve_async(settings: settings_mod.Settings) -> bool:
    from bridge.app import BridgeService

    service = BridgeService(settings)
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            log.error("second interrupt: exiting now")
            os._exit(130)
        service.request_stop()

    loop.add_signal_handler(signal.SIGTERM, service.request_stop)
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    await service.start()
    ports = service.ports
    assert ports is not None
    # One machine-readable line so supervisors (tests, the demo) learn ports chosen with 0.
    print(f"SIMBRIDGE_READY ws={ports.ws} grpc={ports.grpc} http={ports.http}", flush=True)
    await service.wait_stopped()
    await service.shutdown()
    return True


def _resources(argv: list[str]) -> int:
    from bridge.resources.cli import main as resources_main

    return resources_main(argv)


def _decimate(argv: list[str]) -> int:
    from bridge.decimate.filecli import main as decimate_main

    return decimate_main(argv)


def _bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="simbridge bench", description="Benchmarks for humans.")
    parser.add_argument("what", choices=["decimate"], help="which benchmark")
    _ns, rest = parser.parse_known_args(argv)
    try:  # benchmarks/ ships with the source tree, not with the server package
        from benchmarks.decimate import main as bench_main
    except ImportError as exc:
        print(f"simbridge bench needs a source checkout (benchmarks/): {exc}", file=sys.stderr)
        return 2
    return bench_main(rest)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "serve": (_serve, "run the bridge"),
    "resources": (_resources, "print the limits the bridge sees and where each came from"),
    "decimate": (_decimate, "voxel-downsample a PCD/PLY file"),
    "bench": (_bench, "run a benchmark (bench decimate)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: simbridge COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        print("\n`simbridge COMMAND --help` describes each command.")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except BridgeError as exc:
        print(f"simbridge: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
