"""The routing key (issue 32): the SDK puts the device id where a load balancer can hash it, and a
bridge refuses a Hello for another device than the one the connection was routed by."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from websockets.asyncio.client import connect

import bridge.server.ingest
from bridge.client import EdgeClient, StreamSpec
from bridge.client.transport import ROUTING_HEADER as SDK_HEADER
from bridge.client.transport import ROUTING_QUERY as SDK_QUERY
from bridge.server.session import ROUTING_HEADER, ROUTING_QUERY, routing_keys
from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import grpc_target, hello, running_bridge, ws_url


def test_sdk_and_bridge_agree_on_the_names() -> None:
    names = ("x-simbridge-device", "device")
    assert (SDK_HEADER, SDK_QUERY) == (ROUTING_HEADER, ROUTING_QUERY) == names


@pytest.mark.parametrize("transport", ["ws", "grpc"])
async def test_the_sdk_sends_the_device_id_as_routing_key(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[set[str]] = []

    def recording(t: object) -> set[str]:
        keys = routing_keys(t)
        seen.append(keys)
        return keys

    monkeypatch.setattr(bridge.server.ingest, "routing_keys", recording)
    async with running_bridge() as service:
        url = ws_url(service) if transport == "ws" else f"grpc://{grpc_target(service)}"
        async with EdgeClient(url, device_id="robot-7", streams=[StreamSpec("s")]) as edge:
            assert edge.connected
    assert seen == [{"robot-7"}]


async def test_a_websocket_routed_for_another_device_is_refused() -> None:
    async with running_bridge() as service:
        for url, headers in (
            (ws_url(service) + "?device=other", {}),
            (ws_url(service), {ROUTING_HEADER: "other"}),
        ):
            async with connect(url, additional_headers=headers, compression=None) as ws:
                await ws.send(hello("robot", "s").SerializeToString())
                msg = pb.BridgeMessage.FromString(await ws.recv(decode=False))
                assert msg.error.code == pb.PROTOCOL_VIOLATION and msg.error.fatal
                assert "differs from the routing key 'other'" in msg.error.message
                await ws.wait_closed()
                assert ws.close_code == 1008
        # the same key as the Hello passes
        url = ws_url(service) + "?device=robot"
        async with connect(url, additional_headers={ROUTING_HEADER: "robot"}) as ws:
            await ws.send(hello("robot", "s").SerializeToString())
            assert pb.BridgeMessage.FromString(await ws.recv(decode=False)).HasField("welcome")


async def test_a_grpc_call_routed_for_another_device_is_refused() -> None:
    async with (
        running_bridge() as service,
        grpc.aio.insecure_channel(grpc_target(service)) as channel,
    ):
        method: Any = channel.stream_stream(
            "/bridge.v1.Ingest/Connect",
            request_serializer=None,
            response_deserializer=pb.BridgeMessage.FromString,
        )
        call = method(metadata=((ROUTING_HEADER, "other"),))
        await call.write(hello("robot", "s").SerializeToString())
        msg = await call.read()
        assert msg.error.code == pb.PROTOCOL_VIOLATION and msg.error.fatal
        assert "differs from the routing key 'other'" in msg.error.message
        assert await call.code() == grpc.StatusCode.FAILED_PRECONDITION
