"""What a session costs to set up, and to move (``make bench-connect``).

docs/scaling.md weighs two ways for a device that reconnects into the wrong one of N ingest
processes: a *redirect* (the edge reconnects until the kernel's hash lands on the owner: N
connections on average) or a *handover* (the owner passes the session's seqs to the new process
over a Unix socket: one connection plus one round trip). Neither is built; this measures their
parts against a real ``simbridge serve``:

- ``new``: connect, Hello of a device never seen, Welcome, close: a fresh session;
- ``resume``: the same with one device id every time, which is what a reconnect (and so every
  step of a redirect) does: the bridge supersedes and resumes the detached session;
- ``unix rtt``: one round trip between two processes over a Unix socket carrying a session's
  per-stream seq table (64 streams), the message a handover adds.

Each connection is a new TCP connection (a new gRPC channel per connect). Timed from the start
of the connect to the Welcome; medians and p99 over ``--count`` connections, run one after the
other (the rate is the inverse of the mean, not a concurrent-connections figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc
from websockets.asyncio.client import connect

from benchmarks.relay.clients import Client, hello_message
from benchmarks.relay.common import INGEST_METHOD
from loadgen.launch import ChildProcess, serve_command

STREAMS = 64  # per-stream seqs in the handover message


async def ws_session(port: int, device: str) -> None:
    async with connect(f"ws://127.0.0.1:{port}/v1/ingest", compression=None) as ws:
        await ws.send(hello_message(device))
        Client.check_welcome(await ws.recv())


async def grpc_session(port: int, device: str) -> None:
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        call = channel.stream_stream(
            INGEST_METHOD, request_serializer=None, response_deserializer=None
        )(wait_for_ready=True)
        await call.write(hello_message(device))
        Client.check_welcome(await call.read())
        await call.done_writing()
        call.cancel()


async def timed(count: int, one: Callable[[int], Awaitable[None]]) -> list[float]:
    """Seconds per call of ``one(i)``, after two untimed warm-up calls."""
    for i in range(2):
        await one(-1 - i)
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        await one(i)
        out.append(time.perf_counter() - t0)
    return out


def seq_table() -> bytes:
    """A session's per-stream state as the handover would send it (JSON: small and plain)."""
    streams = {
        f"stream-{i}": {"accepted": 10**9 + i, "delivered": 10**9 + i - 8} for i in range(STREAMS)
    }
    return json.dumps({"device": "edge-1", "epoch": 7, "streams": streams}).encode()


_ECHO = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
while data := s.recv(1 << 16):
    s.sendall(data)
"""


def unix_rtts(count: int) -> list[float]:
    """Round trips of the seq table between this process and an echo process (the owner)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    message = seq_table()
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(child.fileno())], pass_fds=[child.fileno()]
    )
    child.close()
    out = []
    try:
        for i in range(count + 2):
            t0 = time.perf_counter()
            parent.sendall(message)
            got = 0
            while got < len(message):
                got += len(parent.recv(1 << 16))
            if i >= 2:
                out.append(time.perf_counter() - t0)
    finally:
        parent.close()
        echo.wait(timeout=10)
    return out


def row(name: str, seconds: Sequence[float]) -> str:
    ms = sorted(s * 1e3 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    rate = len(ms) / (sum(ms) / 1e3)
    return f"{name:22s} {statistics.median(ms):8.3f} {p99:8.3f} {rate:10.0f}"


async def measure(count: int) -> list[str]:
    rows = [f"{'':22s} {'p50 ms':>8s} {'p99 ms':>8s} {'per s':>10s}"]
    rtts = unix_rtts(count)
    bridge = await ChildProcess.start(
        serve_command(
            *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0", "--passthrough"),
            # detached sessions go after 1 s: thousands of "new" devices stay under max_sessions
            *("--session-ttl-seconds", "1"),
        ),
        env={"BRIDGE_ADAPT": "false", "BRIDGE_LOG_LEVEL": "WARNING"},
    )
    try:
        ws, gp = bridge.ports["ws"], bridge.ports["grpc"]
        rows.append(row("ws new session", await timed(count, lambda i: ws_session(ws, f"n{i}"))))
        rows.append(row("ws resume", await timed(count, lambda i: ws_session(ws, "edge-r"))))
        rows.append(
            row("grpc new session", await timed(count, lambda i: grpc_session(gp, f"g{i}")))
        )
        rows.append(row("grpc resume", await timed(count, lambda i: grpc_session(gp, "edge-g"))))
    finally:
        await bridge.stop(timeout=30)
    rows.append(row(f"unix rtt ({len(seq_table())} B)", rtts))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.connect", description=__doc__)
    parser.add_argument("--count", type=int, default=200, help="timed connections per row")
    ns = parser.parse_args(argv)
    if ns.count < 1:
        parser.error("--count >= 1 please")
    print(f"session setup against simbridge serve, {ns.count} connections per row, one at a time")
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for line in asyncio.run(measure(ns.count)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
