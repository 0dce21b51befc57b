"""The one error table: every refusal has a row, and both transports report from that row."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from bridge.protocol import errors
from bridge.server.governor import Governor
from bridge.server.grpc_impl import GrpcTransport
from bridge.server.ws_impl import WsTransport
from bridge.v1 import bridge_pb2 as pb


def _protocol_errors() -> list[type[errors.ProtocolError]]:
    found, todo = [], [errors.ProtocolError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_protocol_error_has_one_valid_row() -> None:
    classes = _protocol_errors()
    assert {c.reason for c in classes} == set(errors.WIRE)
    for cls in classes:
        row = cls().wire
        assert row.ws_close in (1007, 1008, 1009, 1013)  # 1013: try again later
        assert isinstance(grpc.StatusCode[row.grpc_status], grpc.StatusCode)
        assert cls().fatal is row.fatal
    # over_budget is TOO_LARGE sent as a non-fatal Error (the frame fitted before the limit fell)
    codes = [
        row.code for reason, row in errors.WIRE.items() if reason not in ("protocol", "over_budget")
    ]
    refusals = [v for v in pb.ErrorCode.values() if v not in (0, pb.SHUTTING_DOWN)]
    # Every refusal code is used (shutting down is a Drain); a code may name several reasons
    # (the metric label tells them apart), e.g. UNAUTHENTICATED for a bad token or a taken session.
    assert set(codes) == set(refusals)
    assert errors.WIRE["over_budget"].code == pb.TOO_LARGE


def test_errors_that_keep_the_connection_open() -> None:
    assert {r for r, row in errors.WIRE.items() if not row.fatal} == {
        "unknown_stream",
        "invalid_layout",
        "too_many_points",
        "seq_regression",
        "telemetry_too_large",
        "over_budget",
        "chunk_sequence",
        "chunk_too_large",
        "chunk_abandoned",
        "codec_error",
    }


class _Ws:
    def __init__(self) -> None:
        self.closed: tuple[int, str] | None = None

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


class _Context:
    def __init__(self) -> None:
        self.code: Any = None

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        pass


@pytest.mark.parametrize("cls", _protocol_errors(), ids=lambda c: c.reason)
def test_both_transports_report_from_the_table(cls: type[errors.ProtocolError]) -> None:
    ws, context = _Ws(), _Context()
    error = cls("refused")
    asyncio.run(WsTransport(ws).reject(error))  # type: ignore[arg-type]
    asyncio.run(GrpcTransport(context, Governor(0)).reject(error))  # type: ignore[arg-type]
    assert ws.closed == (error.wire.ws_close, "refused")
    assert context.code is grpc.StatusCode[error.wire.grpc_status]
