"""Which fatal Errors end the SDK's attempts: those a retry would get again, and no others."""

from __future__ import annotations

import pytest

from bridge.client.refusal import BridgeRefused, is_terminal, refusal
from bridge.v1 import bridge_pb2 as pb


def fatal(code: int, message: str = "") -> pb.Error:
    return pb.Error(code=code, message=message, fatal=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "welcomed", "terminal"),
    [
        (fatal(pb.UNAUTHENTICATED, "missing or wrong bearer token for this device"), False, True),
        (fatal(pb.PROTOCOL_VIOLATION, "resume token belongs to another device"), False, True),
        (fatal(pb.MALFORMED, "not a message"), True, True),
        (fatal(pb.TOO_MANY_STREAMS, "3 streams exceed max_streams_per_session 2"), False, True),
        (fatal(pb.CODEC_ERROR, "unknown codec"), False, True),
        # Passes on a later attempt: retried.
        (fatal(pb.UNAUTHENTICATED, "device 'd' has a live session; resume it …"), False, False),
        (fatal(pb.PROTOCOL_VIOLATION, "no Hello within 5 s"), False, False),
        (fatal(pb.TOO_MANY_SESSIONS, "session limit 10 reached"), False, False),
        (fatal(pb.CODEC_ERROR, "refused decodes exceed the budget"), True, False),
        (fatal(pb.CHUNK_ABANDONED, "stalled"), True, False),
        (pb.Error(code=pb.UNAUTHENTICATED, message="x", fatal=False), False, False),
    ],
)
def test_terminal_refusals(error: pb.Error, welcomed: bool, terminal: bool) -> None:
    assert is_terminal(error, welcomed=welcomed) is terminal


def test_the_refusal_names_code_and_reason() -> None:
    exc = BridgeRefused("dev", "UNAUTHENTICATED", "wrong token", "ws:1008:policy")
    assert isinstance(exc, ConnectionError)
    assert str(exc) == (
        "dev: refused by the bridge: UNAUTHENTICATED: wrong token (connection ended ws:1008:policy)"
    )


def test_a_terminal_grpc_status_without_an_error_ends_the_attempts() -> None:
    """E.g. a proxy in front of the bridge that refuses the call itself."""
    stop = refusal("d", None, close="grpc:UNAUTHENTICATED", detail="no", fatal_seen=False)
    assert stop is not None and stop.code == "UNAUTHENTICATED" and stop.detail == "no"
    # After a fatal Error the status only repeats it: the Error decides (here: retry).
    assert refusal("d", None, close="grpc:UNAUTHENTICATED", detail="", fatal_seen=True) is None
    assert refusal("d", None, close="grpc:UNAVAILABLE", detail="", fatal_seen=False) is None
    assert refusal("d", None, close="ws:1008:policy", detail="", fatal_seen=False) is None
