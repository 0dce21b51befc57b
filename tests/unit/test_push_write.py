"""A push write that finds the sink's call already finished is a sink failure (reconnect and
replay), never an error that ends the pusher: InvalidStateError becomes ConnectionError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge.metrics import BridgeMetrics
from bridge.push_impl import SinkPusher
from bridge.settings import Settings


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
