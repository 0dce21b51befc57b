"""Sessions and streams (sans-I/O state): who is connected, what each stream has accepted and
what the visualization side has acknowledged.

A session outlives its connection so a device can resume: a Hello with the session's token (or
the same device id) reattaches to it and the Welcome tells the device, per stream, what the
bridge already holds (``accepted_seq``) and what was delivered (``delivered_seq``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from bridge.protocol.errors import ProtocolViolation
from bridge.server.ring import Policy, StreamRing

StreamKey = tuple[str, str]  # (device_id, stream_id)

KIND_POINT_CLOUD = 1
KIND_TELEMETRY = 2


@dataclass(frozen=True, slots=True)
class StreamConfig:
    kind: int
    voxel_size: float
    passthrough: bool
    policy: Policy
    max_points: int
    # Lane (protocol Priority: 1 control, 2 telemetry, 3 bulk): lower lanes are processed, and so
    # committed and sent, first. Within a lane streams take turns.
    lane: int = 3


@dataclass(eq=False)
class Stream:
    key: StreamKey
    config: StreamConfig
    ring: StreamRing
    accepted_seq: int = 0
    delivered_seq: int = 0
    conn_last_seq: int = 0  # highest seq seen on the current connection (regression check)
    upstream_gap_frames: int = 0
    layout_cache: object | None = None  # codec.CachedLayout: the layout last validated

    @property
    def stream_id(self) -> str:
        return self.key[1]

    @property
    def device_id(self) -> str:
        return self.key[0]


@dataclass(eq=False)
class Session:
    session_id: str
    device_id: str
    streams: dict[str, Stream] = field(default_factory=dict)
    attached: bool = False
    connection: object | None = None  # opaque handle owned by the ingest adapter
    dirty: set[str] = field(default_factory=set)  # stream ids whose ack state changed
    ack_urgent: bool = False  # a delivered_seq moved (or a duplicate needs its re-ack)
    detached_at: float = 0.0

    def reset_connection_state(self) -> None:
        for stream in self.streams.values():
            stream.conn_last_seq = 0
        self.dirty.update(self.streams)
        self.ack_urgent = True

    @property
    def buffered_frames(self) -> int:
        return sum(len(s.ring) for s in self.streams.values())


#: Where a load balancer hashes the device id (docs/protocol.md §1 "Routing key"): this header on
#: the WebSocket upgrade, gRPC metadata of the same name, or the WebSocket URL's query parameter.
ROUTING_HEADER = "x-simbridge-device"
ROUTING_QUERY = "device"


def routing_keys(transport: object) -> set[str]:
    """The device ids a connection was routed by (empty: none sent). Read from the transport's
    request: a WebSocket upgrade (``transport.ws.request``: its query and headers) or a gRPC
    call (``transport.context``: its metadata)."""
    keys: set[str] = set()
    request = getattr(getattr(transport, "ws", None), "request", None)
    if request is not None:
        query = urlsplit(str(request.path)).query
        keys.update(v for k, v in parse_qsl(query, keep_blank_values=True) if k == ROUTING_QUERY)
        keys.update(request.headers.get_all(ROUTING_HEADER))
    context = getattr(transport, "context", None)
    if context is not None:
        metadata = context.invocation_metadata() or ()
        keys.update(str(v) for k, v in metadata if k == ROUTING_HEADER)
    return keys


def check_routing(device_id: str, keys: set[str]) -> None:
    """A load balancer placed this connection by ``keys``: a Hello for another device would
    land its session on a replica the balancer never sends that device to."""
    wrong = sorted(k for k in keys if k != device_id)
    if wrong:
        raise ProtocolViolation(
            f"device id {device_id!r} differs from the routing key {wrong[0]!r} "
            f"({ROUTING_HEADER} header, ?{ROUTING_QUERY}= or gRPC metadata)"
        )
