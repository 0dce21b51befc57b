"""Exception hierarchy and the one table that maps each refusal to the wire (why: both transports
and the metrics read the same row, so a WebSocket edge and a gRPC edge are told the same thing).

    BridgeError
    ├── ProtocolError         bad input from a peer; reported to that peer only
    │   ├── MalformedMessage  not a valid message
    │   ├── ProtocolViolation e.g. Frame before Hello
    │   ├── UnknownStream     stream not declared in Hello
    │   ├── InvalidLayout     PointCloud layout is wrong
    │   ├── TooManyPoints     more points than allowed
    │   ├── FrameTooLarge     message above the max size
    │   │   └── FrameNeverFits  above what the memory budget can ever grant now (not fatal)
    │   ├── SeqRegression     seq going backwards
    │   ├── TooManyStreams    streams per session > limit
    │   ├── TooManySessions   sessions > limit
    │   ├── TooManyPending    too many connections still owe their Hello
    │   ├── HelloTimeout      no Hello within ``hello_timeout_seconds``
    │   ├── TelemetryTooLarge telemetry above its own byte / entry limits
    │   ├── ChunkSequence     a FrameChunk out of order, overlapping, oversize or inconsistent
    │   ├── ChunkAbandoned    a chunked frame left incomplete
    │   │   └── ChunksStalled  incomplete frames held too long without completing one (fatal)
    │   ├── CodecError        an encoded cloud that does not decode, or an unknown codec
    │   │   └── DecodeBudgetSpent  too much decode work refused on one connection (fatal)
    │   ├── BatchTooLarge     a FrameBatch above max_batch_frames or the telemetry bytes limit
    │   ├── Unauthenticated   missing/wrong bearer token
    │   └── SessionTaken      a Hello for a live device without that session's resume token
    ├── StartupError          a listener could not be bound
    └── ConfigError           invalid settings (all problems listed at once)

:data:`WIRE` gives, per ``reason``: the ``Error.code`` sent in the protobuf ``Error`` message, the
WebSocket close code and the gRPC status used when the error is fatal, and whether it is fatal
(non-fatal errors are reported with an ``Error`` message and the connection stays open).

``InvalidLayout`` and ``TooManyPoints`` also subclass ``ValueError``: the decimators raise them for
bad arrays and callers that only know NumPy catch ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.v1 import bridge_pb2 as pb


@dataclass(frozen=True, slots=True)
class WireError:
    code: int  # bridge.v1.ErrorCode, in the Error message
    ws_close: int  # WebSocket close code (fatal errors)
    grpc_status: str  # grpc.StatusCode member name (fatal errors); no grpc import in the core
    fatal: bool  # close the connection after reporting


_POLICY, _INVALID_DATA, _TOO_BIG, _TRY_LATER = 1008, 1007, 1009, 1013  # WebSocket close codes

WIRE: dict[str, WireError] = {
    "protocol": WireError(pb.ERROR_CODE_UNSPECIFIED, _POLICY, "INVALID_ARGUMENT", True),
    "malformed": WireError(pb.MALFORMED, _INVALID_DATA, "INVALID_ARGUMENT", True),
    "protocol_violation": WireError(pb.PROTOCOL_VIOLATION, _POLICY, "FAILED_PRECONDITION", True),
    "unknown_stream": WireError(pb.UNKNOWN_STREAM, _POLICY, "INVALID_ARGUMENT", False),
    "invalid_layout": WireError(pb.INVALID_LAYOUT, _POLICY, "INVALID_ARGUMENT", False),
    "too_many_points": WireError(pb.TOO_MANY_POINTS, _POLICY, "RESOURCE_EXHAUSTED", False),
    "too_large": WireError(pb.TOO_LARGE, _TOO_BIG, "RESOURCE_EXHAUSTED", True),
    "over_budget": WireError(pb.TOO_LARGE, _TOO_BIG, "RESOURCE_EXHAUSTED", False),
    "seq_regression": WireError(pb.SEQ_REGRESSION, _POLICY, "INVALID_ARGUMENT", False),
    "too_many_streams": WireError(pb.TOO_MANY_STREAMS, _POLICY, "RESOURCE_EXHAUSTED", True),
    "too_many_sessions": WireError(pb.TOO_MANY_SESSIONS, _POLICY, "RESOURCE_EXHAUSTED", True),
    "unauthenticated": WireError(pb.UNAUTHENTICATED, _POLICY, "UNAUTHENTICATED", True),
    "session_taken": WireError(pb.UNAUTHENTICATED, _POLICY, "UNAUTHENTICATED", True),
    "too_many_pending": WireError(pb.TOO_MANY_SESSIONS, _TRY_LATER, "RESOURCE_EXHAUSTED", True),
    "hello_timeout": WireError(pb.PROTOCOL_VIOLATION, _POLICY, "DEADLINE_EXCEEDED", True),
    "telemetry_too_large": WireError(pb.TOO_LARGE, _POLICY, "RESOURCE_EXHAUSTED", False),
    "chunk_sequence": WireError(pb.CHUNK_SEQUENCE, _POLICY, "INVALID_ARGUMENT", False),
    "chunk_too_large": WireError(pb.TOO_LARGE, _POLICY, "RESOURCE_EXHAUSTED", False),
    "chunk_abandoned": WireError(pb.CHUNK_ABANDONED, _POLICY, "INVALID_ARGUMENT", False),
    "chunks_stalled": WireError(pb.CHUNK_ABANDONED, _POLICY, "RESOURCE_EXHAUSTED", True),
    "codec_error": WireError(pb.CODEC_ERROR, _POLICY, "INVALID_ARGUMENT", False),
    "decode_budget": WireError(pb.CODEC_ERROR, _POLICY, "RESOURCE_EXHAUSTED", True),
    "batch_too_large": WireError(pb.TOO_LARGE, _TOO_BIG, "RESOURCE_EXHAUSTED", True),
}


class BridgeError(Exception):
    """Base of every error simbridge raises on purpose."""


class ProtocolError(BridgeError):
    """A peer sent something we refuse. ``reason`` is the metric label and the :data:`WIRE` key.
    ``frame`` (stream id and seq only) names the refused frame when the message was not parsed."""

    reason = "protocol"

    def __init__(self, message: str = "", *, frame: pb.Frame | None = None) -> None:
        super().__init__(message)
        self.frame = frame

    @property
    def wire(self) -> WireError:
        return WIRE[self.reason]

    @property
    def fatal(self) -> bool:
        """The connection is closed after reporting."""
        return self.wire.fatal


class MalformedMessage(ProtocolError):
    reason = "malformed"


class ProtocolViolation(ProtocolError):
    reason = "protocol_violation"


class UnknownStream(ProtocolError):
    reason = "unknown_stream"


class InvalidLayout(ProtocolError, ValueError):
    reason = "invalid_layout"


class TooManyPoints(ProtocolError, ValueError):
    reason = "too_many_points"


class FrameTooLarge(ProtocolError):
    reason = "too_large"


class FrameNeverFits(FrameTooLarge):
    """Within ``max_frame_bytes`` as configured, but above what the memory budget can ever
    grant now (the limit fell): the frame is refused with an Error, the connection stays."""

    reason = "over_budget"


class SeqRegression(ProtocolError):
    reason = "seq_regression"


class TooManyStreams(ProtocolError):
    reason = "too_many_streams"


class TooManySessions(ProtocolError):
    reason = "too_many_sessions"


class Unauthenticated(ProtocolError):
    reason = "unauthenticated"


class SessionTaken(ProtocolError):
    reason = "session_taken"


class TooManyPending(ProtocolError):
    reason = "too_many_pending"


class HelloTimeout(ProtocolError):
    reason = "hello_timeout"


class TelemetryTooLarge(ProtocolError):
    reason = "telemetry_too_large"


class ChunkSequence(ProtocolError):
    reason = "chunk_sequence"


class ChunkTooLarge(ProtocolError):
    reason = "chunk_too_large"


class ChunkAbandoned(ProtocolError):
    reason = "chunk_abandoned"


class ChunksStalled(ChunkAbandoned):
    """Fatal: the connection held incomplete chunked frames (charged memory) for
    ``chunk_stall_seconds`` without a piece completing a frame (docs/protocol.md §3.2)."""

    reason = "chunks_stalled"


class CodecError(ProtocolError):
    reason = "codec_error"


class DecodeBudgetSpent(CodecError):
    """The connection's refused decodes cost more than ``refused_decode_budget_bytes`` beyond
    what it decoded successfully: fatal, so one edge cannot keep the decoder busy for nothing."""

    reason = "decode_budget"


class BatchTooLarge(ProtocolError):
    """Fatal: the Welcome told the edge the batch limits (a batch is refused whole, so a
    non-fatal refusal could not say which of its frames were not taken)."""

    reason = "batch_too_large"


class StartupError(BridgeError):
    """The bridge could not start (a port in use, an address that cannot be bound): one line
    for the operator, exit status 2, no traceback."""


class ConfigError(BridgeError):
    """Invalid settings; ``problems`` lists every one found, not just the first."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems
