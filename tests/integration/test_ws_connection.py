"""The WebSocket connection the bridge now runs itself (``bridge.server.ws_conn``, over
``websockets``' sans-I/O ``ServerProtocol``) keeps what the library's asyncio server did for us: the
upgrade
answers (404 off the ingest path, 503 while draining or closing), keepalive pings that fail a
silent peer with 1011, a server close that says 1001, and the ``Server`` header.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import hello, running_bridge, ws_url


async def test_the_upgrade_is_answered_404_off_the_ingest_path_and_503_while_draining() -> None:
    async with running_bridge() as bridge:
        url = ws_url(bridge)
        with pytest.raises(InvalidStatus) as wrong:
            async with connect(url.replace("/v1/ingest", "/v1/other"), compression=None):
                pass
        assert wrong.value.response.status_code == 404
        async with connect(url, compression=None) as ws:  # the right path is accepted
            assert ws.response is not None and ws.response.status_code == 101
            assert "websockets" in ws.response.headers.get("Server", "")
        bridge.edges._draining = True  # what drain() sets first
        with pytest.raises(InvalidStatus) as draining:
            async with connect(url, compression=None):
                pass
        assert draining.value.response.status_code == 503


async def test_a_peer_that_stops_answering_pings_is_closed_with_1011() -> None:
    async with (
        running_bridge(ping_interval_seconds=0.2, ping_timeout_seconds=0.2) as bridge,
        connect(ws_url(bridge), compression=None, ping_interval=None) as ws,
    ):
        await ws.send(hello("dev", "lidar").SerializeToString())
        welcome = pb.BridgeMessage.FromString(await ws.recv(decode=False))
        assert welcome.WhichOneof("kind") == "welcome"
        ws.transport.pause_reading()  # our pongs stop: the bridge's pings go unanswered
        await asyncio.sleep(1.0)  # > interval + timeout, < interval + timeout + close timeout
        ws.transport.resume_reading()
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        assert time.monotonic() - started < 3
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "keepalive ping timeout")


async def test_closing_the_server_closes_its_connections_with_1001() -> None:
    async with running_bridge() as bridge, connect(ws_url(bridge), compression=None) as ws:
        await ws.send(hello("dev", "lidar").SerializeToString())
        await ws.recv(decode=False)
        assert bridge._ws_server is not None
        bridge._ws_server.close()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        await asyncio.wait_for(bridge._ws_server.wait_closed(), 5)
        bridge._ws_server = None
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
