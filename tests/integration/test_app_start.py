"""A failed start leaves nothing behind: listeners already bound are closed again."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from bridge.app import BridgeService
from bridge.errors import StartupError
from tests.integration.harness import bridge_settings


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
