"""What every part of the relay benchmark shares: the matrix and size constants, the sink-side
scan of a ProcessedFrame (field numbers from the generated descriptors, via
:mod:`bridge.protocol.wire`), the per-connection accounting, the configuration and one cell's
result."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge.protocol.wire import WIRE_LEN, WIRE_VARINT, decode_varint, field_number, key_byte
from bridge.v1 import bridge_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

SIZES: dict[str, int] = {"1KB": 1024, "100KB": 100 * 1024, "1.2MB": 1_200_000}
"""Point-cloud payload bytes per message (1.2 MB = 100 k xyz float32 points)."""
CONNS = (1, 32)
TARGETS = ("raw-ws", "bridge-ws", "bridgeB-ws", "raw-grpc", "bridge-grpc", "bridgeB-grpc")
"""``bridgeB-*``: the bridge with ``--batch`` frames per FrameBatch message (small sizes only)."""
BATCH_MAX_BYTES = 256 * 1024  # batched cells run where ``batch`` frames fit in this
QUICK_SIZES = ("1KB", "1.2MB")
QUICK_CONNS = (1,)

MAX_FRAME_BYTES = 4 * MiB
"""--max-frame-bytes for the bridge and every size cap on both sides (above 1.2 MB + framing)."""
RAW_HEADER = struct.Struct("<qII")
"""Raw relay messages start with: send time_ns, connection token, sequence number."""
ACK_EVERY = 16
ACK_IDLE_SECONDS = 0.002
DRAIN_TIMEOUT = 20.0
SINK_PUSH_METHOD = "/bridge.v1.VisualizationSink/Push"
INGEST_METHOD = "/bridge.v1.Ingest/Connect"
# First byte of a BridgeMessage by its oneof (key of a length-delimited field, from the
# descriptors): clients look into Error, Drain and FlowControl only; Acks, the bulk of the replies,
# are discarded unparsed.
_BRIDGE_MESSAGE = pb.BridgeMessage.DESCRIPTOR
_FLOW_TAG, _ERROR_TAG, _DRAIN_TAG = (
    key_byte(_BRIDGE_MESSAGE, name) for name in ("flow_control", "error", "drain")
)
_PROCESSED = pb.ProcessedFrame.DESCRIPTOR
_PF_SEQ, _PF_CAPTURE, _PF_BRIDGE_SEQ, _PF_DEVICE = (
    field_number(_PROCESSED, name) for name in ("seq", "capture_time_ns", "bridge_seq", "device_id")
)


def scan_processed(buf: bytes, i: int = 0, n: int = -1) -> tuple[bytes, int, int, int]:
    """(device_id, seq, capture_time_ns, bridge_seq) of a serialized ProcessedFrame.

    Walks the top-level fields only, so the cloud is skipped, not copied (``FromString`` would copy
    1.2 MB per frame in the sink, i.e. in the load process, and blur the comparison).
    """
    device, seq, capture, bridge_seq = b"", 0, 0, 0
    if n < 0:
        n = len(buf)
    while i < n:
        key, i = decode_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == WIRE_VARINT:
            value, i = decode_varint(buf, i)
            if number == _PF_SEQ:
                seq = value
            elif number == _PF_CAPTURE:
                capture = value
            elif number == _PF_BRIDGE_SEQ:
                bridge_seq = value
        elif wire == WIRE_LEN:
            length, i = decode_varint(buf, i)
            if number == _PF_DEVICE:
                device = buf[i : i + length]
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return device, seq, capture, bridge_seq


# -- accounting ------------------------------------------------------------------------------


class Conn:
    """Per-connection accounting shared by its client (sends) and the sink (arrivals)."""

    def __init__(self, index: int, window: int) -> None:
        self.index = index
        self.window = asyncio.Semaphore(window)
        self.sent = 0
        self.completed = 0
        self.next_seq = 1  # the seq the sink expects next from this connection
        self.errors: list[str] = []
        self.backpressure = 0  # FlowControl PAUSE seen (bridge targets)
        self.replies = 0  # bridge messages after the Welcome: acks, flow control (bridge targets)

    def arrive(self, seq: int) -> None:
        if seq != self.next_seq:
            self.errors.append(f"conn {self.index}: seq {seq} arrived, expected {self.next_seq}")
        self.next_seq = seq + 1
        self.completed += 1
        self.window.release()


class Cell:
    """One (target, size, conns) measurement: the sink routes arrivals here by connection key."""

    def __init__(self, number: int, conns: int, window: int) -> None:
        self.number = number
        self.conns = [Conn(i, window) for i in range(conns)]
        self.by_key: dict[bytes | int, Conn] = {}
        self.arrivals: list[int] = []
        self.latencies: list[int] = []
        self.sink_received = 0  # every message the sink saw during this cell, routed or not
        self.stray = 0

    def device_id(self, i: int) -> str:
        return f"bench-{self.number}-{i}"

    def token(self, i: int) -> int:
        return (self.number << 16) | i

    def register(self) -> None:
        for conn in self.conns:
            self.by_key[self.device_id(conn.index).encode()] = conn
            self.by_key[self.token(conn.index)] = conn

    def arrive(self, key: bytes | int, seq: int, sent_ns: int, now_ns: int) -> None:
        self.sink_received += 1
        conn = self.by_key.get(key)
        if conn is None:
            self.stray += 1
            return
        self.arrivals.append(now_ns)
        self.latencies.append(now_ns - sent_ns)
        conn.arrive(seq)

    @property
    def sent(self) -> int:
        return sum(c.sent for c in self.conns)

    @property
    def completed(self) -> int:
        return sum(c.completed for c in self.conns)


# -- configuration and results ---------------------------------------------------------------


@dataclass
class BenchConfig:
    sizes: Sequence[str] = tuple(SIZES)
    conns: Sequence[int] = CONNS
    targets: Sequence[str] = TARGETS
    seconds: float = 3.0
    warmup: float = 1.0
    window: int = 8
    batch: int = 16  # frames per message in the bridgeB-* cells
    bridge_args: Sequence[str] = ()  # extra ``simbridge serve`` flags (to try a setting)
    bridge_procs: int = 1  # >1: that many bridge processes share the ports (SO_REUSEPORT)


@dataclass
class CellResult:
    target: str
    size: str
    wire_bytes: int
    conns: int
    window: int
    seconds: float
    msgs_per_s: float  # median of per-slice rates over the measured window
    mean_msgs_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    relay_cpu_pct: float
    relay_us_per_msg: float  # relay CPU per message: its cost, whatever else limits the rate
    bench_cpu_pct: float
    other_cpu_pct: float  # the rest of the machine (other processes, steal): noise to judge by
    sent: int
    completed: int
    sink_received: int
    backpressure_pauses: int
    errors: list[str] = field(default_factory=list)
    ratio: float | None = None  # bridge rows: this msgs/s / the raw relay's, same transport
    #: bridge rows: messages the bridge sent its edges (acks, flow control) per frame sent;
    #: each costs the bridge a write, which the raw relay never makes
    replies_per_frame: float | None = None
