"""Stub WebSocket connections for the adapter's tests: the benchmark's connection past its
handshake on a stub transport (``benchmarks.ws_small``), governed by a given governor."""

from __future__ import annotations

from benchmarks.ws_small import open_connection
from bridge.governor import Governor
from bridge.ws_impl import GovernedConnection

__all__ = ["governed_connection", "open_connection"]


async def governed_connection(governor: Governor, max_size: int = 1 << 20) -> GovernedConnection:
    class Connection(GovernedConnection):
        pass

    Connection.governor = governor
    connection = await open_connection(Connection, max_size)
    assert isinstance(connection, GovernedConnection)
    return connection
