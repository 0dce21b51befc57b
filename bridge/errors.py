"""Exception hierarchy (why: one place maps every failure to a wire error and a metric reason).

    BridgeError
    ├── ProtocolError         bad input from a peer; reported to that peer only
    │   ├── MalformedMessage  not a valid message           (WS close 1007, INVALID_ARGUMENT)
    │   ├── ProtocolViolation e.g. Frame before Hello       (WS close 1008, FAILED_PRECONDITION)
    │   ├── UnknownStream     stream not declared in Hello  (Error msg, INVALID_ARGUMENT)
    │   ├── InvalidLayout     PointCloud layout is wrong    (Error msg, INVALID_ARGUMENT)
    │   ├── TooManyPoints     more points than allowed      (Error msg, RESOURCE_EXHAUSTED)
    │   ├── FrameTooLarge     message above the max size    (WS close 1009, RESOURCE_EXHAUSTED)
    │   │   └── FrameNeverFits  above what the memory budget allows now (Error msg, too_large)
    │   ├── SeqRegression     seq going backwards           (Error msg, INVALID_ARGUMENT)
    │   ├── TooManyStreams    streams per session > limit   (WS close 1008, RESOURCE_EXHAUSTED)
    │   ├── TooManySessions   sessions > limit              (WS close 1008, RESOURCE_EXHAUSTED)
    │   └── Unauthenticated   missing/wrong bearer token    (WS close 1008, UNAUTHENTICATED)
    └── ConfigError           invalid settings (all problems listed at once)

``InvalidLayout`` and ``TooManyPoints`` also subclass ``ValueError``: the decimators raise them for
bad arrays and callers that only know NumPy catch ``ValueError``.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error simbridge raises on purpose."""


class ProtocolError(BridgeError):
    """A peer sent something we refuse. ``reason`` is the metric label and wire error name."""

    reason = "protocol"
    fatal = True  # the connection is closed after reporting


class MalformedMessage(ProtocolError):
    reason = "malformed"


class ProtocolViolation(ProtocolError):
    reason = "protocol_violation"


class UnknownStream(ProtocolError):
    reason = "unknown_stream"
    fatal = False


class InvalidLayout(ProtocolError, ValueError):
    reason = "invalid_layout"
    fatal = False


class TooManyPoints(ProtocolError, ValueError):
    reason = "too_many_points"
    fatal = False


class FrameTooLarge(ProtocolError):
    reason = "too_large"


class FrameNeverFits(FrameTooLarge):
    """Within ``max_frame_bytes`` as configured, but above what the memory budget can ever
    grant now (the limit fell): the frame is refused with an Error, the connection stays."""

    fatal = False


class SeqRegression(ProtocolError):
    reason = "seq_regression"
    fatal = False


class TooManyStreams(ProtocolError):
    reason = "too_many_streams"


class TooManySessions(ProtocolError):
    reason = "too_many_sessions"


class Unauthenticated(ProtocolError):
    reason = "unauthenticated"


class ConfigError(BridgeError):
    """Invalid settings; ``problems`` lists every one found, not just the first."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems
