"""A push write that finds the sink's call already finished is a sink failure (reconnect and
replay), never an error that ends the pusher: InvalidStateError becomes ConnectionError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge.config.settings import Settings
from bridge.server.governor import Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.push_impl import SinkPusher


class FinishedCall:
    async def write(self, _data: bytes) -> None:
        raise asyncio.InvalidStateError("RPC already finished.")


async def test_a_write_on_a_finished_call_is_a_connection_error() -> None:
    pusher = SinkPusher(
        delivery=Any,  # type: ignore[arg-type]  # _write never touches delivery
        settings=Settings(sink_address="127.0.0.1:1"),
        metrics=BridgeMetrics(CollectorRegistry()),
    )
    with pytest.raises(ConnectionError):
        await pusher._write(FinishedCall(), [b"x"], 1, 1)


class RecordingCall:
    """Records what the egress component was charged while a message was being written."""

    def __init__(self, governor: Governor) -> None:
        self.governor = governor
        self.charged: list[int] = []

    async def write(self, data: bytes) -> None:
        self.charged.append(self.governor.charged(Component.EGRESS))


async def test_a_push_is_charged_for_the_join_and_grpcs_copy_while_written() -> None:
    governor = Governor(1 << 20)
    pusher = SinkPusher(
        delivery=Any,  # type: ignore[arg-type]  # _write never touches delivery
        settings=Settings(sink_address="127.0.0.1:1"),
        metrics=BridgeMetrics(CollectorRegistry()),
        governor=governor,
    )
    call = RecordingCall(governor)
    parts = [b"head", bytes(1000)]
    await pusher._write(call, parts, 1004, 7)  # type: ignore[arg-type]
    assert call.charged == [2 * 1004]  # charged before the join, for both copies
    assert governor.total_bytes == 0 and governor.live_charges == 0
