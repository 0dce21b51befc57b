"""A failed start leaves nothing behind: listeners already bound are closed again."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from bridge.protocol.errors import StartupError
from bridge.server.app import BridgeService
from tests.integration.harness import bridge_settings, running_bridge


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_start_closes_grpc_when_the_websocket_port_is_taken(free_port: int) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ws_port = taken.getsockname()[1]
        service = BridgeService(
            bridge_settings(ws_port=ws_port, grpc_port=free_port), CollectorRegistry()
        )
        with pytest.raises(StartupError, match="WebSocket"):
            await service.start()
        assert not service.ready
        assert _port_is_free(free_port), "the gRPC listener outlived the failed start"
        assert service.pool.alive == 0, "the worker threads outlived the failed start"
        await service.close()  # still safe to call


async def test_a_second_bridge_cannot_take_a_grpc_port_in_use() -> None:
    """gRPC sets SO_REUSEPORT by default: without the bridge turning it off, a second process
    on the same port started and the kernel split new connections (reconnecting edges among
    them) between two bridges with separate sessions."""
    async with running_bridge() as first:
        assert first.ports is not None
        second = BridgeService(bridge_settings(grpc_port=first.ports.grpc), CollectorRegistry())
        try:
            with pytest.raises(StartupError, match="gRPC"):
                await second.start()
        finally:
            await second.close()


async def test_reuse_port_lets_processes_share_both_ingest_ports() -> None:
    """The opt-in for several ingest processes behind one port pair (docs/scaling.md)."""
    async with running_bridge(reuse_port=True) as first:
        assert first.ports is not None
        second = BridgeService(
            bridge_settings(reuse_port=True, grpc_port=first.ports.grpc, ws_port=first.ports.ws),
            CollectorRegistry(),
        )
        try:
            await second.start()
            assert second.ready and second.ports is not None
            assert (second.ports.grpc, second.ports.ws) == (first.ports.grpc, first.ports.ws)
        finally:
            await second.close()
