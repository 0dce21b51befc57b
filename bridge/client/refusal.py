"""When the bridge has refused an edge for good, and how to say so (sans-I/O).

Why: a wrong token, a Hello the bridge cannot accept or a message it cannot parse is refused the
same way on every attempt. Retrying with backoff only hides the cause (the caller saw "no Welcome
within 10 s" and a gRPC ``CANCELLED``), so the client stops at once and raises
:class:`BridgeRefused` with the bridge's own words. Refusals that can pass (the session limit,
too many connections waiting for Hello, a live session that will time out, a Hello deadline
missed on a slow link) are retried as before.
"""

from __future__ import annotations

from bridge.v1 import bridge_pb2 as pb

#: Fatal ``Error`` codes that the same edge would get again on every attempt.
TERMINAL_CODES = frozenset({pb.UNAUTHENTICATED, pb.PROTOCOL_VIOLATION, pb.MALFORMED})
#: The same, only when they refuse the Hello (after a Welcome they are about one connection).
TERMINAL_HELLO_CODES = TERMINAL_CODES | {pb.TOO_MANY_STREAMS, pb.CODEC_ERROR}
#: A missed Hello deadline is a PROTOCOL_VIOLATION too, but a slow link may pass next time.
HELLO_DEADLINE_PREFIX = "no Hello within"
#: A live session of this device id: it passes once the bridge drops the old connection.
SESSION_TAKEN_MARK = "has a live session"
#: gRPC statuses that end a call the same way on every attempt, with or without an ``Error``.
TERMINAL_GRPC_STATUSES = frozenset({"UNAUTHENTICATED", "PERMISSION_DENIED", "UNIMPLEMENTED"})
#: HTTP answers to the WebSocket upgrade that will not change (wrong path, no access).
TERMINAL_HTTP_STATUSES = frozenset({401, 403, 404})


class BridgeRefused(ConnectionError):
    """The bridge refused this edge in a way no retry can fix; the client stopped trying.

    ``code``: the ``ErrorCode`` name (or the gRPC status / HTTP status when no ``Error`` came),
    ``detail``: the bridge's message, ``close``: how the connection ended."""

    def __init__(self, device_id: str, code: str, detail: str, close: str = "") -> None:
        ended = f" (connection ended {close})" if close else ""
        super().__init__(f"{device_id}: refused by the bridge: {code}: {detail}{ended}")
        self.code = code
        self.detail = detail
        self.close = close


def is_terminal(error: pb.Error, *, welcomed: bool) -> bool:
    """Whether a fatal ``error`` ends the client's attempts (``welcomed``: after a Welcome)."""
    if not error.fatal:
        return False
    codes = TERMINAL_CODES if welcomed else TERMINAL_HELLO_CODES
    if error.code not in codes:
        return False
    if error.code == pb.PROTOCOL_VIOLATION and error.message.startswith(HELLO_DEADLINE_PREFIX):
        return False
    return not (error.code == pb.UNAUTHENTICATED and SESSION_TAKEN_MARK in error.message)


def refusal(
    device_id: str, fatal: pb.Error | None, *, close: str, detail: str, fatal_seen: bool
) -> BridgeRefused | None:
    """The refusal that ends the attempts, if a connection that ended as ``close`` (with
    ``detail``) ended with one: its terminal Error ``fatal``, or, when no fatal Error came
    (``fatal_seen``), a terminal gRPC status."""
    if fatal is not None:
        return BridgeRefused(device_id, pb.ErrorCode.Name(fatal.code), fatal.message, close)
    status = close.removeprefix("grpc:")
    if not fatal_seen and close.startswith("grpc:") and status in TERMINAL_GRPC_STATUSES:
        return BridgeRefused(device_id, status, detail, close)
    return None


def refused_upgrade(device_id: str, exc: Exception) -> BridgeRefused | None:
    """A WebSocket upgrade answered with an HTTP status no retry will change."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in TERMINAL_HTTP_STATUSES:
        return BridgeRefused(device_id, f"HTTP {status}", str(exc), f"ws:http:{status}")
    return None
