"""Helpers for ``--bridge-procs N``: several bridge processes behind one port pair, the prototype
of the multi-process ingest in docs/scaling.md, measured with the relay benchmark's own cells.

Each process runs ``simbridge serve --reuse-port`` on the same WebSocket and gRPC ports
(``SO_REUSEPORT``: the kernel spreads *connections* over the processes by a hash of the 4-tuple)
and keeps its own push stream to the sink. Every benchmark connection is a device of its own, so
no device is shared and nothing is handed over: what this measures is the spread, the aggregate
rate, CPU per message across the processes, and the memory N processes cost.
"""

from __future__ import annotations

import socket


def reserve_shared_ports(count: int) -> tuple[list[socket.socket], list[int]]:
    """``count`` free ports, each held by a bound, non-listening ``SO_REUSEPORT`` socket until
    the caller closes it, so the processes it starts can bind them too (and nothing else can)."""
    held, ports = [], []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", 0))
        held.append(s)
        ports.append(s.getsockname()[1])
    return held, ports


def shared_port_args(ws_port: int, grpc_port: int) -> list[str]:
    """The ``simbridge serve`` flags of one process of the group."""
    return ["--ws-port", str(ws_port), "--grpc-port", str(grpc_port), "--reuse-port"]


def spread_line(cpu: list[float], rss: list[int]) -> str:
    """One line for the report: each process's share of the group's CPU, and its memory
    (``rss``: bytes, 0 for a process already gone)."""
    total = sum(cpu) or 1.0
    shares = ", ".join(f"{100 * c / total:.0f} %" for c in cpu)
    mem = ", ".join(f"{r / (1 << 20):.0f}" for r in rss)
    return f"bridge processes: CPU share over the run {shares}; RSS at the end (MiB) {mem}"
