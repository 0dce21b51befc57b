"""The raw-transport baselines for ``benchmarks.relay.cli``: the least a relay can do.

A relay process accepts edge connections over WebSocket or gRPC and forwards every message's
bytes, unchanged, over ONE ``grpc.aio`` stream to the benchmark's sink. No protobuf, no acks,
no rings, no sessions: what is left is the cost of the two transports plus one asyncio hop, which
is the ceiling the bridge's passthrough mode is compared against. It runs as its own process
(like the bridge) so that it gets its own interpreter and GIL and competes for the CPU exactly
as the bridge does.

Run: ``python -m benchmarks.relay.servers {ws,grpc} --sink HOST:PORT --max-bytes N``; it prints
``RELAY_READY port=N`` once listening and exits on SIGTERM.

Both relays share one bounded queue in front of the sink stream: a gRPC stream allows one write
at a time, and the bound turns a slow sink into backpressure on the edges (the handlers stop
reading, the transports' own flow control stops the senders), the same behaviour the bridge gets
from its rings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from typing import Any

import grpc
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

RELAY_INGEST_METHOD = "/bench.Relay/Ingest"
"""The raw gRPC relay's ingest method: stream of opaque bytes in, one empty reply at the end."""
RAW_SINK_METHOD = "/bench.RawSink/Push"
"""The sink method the relays forward to: stream of opaque bytes, one empty reply at the end."""
QUEUE_MESSAGES = 64
"""Messages buffered between the edge handlers and the sink stream (the relay's only buffer)."""


def grpc_options(max_bytes: int) -> list[tuple[str, int]]:
    """gRPC's default 4 MiB receive cap is not ours to inherit (docs/design.md §2): set it."""
    return [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
    ]


class SinkForwarder:
    """One long-lived stream to the sink, fed by a bounded queue, written by a single task."""

    def __init__(self, sink_address: str, max_bytes: int) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=QUEUE_MESSAGES)
        # The benchmark may start listening just after us: retry quickly, not after gRPC's 1 s.
        options = [*grpc_options(max_bytes), ("grpc.initial_reconnect_backoff_ms", 50)]
        self._channel = grpc.aio.insecure_channel(sink_address, options=options)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sink-forwarder")

    async def _run(self) -> None:
        push = self._channel.stream_unary(
            RAW_SINK_METHOD, request_serializer=None, response_deserializer=None
        )
        call = push(wait_for_ready=True)
        queue = self.queue
        while True:
            await call.write(await queue.get())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task
        await self._channel.close()


async def serve_ws(forwarder: SinkForwarder, host: str, max_bytes: int) -> tuple[Any, int]:
    """WebSocket relay at any path; settings match the bridge's (no deflate, explicit size)."""
    put = forwarder.queue.put

    async def handler(ws: ServerConnection) -> None:
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                if isinstance(message, bytes):
                    await put(message)

    server = await serve(
        handler, host, 0, compression=None, max_size=max_bytes, max_queue=16, ping_interval=None
    )
    port = next(iter(server.sockets)).getsockname()[1]
    return server, int(port)


async def serve_grpc(forwarder: SinkForwarder, host: str, max_bytes: int) -> tuple[Any, int]:
    """gRPC relay: a client stream of raw bytes per edge connection (no (de)serialization)."""
    put = forwarder.queue.put

    async def ingest(requests: Any, _context: Any) -> bytes:
        async for message in requests:
            await put(message)
        return b""

    server = grpc.aio.server(options=grpc_options(max_bytes))
    handler = grpc.stream_unary_rpc_method_handler(ingest)
    service, method = RELAY_INGEST_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    return server, int(port)


async def main_async(kind: str, host: str, sink: str, max_bytes: int) -> None:
    forwarder = SinkForwarder(sink, max_bytes)
    forwarder.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if kind == "ws":
        server, port = await serve_ws(forwarder, host, max_bytes)
    else:
        server, port = await serve_grpc(forwarder, host, max_bytes)
    print(f"RELAY_READY port={port}", flush=True)
    await stop.wait()
    if kind == "ws":
        server.close()
        await server.wait_closed()
    else:
        await server.stop(0.5)
    await forwarder.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay.servers")
    parser.add_argument("kind", choices=["ws", "grpc"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--sink", required=True, help="HOST:PORT of the benchmark's sink")
    parser.add_argument("--max-bytes", type=int, default=4 << 20)
    ns = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main_async(ns.kind, ns.host, ns.sink, ns.max_bytes))
    else:  # the same event loop as the bridge it is compared with
        uvloop.run(main_async(ns.kind, ns.host, ns.sink, ns.max_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
