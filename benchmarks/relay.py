"""Bridge relay vs the raw transport (``make bench-relay`` = ``python -m benchmarks.relay``).

What it answers: how much throughput and latency the bridge's passthrough path costs compared with
the least any relay must do, measured side by side in one run on the same machine
(docs/design.md §6).
Target: bridge/raw msgs/s >= 0.6 at 1.2 MB.

Targets (each relay is its own process; load clients and the sink share this one):

- ``raw-ws`` / ``raw-grpc``: :mod:`benchmarks._relay_servers`, a relay that forwards each received
  WebSocket / gRPC message's bytes over one ``grpc.aio`` stream to the sink. No protocol, no acks.
  The clients send opaque messages of the same wire size as the bridge's, with the send time, the
  connection and the sequence number in the first 16 bytes.
- ``bridge-ws`` / ``bridge-grpc``: ``python -m bridge.cli serve --passthrough --no-adapt`` pushing
  to the sink. The clients speak the real protocol (Hello/Welcome, Frames with a point cloud of
  ``size`` bytes of xyz float32, reading and discarding every Ack/FlowControl); the sink speaks
  the real sink protocol (watermark SinkAck first, then cumulative acks every 16 frames or after
  2 ms without any) and takes the edge's timestamp from ``capture_time_ns``.

Load model: closed loop. Each connection keeps at most ``--window`` messages sent but not yet
arrived at the sink; a sink arrival releases the next send. So msgs/s is the relay's capacity at
that concurrency, and latency (send → arrival at the sink, both stamped with ``time.time_ns()``)
includes the queueing that the window allows: by Little's law p50 ≈ conns * window / rate once the
relay is the bottleneck. Compare latencies between targets of the same cell, not across cells.

Process layout (2-core machines): the relay runs alone; the clients and the sink share this process
and event loop. That keeps the closed loop exact (a sink arrival releases the window directly, no
cross-process signal) and gives raw and bridge the same client and sink costs. With 2 cores a
third process for the sink would only oversubscribe the CPUs.

CPU columns (% of one core over the measured window, from /proc): ``relay`` is the relay or bridge
process, ``us/msg`` its CPU time per message (its cost, which stays meaningful when something else
limits the rate), ``bench`` this process, ``other`` the rest of the machine. When the relay is near
100 % it is the bottleneck and the ratio is the relay's; when ``bench`` is, the load side limits
and a raw rate is only a lower bound (the footer says so); a large ``other`` means the machine was
busy and the row is noise. The environment passes through to every process: glibc's malloc
settings (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) change the 1.2 MB results a lot,
so the header and the JSON record them.

Each cell runs ``--warmup`` seconds (first touch of memory is slow here; docs/design.md §6), then
``--seconds``; msgs/s is the median of the per-slice rates over the measured window (robust to a
GC pause or a page-fault storm), MB/s follows from the wire size. Every cell ends with an exact
accounting: the clients stop, every message sent must arrive at the sink exactly once and in order
per connection, else the cell lists errors (and the process exits 1).

The cells run interleaved (for each size and concurrency: every target), all relays staying up
the whole run, so slow drift of the machine hits all targets alike. Ratios are bridge/raw msgs/s
for the same transport, size and concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks._relay_servers import RAW_SINK_METHOD, RELAY_INGEST_METHOD, grpc_options
from bridge.v1 import bridge_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20

SIZES: dict[str, int] = {"1KB": 1024, "100KB": 100 * 1024, "1.2MB": 1_200_000}
"""Point-cloud payload bytes per message (1.2 MB = 100 k xyz float32 points)."""
CONNS = (1, 32)
TARGETS = ("raw-ws", "bridge-ws", "raw-grpc", "bridge-grpc")
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
# First byte of a BridgeMessage by its oneof (field << 3 | length-delimited): clients look into
# Error, Drain and FlowControl only; Acks, the bulk of the replies, are discarded unparsed.
_FLOW_TAG, _ERROR_TAG, _DRAIN_TAG = 0x1A, 0x22, 0x2A


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """Protobuf base-128 varint at ``buf[i]``: (value, index after it)."""
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    result, shift = b & 0x7F, 7
    while True:
        i += 1
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i + 1
        shift += 7


def scan_processed(buf: bytes) -> tuple[bytes, int, int, int]:
    """(device_id, seq, capture_time_ns, bridge_seq) of a serialized ProcessedFrame.

    Walks the top-level fields only, so the cloud is skipped, not copied (``FromString`` would copy
    1.2 MB per frame in the sink, i.e. in the load process, and blur the comparison).
    """
    device, seq, capture, bridge_seq = b"", 0, 0, 0
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            if number == 2:
                seq = value
            elif number == 4:
                capture = value
            elif number == 11:
                bridge_seq = value
        elif wire == 2:
            length, i = _varint(buf, i)
            if number == 3:
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


# -- the sink --------------------------------------------------------------------------------


class BenchSink:
    """The visualization sink every target pushes to, in this process.

    Two methods on one gRPC server: the bridge's ``VisualizationSink/Push`` (watermark ack first,
    then cumulative acks; the bridge holds every frame until acked) and the raw relays' protocol-
    free ``RawSink/Push``. Both stamp the arrival time before anything else and hand the message
    to the current :class:`Cell`. Requests stay raw bytes: no protobuf copy of the payload.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self.cell: Cell | None = None
        self.stray = 0  # arrivals outside any cell (should stay 0)
        self.bridge_streams = 0
        self.raw_streams = 0
        self.acks_sent = 0
        self._server: Any = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reserve_port(self) -> int:
        """Pick the port before listening, so the relays can be started first."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        return self.port

    async def start(self) -> int:
        server = grpc.aio.server(options=grpc_options(self.max_bytes + 64 * 1024))
        for path, handler in (
            (SINK_PUSH_METHOD, grpc.stream_stream_rpc_method_handler(self._bridge_push)),
            (RAW_SINK_METHOD, grpc.stream_unary_rpc_method_handler(self._raw_push)),
        ):
            service, method = path.strip("/").split("/")
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {method: handler}),)
            )
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if not self.port:
            raise OSError("the sink cannot bind its port")
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
            self._server = None

    def _arrive(self, key: bytes | int, seq: int, sent_ns: int, now_ns: int) -> None:
        cell = self.cell
        if cell is None:
            self.stray += 1
        else:
            cell.arrive(key, seq, sent_ns, now_ns)

    async def _raw_push(self, requests: Any, _context: Any) -> bytes:
        self.raw_streams += 1
        unpack = RAW_HEADER.unpack_from
        clock = time.time_ns
        async for raw in requests:
            now = clock()
            sent_ns, token, seq = unpack(raw)
            self._arrive(token, seq, sent_ns, now)
        return b""

    async def _bridge_push(self, requests: Any, context: Any) -> None:
        self.bridge_streams += 1
        high = 0
        unacked = 0
        wake = asyncio.Event()
        ended = False

        async def reader() -> None:
            nonlocal high, unacked, ended
            clock = time.time_ns
            try:
                async for raw in requests:
                    now = clock()
                    device, seq, capture_ns, bridge_seq = scan_processed(raw)
                    self._arrive(device, seq, capture_ns, now)
                    high = max(high, bridge_seq)
                    unacked += 1
                    if unacked >= ACK_EVERY:
                        wake.set()
            finally:
                ended = True
                wake.set()

        task = asyncio.create_task(reader(), name="bench-sink-reader")
        try:
            # The bridge sends nothing before the watermark ack; this sink holds nothing.
            await context.write(pb.SinkAck(bridge_seq=0).SerializeToString())
            acked = 0
            while not ended:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ACK_IDLE_SECONDS):
                        await wake.wait()
                wake.clear()
                if high > acked:
                    acked, unacked = high, 0
                    await context.write(pb.SinkAck(bridge_seq=acked).SerializeToString())
                    self.acks_sent += 1
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# -- load clients ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    """What one message carries at one size: the cloud bytes (bridge) and an opaque body of the
    same total wire size (raw), so both targets move the same number of bytes per message."""

    name: str
    cloud: bytes
    raw_body: bytes
    wire_bytes: int

    @classmethod
    def build(cls, name: str, size: int) -> Payload:
        points = np.random.default_rng(size).uniform(-50, 50, (size // 12, 3)).astype("<f4")
        cloud = points.tobytes()
        wire = len(bridge_encoder(cloud)(1, time.time_ns()))
        return cls(name, cloud, os.urandom(wire - RAW_HEADER.size), wire)


def raw_encoder(token: int, body: bytes) -> Callable[[int, int], bytes]:
    """Header + body: one copy of the payload per message."""
    pack = RAW_HEADER.pack

    def encode(seq: int, now_ns: int) -> bytes:
        return pack(now_ns, token, seq) + body

    return encode


def bridge_encoder(cloud: bytes) -> Callable[[int, int], bytes]:
    """One EdgeMessage per connection, mutated per send: a serialization is one payload copy,
    the same single copy the raw clients pay to stamp their header."""
    fields = [
        pb.PackedField(name=name, offset=4 * i, type=pb.FLOAT32) for i, name in enumerate("xyz")
    ]
    msg = pb.EdgeMessage(
        frame=pb.Frame(
            stream_id="cloud", point_cloud=pb.PointCloud(point_stride=12, fields=fields, data=cloud)
        )
    )
    frame = msg.frame

    def encode(seq: int, now_ns: int) -> bytes:
        frame.seq = seq
        frame.capture_time_ns = now_ns
        return msg.SerializeToString()

    return encode


class Client:
    """One edge connection: closed-loop sends (``window`` in flight), discards what comes back.

    ``bridge``: speak the bridge protocol (Hello/Welcome, Frames, read every reply) rather than
    sending opaque bytes to a raw relay.
    """

    yield_after_send = False

    def __init__(self, cell: Cell, conn: Conn, payload: Payload, *, bridge: bool) -> None:
        self.cell = cell
        self.conn = conn
        self.bridge = bridge
        self.encode = (
            bridge_encoder(payload.cloud)
            if bridge
            else raw_encoder(cell.token(conn.index), payload.raw_body)
        )
        self._reader: asyncio.Task[None] | None = None

    async def open(self, address: str) -> None:
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def hello(self) -> bytes:
        spec = pb.StreamSpec(stream_id="cloud", kind=pb.POINT_CLOUD, passthrough=True)
        hello = pb.Hello(device_id=self.cell.device_id(self.conn.index), streams=[spec])
        return pb.EdgeMessage(hello=hello).SerializeToString()

    @staticmethod
    def check_welcome(raw: object) -> None:
        if not isinstance(raw, bytes):
            raise ConnectionError(f"expected a Welcome, got {raw!r:.80}")
        msg = pb.BridgeMessage.FromString(raw)
        if msg.WhichOneof("kind") != "welcome":
            raise ConnectionError(f"expected a Welcome, got {msg}")

    def on_bridge_message(self, raw: bytes) -> None:
        """Acks are discarded unparsed; errors and drains fail the cell; pauses are counted."""
        tag = raw[0] if raw else 0
        if tag in (_ERROR_TAG, _DRAIN_TAG):
            msg = pb.BridgeMessage.FromString(raw)
            self.conn.errors.append(f"conn {self.conn.index}: bridge sent {msg}".strip())
        elif tag == _FLOW_TAG:
            msg = pb.BridgeMessage.FromString(raw)
            if msg.flow_control.action == pb.FlowControl.PAUSE:
                self.conn.backpressure += 1

    async def send_loop(self, stop: asyncio.Event) -> None:
        conn = self.conn
        window = conn.window
        encode, write = self.encode, self.write
        yield_after_send = self.yield_after_send
        clock = time.time_ns
        seq = 0
        try:
            while True:
                await window.acquire()
                if stop.is_set():
                    window.release()
                    return
                seq += 1
                conn.sent += 1  # counted before the await: the sink may see it before we resume
                await write(encode(seq, clock()))
                if yield_after_send:
                    await asyncio.sleep(0)
        except (ConnectionClosed, grpc.aio.AioRpcError, ConnectionError) as exc:
            conn.errors.append(f"conn {conn.index}: send failed: {type(exc).__name__}: {exc}")


class WsClient(Client):
    # ``await ws.send()`` does not yield while the socket takes data (docs/design.md §6): without an
    # explicit yield, 32 "concurrent" connections would take turns.
    yield_after_send = True
    ws: ClientConnection

    async def open(self, address: str) -> None:
        path = "/v1/ingest" if self.bridge else "/relay"
        self.ws = await connect(
            f"ws://{address}{path}",
            compression=None,  # permessage-deflate would dominate (docs/design.md §2)
            max_size=MAX_FRAME_BYTES + 64 * 1024,
            ping_interval=None,
        )
        if self.bridge:
            await self.ws.send(self.hello())
            self.check_welcome(await asyncio.wait_for(self.ws.recv(), 10))
            self._reader = asyncio.create_task(self._read(), name="bench-ws-reader")

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                if isinstance(raw, bytes):
                    self.on_bridge_message(raw)

    async def write(self, data: bytes) -> None:
        await self.ws.send(data)

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 5)


class GrpcClient(Client):
    channel: grpc.aio.Channel
    call: Any

    async def open(self, address: str) -> None:
        # A private subchannel pool gives each client its own TCP connection, like the
        # WebSocket clients (channels with equal arguments otherwise share one connection).
        options: list[tuple[str, Any]] = [
            *grpc_options(MAX_FRAME_BYTES + 64 * 1024),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self.channel = grpc.aio.insecure_channel(address, options=options)
        if not self.bridge:
            method = self.channel.stream_unary(
                RELAY_INGEST_METHOD, request_serializer=None, response_deserializer=None
            )
            self.call = method(wait_for_ready=True)
            return
        connect_method = self.channel.stream_stream(
            INGEST_METHOD, request_serializer=None, response_deserializer=None
        )
        self.call = connect_method(wait_for_ready=True)
        await self.call.write(self.hello())
        self.check_welcome(await asyncio.wait_for(self.call.read(), 10))
        self._reader = asyncio.create_task(self._read(), name="bench-grpc-reader")

    async def _read(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while (raw := await self.call.read()) is not grpc.aio.EOF:
                self.on_bridge_message(raw)

    async def write(self, data: bytes) -> None:
        await self.call.write(data)

    async def close(self) -> None:
        try:
            await self.call.done_writing()
            # The raw relay answers once; the bridge ends the call after our half-close.
            await asyncio.wait_for(self._reader if self._reader is not None else self.call, 5)
        finally:
            self.call.cancel()
            await self.channel.close()


# -- relay processes -------------------------------------------------------------------------


class ServerProcess:
    """A relay or the bridge as a child process, with its CPU time readable from /proc."""

    def __init__(self, name: str, cmd: list[str], ready_prefix: str) -> None:
        self.name = name
        self.cmd = cmd
        self.ready_prefix = ready_prefix
        self.ports: dict[str, int] = {}
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    async def spawn(self) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        env = {**os.environ, "BRIDGE_ADAPT": "false"}
        self.proc = await asyncio.create_subprocess_exec(
            *self.cmd, stdout=asyncio.subprocess.PIPE, stderr=self._log, cwd=ROOT, env=env
        )

    async def wait_ready(self) -> None:
        """Read the one ready line (``NAME_READY key=port ...``) and keep its ports."""
        assert self.proc is not None and self.proc.stdout is not None
        try:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 60)).decode()
        except TimeoutError:
            line = ""
        if not line.startswith(self.ready_prefix):
            raise RuntimeError(f"{self.name} did not start: {line!r}\n{self.logs()}")
        self.ports = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}

    def logs(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def cpu_seconds(self) -> float:
        """User + system CPU of the process (all threads), from /proc/PID/stat."""
        assert self.proc is not None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return float("nan")
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def bridge_process(sink: str, extra: Sequence[str] = ()) -> ServerProcess:
    cmd = [
        *(sys.executable, "-m", "bridge.cli", "serve", "--host", "127.0.0.1"),
        *("--ws-port", "0", "--grpc-port", "0", "--http-port", "0"),
        *("--passthrough", "--no-adapt", "--sink-address", sink),
        *("--max-frame-bytes", str(MAX_FRAME_BYTES)),
        # Each cell connects new devices; their detached sessions would otherwise keep a share of
        # the ring budget for 5 minutes and shrink the rings of later cells.
        *("--session-ttl-seconds", "1", "--log-level", "WARNING"),
        *extra,
    ]
    return ServerProcess("bridge", cmd, "SIMBRIDGE_READY")


def raw_relay_process(kind: str, sink: str) -> ServerProcess:
    cmd = [sys.executable, "-m", "benchmarks._relay_servers", kind, "--sink", sink]
    cmd += ["--max-bytes", str(MAX_FRAME_BYTES + 64 * 1024)]
    return ServerProcess(f"raw-{kind}", cmd, "RELAY_READY")


# -- cells -----------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    sizes: Sequence[str] = tuple(SIZES)
    conns: Sequence[int] = CONNS
    targets: Sequence[str] = TARGETS
    seconds: float = 3.0
    warmup: float = 1.0
    window: int = 8
    bridge_args: Sequence[str] = ()  # extra ``simbridge serve`` flags (to try a setting)


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


def _slice_rates(arrivals: np.ndarray, t0: int, t1: int) -> np.ndarray:
    slices = max(1, min(8, round((t1 - t0) / 0.25e9)))
    counts, _ = np.histogram(arrivals, bins=slices, range=(t0, t1))
    return counts / ((t1 - t0) / 1e9 / slices)


class Bench:
    """Owns the sink and the relay processes for one run; runs cells against them."""

    def __init__(self, config: BenchConfig, progress: Callable[[CellResult], None] | None = None):
        self.config = config
        self.progress = progress or (lambda _result: None)
        self.sink = BenchSink()
        self.servers: dict[str, ServerProcess] = {}
        self._cells = 0
        self._stray_seen = 0

    async def __aenter__(self) -> Bench:
        # Children are forked before this process starts any gRPC thread (the sink), which gRPC's
        # fork handlers would otherwise complain about; they find the sink once it listens.
        self.sink.reserve_port()
        wanted = {t.split("-")[0] if t.startswith("bridge") else t for t in self.config.targets}
        makers = {
            "bridge": lambda: bridge_process(self.sink.address, self.config.bridge_args),
            "raw-ws": lambda: raw_relay_process("ws", self.sink.address),
            "raw-grpc": lambda: raw_relay_process("grpc", self.sink.address),
        }
        self.servers = {name: makers[name]() for name in sorted(wanted)}
        try:
            for server in self.servers.values():
                await server.spawn()
            await self.sink.start()
            await asyncio.gather(*(s.wait_ready() for s in self.servers.values()))
            await self._wait_for_sink_streams()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers.values()), return_exceptions=True)
        await self.sink.stop()

    async def _wait_for_sink_streams(self) -> None:
        """Every relay's (and the bridge's) stream to the sink is up before the first cell."""
        need_bridge = "bridge" in self.servers
        need_raw = sum(name.startswith("raw") for name in self.servers)
        deadline = time.monotonic() + 30
        while (self.sink.bridge_streams < need_bridge) or (self.sink.raw_streams < need_raw):
            if time.monotonic() > deadline:
                raise RuntimeError("relays did not connect to the sink within 30 s")
            await asyncio.sleep(0.02)

    def _address(self, target: str) -> tuple[ServerProcess, str]:
        if target.startswith("bridge"):
            server = self.servers["bridge"]
            port = server.ports["ws" if target.endswith("ws") else "grpc"]
        else:
            server = self.servers[target]
            port = server.ports["port"]
        return server, f"127.0.0.1:{port}"

    async def run_all(self) -> list[CellResult]:
        """Every cell, interleaved by (size, conns); raw before bridge so each bridge row knows
        its ratio as soon as it is measured."""
        results: list[CellResult] = []
        payloads = {name: Payload.build(name, SIZES[name]) for name in self.config.sizes}
        targets = [t for t in TARGETS if t in self.config.targets]
        for size in self.config.sizes:
            for conns in self.config.conns:
                for target in targets:
                    result = await self.run_cell(target, payloads[size], conns)
                    results.append(result)
                    attach_ratios(results)
                    self.progress(result)
        return results

    async def run_cell(self, target: str, payload: Payload, conns: int) -> CellResult:
        cfg = self.config
        self._cells += 1
        cell = Cell(self._cells, conns, cfg.window)
        cell.register()
        server, address = self._address(target)
        kind = WsClient if target.endswith("ws") else GrpcClient
        clients = [kind(cell, c, payload, bridge=target.startswith("bridge")) for c in cell.conns]
        errors: list[str] = []
        if self.sink.stray > self._stray_seen:
            errors.append(f"{self.sink.stray - self._stray_seen} messages arrived between cells")
            self._stray_seen = self.sink.stray
        self.sink.cell = cell
        stop = asyncio.Event()
        senders: list[asyncio.Task[None]] = []
        t0 = t1 = 0
        cpu: dict[str, float] = {}
        try:
            await asyncio.gather(*(c.open(address) for c in clients))
            senders = [asyncio.create_task(c.send_loop(stop)) for c in clients]
            await asyncio.sleep(cfg.warmup)
            before, t0 = _cpu_seconds(server), time.time_ns()
            await asyncio.sleep(cfg.seconds)
            after, t1 = _cpu_seconds(server), time.time_ns()
            cpu = {k: 100 * (after[k] - before[k]) / ((t1 - t0) / 1e9) for k in before}
            stop.set()
            errors += await self._drain(cell, senders)
        except Exception as exc:  # a failed cell is reported, the run goes on
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            stop.set()
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            closed = await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
            errors += [f"close: {type(e).__name__}: {e}" for e in closed if e is not None]
            await asyncio.sleep(0.05)  # anything still arriving is counted as stray
            self.sink.cell = None
        for conn in cell.conns:
            errors += conn.errors
        if cell.stray:
            errors.append(f"{cell.stray} arrivals from unknown connections")
        return summarize(target, payload, cell, cfg, t0, t1, cpu, errors)

    async def _drain(self, cell: Cell, senders: list[asyncio.Task[None]]) -> list[str]:
        """After stop: every sent message must reach the sink (closed loop: the senders return
        once their in-flight messages arrive)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while cell.completed < cell.sent or not all(t.done() for t in senders):
            if time.monotonic() > deadline:
                return [f"{cell.sent - cell.completed} of {cell.sent} messages never arrived"]
            await asyncio.sleep(0.01)
        return []


def _cpu_seconds(server: ServerProcess) -> dict[str, float]:
    """CPU seconds so far of the relay, of this process and of everything else on the machine
    (busy time from /proc/stat, steal included, minus the two)."""
    times = os.times()
    own = times.user + times.system
    relay = server.cpu_seconds()
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    return {"relay": relay, "own": own, "other": busy - relay - own}


def summarize(
    target: str,
    payload: Payload,
    cell: Cell,
    cfg: BenchConfig,
    t0: int,
    t1: int,
    cpu: dict[str, float],
    errors: list[str],
) -> CellResult:
    arrivals = np.asarray(cell.arrivals, dtype=np.int64)
    latencies = np.asarray(cell.latencies, dtype=np.int64)
    nan = float("nan")
    rate = mean = p50 = p99 = nan
    if t1 > t0:
        inside = (arrivals >= t0) & (arrivals < t1)
        rate = float(np.median(_slice_rates(arrivals[inside], t0, t1)))
        mean = int(inside.sum()) / ((t1 - t0) / 1e9)
        if inside.any():
            p50, p99 = (float(v) / 1e6 for v in np.percentile(latencies[inside], [50, 99]))
    return CellResult(
        target=target,
        size=payload.name,
        wire_bytes=payload.wire_bytes,
        conns=len(cell.conns),
        window=cfg.window,
        seconds=cfg.seconds,
        msgs_per_s=rate,
        mean_msgs_per_s=mean,
        mb_per_s=rate * payload.wire_bytes / 1e6,
        p50_ms=p50,
        p99_ms=p99,
        relay_cpu_pct=cpu.get("relay", nan),
        relay_us_per_msg=cpu.get("relay", nan) * 1e4 / mean if mean > 0 else nan,
        bench_cpu_pct=cpu.get("own", nan),
        other_cpu_pct=_non_negative(cpu.get("other", nan)),
        sent=cell.sent,
        completed=cell.completed,
        sink_received=cell.sink_received,
        backpressure_pauses=sum(c.backpressure for c in cell.conns),
        errors=errors,
    )


def _non_negative(value: float) -> float:
    """Clamp rounding noise below zero; keep NaN (unknown) as NaN."""
    return value if math.isnan(value) else max(0.0, value)


def attach_ratios(results: list[CellResult]) -> None:
    raw = {(r.target.split("-")[1], r.size, r.conns): r for r in results if r.target[:3] == "raw"}
    for r in results:
        if r.target.startswith("bridge"):
            base = raw.get((r.target.split("-")[1], r.size, r.conns))
            if base is not None and base.msgs_per_s > 0:
                r.ratio = r.msgs_per_s / base.msgs_per_s


# -- output ----------------------------------------------------------------------------------

HEADER = (
    f"{'size':<6} {'conns':>5}  {'target':<12} {'msgs/s':>8} {'MB/s':>7} {'p50 ms':>8} "
    f"{'p99 ms':>8} {'relay':>6} {'us/msg':>7} {'bench':>6} {'other':>6} {'bridge/raw':>10}"
)


def format_row(r: CellResult) -> str:
    ratio = f"{r.ratio:10.2f}" if r.ratio is not None else ""
    line = (
        f"{r.size:<6} {r.conns:>5}  {r.target:<12} {r.msgs_per_s:8.1f} {r.mb_per_s:7.1f} "
        f"{r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.relay_cpu_pct:5.0f}% {r.relay_us_per_msg:7.0f} "
        f"{r.bench_cpu_pct:5.0f}% {r.other_cpu_pct:5.0f}% {ratio}"
    ).rstrip()
    if r.errors:
        line += f"  ERRORS: {len(r.errors)} (first: {r.errors[0]})"
    return line


def report_header(cfg: BenchConfig) -> str:
    return "\n".join(
        [
            "simbridge relay benchmark: bridge --passthrough vs raw relays, same machine, same run",
            f"closed loop, window {cfg.window} msgs/conn; {cfg.warmup:g} s warm-up + "
            f"{cfg.seconds:g} s per cell; msgs/s = median of slice rates; "
            "latency = client send -> sink arrival",
            "CPU in % of one core: relay = the relay/bridge process (us/msg: its CPU time per "
            "message), bench = clients + sink, other = the rest of the machine",
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"grpcio {grpc.__version__}, malloc env: "
            f"{' '.join(f'{k}={v}' for k, v in _malloc_env().items()) or 'default'}",
            "",
            HEADER,
        ]
    )


SATURATED = 95.0
BUSY_MACHINE = 25.0


def _malloc_env() -> dict[str, str]:
    """glibc malloc settings passed to every process: they change the 1.2 MB results a lot
    (freed large buffers returned to the kernel are page-faulted in again on the next message)."""
    return {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}


def report_footer(results: list[CellResult]) -> str:
    lines = []
    ratios = [r for r in results if r.ratio is not None and r.size == "1.2MB"]
    if ratios:
        worst = min(r.ratio for r in ratios if r.ratio is not None)
        verdict = "met" if worst >= 0.6 else "NOT met"
        lines.append(
            "1.2MB bridge/raw msgs/s: "
            + ", ".join(f"{r.target.split('-')[1]} x{r.conns} {r.ratio:.2f}" for r in ratios)
            + f"  (target >= 0.6: {verdict})"
        )
        # CPU per message barely depends on what else limits the rate: the steadier comparison.
        raw = {
            (r.target.split("-")[1], r.conns): r
            for r in results
            if r.size == "1.2MB" and r.target.startswith("raw")
        }
        costs = [
            f"{r.target.split('-')[1]} x{r.conns} "
            f"{r.relay_us_per_msg / raw[(r.target.split('-')[1], r.conns)].relay_us_per_msg:.1f}x"
            for r in ratios
            if (r.target.split("-")[1], r.conns) in raw
        ]
        lines.append("1.2MB relay CPU per message, bridge/raw: " + ", ".join(costs))
    # Caveats the numbers carry, said next to them rather than left to the reader.
    capped = [r for r in results if r.target.startswith("raw") and r.bench_cpu_pct >= SATURATED]
    if capped:
        lines.append(
            f"note: the load side (bench) used >= {SATURATED:.0f}% of a core in {len(capped)} raw "
            "cell(s): there the raw rate is a lower bound and the ratio an upper bound"
        )
    busy = [r for r in results if r.other_cpu_pct >= BUSY_MACHINE]
    if busy:
        lines.append(
            f"note: other work used >= {BUSY_MACHINE:.0f}% of a core during {len(busy)} cell(s); "
            "those rows are noisy, rerun on a quiet machine"
        )
    failed = [r for r in results if r.errors]
    if failed:
        lines.append(f"{len(failed)} cell(s) with errors; --json PATH lists them all")
    return "\n".join(lines)


def format_report(results: list[CellResult], cfg: BenchConfig) -> str:
    """The whole table at once (what ``main`` prints row by row as the cells finish)."""
    lines = [report_header(cfg)]
    previous = None
    for r in results:
        if previous is not None and (r.size, r.conns) != previous:
            lines.append("")
        previous = (r.size, r.conns)
        lines.append(format_row(r))
    lines += ["", report_footer(results)]
    return "\n".join(lines)


def write_json(path: Path, results: list[CellResult], cfg: BenchConfig) -> None:
    doc = {
        "benchmark": "relay",
        "config": asdict(cfg) | {"sizes_bytes": {s: SIZES[s] for s in cfg.sizes}},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "platform": platform.platform(),
            "malloc_env": _malloc_env(),
        },
        "cells": [asdict(r) for r in results],
    }
    path.write_text(json.dumps(doc, indent=2, default=list) + "\n")


# -- command line ----------------------------------------------------------------------------


def _csv(kind: Callable[[str], Any], choices: Sequence[Any] | None = None) -> Any:
    def parse(text: str) -> list[Any]:
        values = [kind(v) for v in text.split(",") if v]
        bad = [v for v in values if choices is not None and v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(map(str, choices or []))}")
        return values

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[BenchConfig, Path | None]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.relay",
        description="Bridge (passthrough) vs raw WebSocket/gRPC relays: msgs/s, MB/s, latency.",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    parser.add_argument("--window", type=int, default=8, help="in-flight messages per connection")
    parser.add_argument("--sizes", type=_csv(str, list(SIZES)), help="e.g. 1KB,1.2MB")
    parser.add_argument("--conns", type=_csv(int), help="e.g. 1,32")
    parser.add_argument("--targets", type=_csv(str, TARGETS), help=f"of {','.join(TARGETS)}")
    parser.add_argument(
        "--quick", action="store_true", help="smoke matrix: 1KB and 1.2MB, 1 connection"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument(
        "--bridge-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra simbridge serve flag, repeatable: --bridge-arg=--ack-interval-seconds=0.01",
    )
    ns = parser.parse_args(argv)
    if ns.seconds <= 0 or ns.warmup < 0 or ns.window < 1:
        parser.error("--seconds > 0, --warmup >= 0 and --window >= 1 please")
    cfg = BenchConfig(
        seconds=ns.seconds, warmup=ns.warmup, window=ns.window, bridge_args=ns.bridge_arg
    )
    if ns.quick:
        cfg.sizes, cfg.conns = QUICK_SIZES, QUICK_CONNS
    cfg.sizes = ns.sizes or cfg.sizes
    cfg.conns = ns.conns or cfg.conns
    cfg.targets = ns.targets or cfg.targets
    return cfg, ns.json


async def run(
    cfg: BenchConfig, progress: Callable[[CellResult], None] | None = None
) -> list[CellResult]:
    async with Bench(cfg, progress) as bench:
        return await bench.run_all()


def main(argv: Sequence[str] | None = None) -> int:
    cfg, json_path = parse_args(argv)
    print(report_header(cfg), flush=True)
    previous: list[tuple[str, int]] = []

    def progress(result: CellResult) -> None:
        if previous and previous[-1] != (result.size, result.conns):
            print()
        previous.append((result.size, result.conns))
        print(format_row(result), flush=True)

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        results = asyncio.run(run(cfg, progress))
    else:  # the bridge runs on uvloop too; the ceilings in docs/design.md §6 were measured with it
        results = uvloop.run(run(cfg, progress))
    print()
    print(report_footer(results))
    if json_path is not None:
        write_json(json_path, results, cfg)
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
