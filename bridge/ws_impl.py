"""WebSocket ingest adapter (``websockets`` asyncio server) at ``/v1/ingest``.

Library defaults that bite a point-cloud relay are set deliberately (docs/design.md §2): permessage-
deflate off and ``max_size`` from settings. Fatal protocol errors close with the code from
``bridge.errors.WIRE``; a draining bridge closes with 1001.

Receive is bounded in bytes, not messages: :class:`GovernedConnection` reads a data frame's
payload only after the memory governor granted it (the size comes from the frame header, see
:mod:`bridge.wsmeter`). While a grant waits, the connection stops reading (TCP flow control
stops the sender) and the edge is told ``FlowControl PAUSE``. What a connection can hold beyond
its grants is one socket read (≤ 256 KiB, the event loop's read size) plus control frames.

A large payload reaches ``websockets`` in one piece: its parser keeps unread bytes in a bytearray
that grows by reallocation, so a 1.2 MB frame fed as the socket delivers it (five or more reads,
more on a slow link) was copied over and over (``python -m benchmarks.ws_parse``: 0.3-0.6 ms of
parsing per frame in 16-256 KiB pieces against 0.15-0.2 ms whole). The granted payload's reads are
held as a list and joined once, straight into the bytearray the parser reads from.

A whole binary message (one final, masked frame, its header read in one piece while the parser
sits at a frame boundary) does not reach the parser at all: the adapter unmasks it and queues it
for ``recv()`` itself, straight from the read when small, from the joined reads when large
(``python -m benchmarks.ws_small``: the parser's pass was ~40 % of the adapter's cost per 1 KB
message, and its read and unmask one copy too many of a large payload). Everything else keeps
the parser's path and its checks; ``tests/fuzz/test_fuzz_ws_frames.py`` holds the two paths to
the same messages.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build of websockets without its C extension
    from websockets.utils import apply_mask

from bridge.errors import FrameTooLarge, MalformedMessage, ProtocolError
from bridge.governor import Charge, Component, Governor, Waiter
from bridge.metrics import BridgeMetrics
from bridge.ports import Edges, Received
from bridge.settings import Settings
from bridge.tls import certificate_names, server_ssl_context
from bridge.wsmeter import FrameMeter, Unread

log = logging.getLogger("bridge.ws")

INGEST_PATH = "/v1/ingest"


HELLO_BYTES = 64 * 1024  # a first message up to this size is read without waiting for a grant
WHOLE_PAYLOAD_BYTES = 64 * 1024  # a data frame at least this large is parsed in one piece
_FINAL_BINARY = 0x80 | int(Opcode.BINARY)  # FIN, no RSV bits, binary: a whole message


def _rotated(mask: bytes, offset: int) -> bytes:
    """The masking key as it applies from byte ``offset`` of a payload (RFC 6455 5.3: byte i
    is XORed with key[i mod 4])."""
    r = offset % 4
    return mask[r:] + mask[:r]


class GovernedConnection(ServerConnection):
    """A server connection whose data-frame payloads reach the parser only once granted.

    Each read is metered (:class:`FrameMeter`): bytes up to the end of a data frame's header
    pass through; the rest of the read is stashed and reading pauses until the governor grants
    that frame's payload. A connection therefore never holds more ungranted bytes than one read.
    """

    governor: Governor  # set on the per-server subclass made in start_ws_server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meter = FrameMeter()
        self.held: Charge | None = None  # granted bytes not yet handed to recv()'s caller
        self.hello: Charge | None = None  # the first message's, charged without waiting
        self.waiter: Waiter | None = None
        self.stash = Unread()  # bytes of the current read behind an ungranted header
        # The granted payload of a large frame as read so far (None: not collecting one); the
        # meter counts what is still to come.
        self.pieces: list[bytes] | None = None
        self.collected = 0  # bytes of that payload collected so far
        # The header of the large payload being collected, when that payload skips the parser.
        self.header: bytes | None = None
        self.queue_full = False  # websockets' own message queue asked to stop reading
        self.refused = False
        self.reading = True
        self.on_wait: Callable[[bool], None] | None = None  # PAUSE/RESUME to the edge
        self._closing: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.recv_messages.pause = lambda: self._queue(True)
        self.recv_messages.resume = lambda: self._queue(False)

    def _queue(self, full: bool) -> None:
        self.queue_full = full
        self._apply()

    def _apply(self) -> None:
        want = not self.queue_full and self.waiter is None and not self.stash and not self.refused
        if want != self.reading and not self.transport.is_closing():
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self.protocol.state is State.CONNECTING or self.refused:
            super().data_received(data)
            return
        self.stash.add(data)
        self._feed()

    def _feed(self) -> None:
        """Pass stashed bytes to websockets up to the next payload nobody granted yet."""
        while self.stash and self.waiter is None and not self.refused:
            if self.pieces is not None:
                self._collect()
                continue
            used, owed = self.meter.feed(self.stash.view())
            hello = owed and self.meter.frames == 1 and owed <= HELLO_BYTES
            if owed and not hello and owed < WHOLE_PAYLOAD_BYTES:
                used = self._direct(used, owed)
                if not used:
                    continue
            elif owed >= WHOLE_PAYLOAD_BYTES and not hello:
                direct, used = self._bypassable(used, owed)
                if direct:  # the header stays here; the payload is collected, then unmasked
                    self.header = self.stash.take(used)
                    self._need(owed)
                    if not self.refused:
                        self.pieces, self.collected = [], 0
                    continue
            super().data_received(self.stash.take(used))
            if hello:
                # The Hello never queues behind the data of others: an edge is always
                # welcomed (and paused) even while the budget is full.
                self.hello = self.governor.force(Component.TRANSPORT, owed)
            elif owed:
                self._need(owed)
            if owed >= WHOLE_PAYLOAD_BYTES and self._parsing(owed):
                self.pieces, self.collected = [], 0
        self._apply()

    def _direct(self, used: int, owed: int) -> int:
        """Queue a whole small binary message of this read without the parser; 0 once done.

        The common message (one final, masked, binary frame, its payload in this read, a grant
        at hand) is unmasked and queued for ``recv()`` here: ``websockets`` would have done the
        same after a pass of its frame parser, ~40 % of this adapter's cost per 1 KB
        message. Anything else (text, fragments, extensions' bits, an unmasked frame, a header
        split over reads, a waiting grant, a closing connection) takes the parser's path, so
        its checks and errors are the library's own. Returns 0 when done here (or when a grant
        must wait: the header went to the parser as before), else how much of the stash goes to
        the parser now: up to the end of the header, as without this path."""
        if used + owed > len(self.stash):
            return used
        direct, used = self._bypassable(used, owed)
        if not direct:
            return used
        got = self.governor.request(Component.TRANSPORT, owed, self._granted)
        if not isinstance(got, Charge):
            super().data_received(self.stash.take(used))
            self._requested(got, owed)
            return 0
        self._hold(got)
        meter = self.meter
        payload = apply_mask(self.stash.view()[used : used + owed], meter.mask)
        self.stash.skip(used + owed)
        meter.skip_payload(owed)
        self.recv_messages.put(Frame(Opcode.BINARY, payload))
        return 0

    def _bypassable(self, used: int, owed: int) -> tuple[bool, int]:
        """Whether the frame whose header ends at ``used`` may skip the parser: one final,
        masked, binary frame within the size limit, its whole header in this read, the parser
        at a frame boundary of an open connection. What the stash holds before that header
        (control frames, the end of an earlier payload) goes to the parser first, in order;
        returns the decision and ``used`` less those bytes."""
        meter = self.meter
        start = meter.head_at
        if start < 0 or meter.first_byte != _FINAL_BINARY or not meter.mask:
            return False, used
        if start:
            super().data_received(self.stash.take(start))
            used -= start
        protocol = self.protocol
        limit = protocol.max_message_size
        return (
            protocol.state is State.OPEN
            and protocol.current_size is None
            and not protocol.reader.buffer
            and not self.recv_messages.closed
            and not self.refused
            and (limit is None or owed <= limit)
        ), used

    def _parsing(self, nbytes: int) -> bool:
        """Whether websockets will read a payload of ``nbytes`` (not one it refuses as too big,
        nor one of a connection it is closing)."""
        limit = self.protocol.max_message_size
        return self.protocol.state is State.OPEN and (limit is None or nbytes <= limit)

    def _collect(self) -> None:
        """Hold the next stashed bytes of a large payload; hand the payload over once whole."""
        assert self.pieces is not None
        take = min(self.meter.payload_left, len(self.stash))
        piece = self.stash.take(take)
        self.meter.feed(piece)  # inside the payload: consumes exactly these bytes
        if self.header is not None:
            # Unmasked read by read, so the loop never spends one long turn on a whole large
            # payload (measured in the container: join + unmask of 15 MiB was most of the
            # loop's stalls under 15 MiB floods), and at most one read's copy is extra.
            piece = apply_mask(piece, _rotated(self.header[-4:], self.collected))
        self.collected += len(piece)
        self.pieces.append(piece)
        if not self.meter.payload_left:
            pieces, self.pieces = self.pieces, None
            header, self.header = self.header, None
            self.collected = 0
            if header is not None:
                if self.protocol.state is State.OPEN and not self.recv_messages.closed:
                    # One copy of the payload (the join) where the parser's path made three
                    # (join into its buffer, its read, its unmask).
                    payload = b"".join(pieces)
                    self.recv_messages.put(Frame(Opcode.BINARY, payload))
                    return
                # Closing meanwhile: the parser decides, as before, on the bytes as sent.
                pieces = [header, apply_mask(b"".join(pieces), header[-4:])]
            reader = self.protocol.reader
            if reader.buffer:  # not expected (the header went in alone): append as websockets does
                super().data_received(b"".join(pieces))
                return
            # The parser reads from its reader's bytearray: the payload joined straight into one
            # is its only copy here (joining to bytes, then appending those, made two).
            reader.buffer = bytearray().join(pieces)
            super().data_received(b"")

    def _need(self, nbytes: int) -> None:
        self._requested(self.governor.request(Component.TRANSPORT, nbytes, self._granted), nbytes)

    def _requested(self, got: Charge | Waiter | None, nbytes: int) -> None:
        if isinstance(got, Charge):
            self._hold(got)
        elif isinstance(got, Waiter):
            self.waiter = got
            if self.on_wait is not None:
                self.on_wait(True)
        else:
            self._refuse(nbytes)

    def _granted(self, charge: Charge | None) -> None:
        # Called inside the governor: only record, and continue reading on the next turn.
        waiter, self.waiter = self.waiter, None
        if charge is None:
            self._refuse(waiter.nbytes if waiter is not None else 0)
            return
        self._hold(charge)
        if self.on_wait is not None:
            self.on_wait(False)
        self.loop.call_soon(self._feed)

    def _refuse(self, nbytes: int) -> None:
        """A frame that can never fit the current budget: close with 1009 and the reason."""
        self.refused = True
        self.stash.clear()
        self.pieces = None
        self.header = None
        self._apply()
        limit = self.governor.admissible_bytes
        reason = f"frame of {nbytes} bytes can never fit the memory budget (max {limit})"
        log.info("ws: %s", reason)
        self._closing = asyncio.ensure_future(self.close(CloseCode.MESSAGE_TOO_BIG, reason[:120]))

    def _hold(self, charge: Charge) -> None:
        if self.held is None:
            self.held = charge
        else:
            self.held.merge(charge)

    def take(self, nbytes: int) -> Charge:
        """The charge for one message that recv() returned, carved out of the grants."""
        if self.hello is not None:
            charge, self.hello = self.hello, None
            charge.resize(nbytes)
            return charge
        if self.held is None:
            self.held = self.governor.force(Component.TRANSPORT, 0)
        have = self.held.nbytes
        charge = self.held.split(min(have, nbytes))
        if have < nbytes:
            # Only bytes that arrived before metering began (pipelined with the handshake).
            charge.resize(nbytes)
        return charge

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.stash.clear()
        self.pieces = None
        self.header = None
        if self.waiter is not None:
            self.governor.cancel(self.waiter)
            self.waiter = None
        for name in ("held", "hello"):
            charge = getattr(self, name)
            if charge is not None:
                setattr(self, name, None)
                charge.release()


class WsTransport:
    name = "ws"

    def __init__(self, ws: GovernedConnection) -> None:
        self.ws = ws

    def on_wait(self, notify: Callable[[bool], None]) -> None:
        self.ws.on_wait = notify

    async def recv(self) -> Received | None:
        try:
            data = await self.ws.recv()
        except ConnectionClosed:
            return None
        if isinstance(data, str):
            self.ws.take(len(data.encode())).release()
            raise MalformedMessage("text messages are not accepted; send binary protobuf")
        return Received(data, self.ws.take(len(data)))

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send(data)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    async def reject(self, error: ProtocolError) -> None:
        await self.ws.close(error.wire.ws_close, str(error)[:120])

    async def close_going_away(self, reason: str = "bridge shutting down") -> None:
        await self.ws.close(int(CloseCode.GOING_AWAY), reason)


def _bearer(headers: Headers) -> str:
    value = headers.get("Authorization", "")
    return value[7:] if value.lower().startswith("bearer ") else ""


async def start_ws_server(
    edges: Edges, settings: Settings, metrics: BridgeMetrics, governor: Governor
) -> Server:
    """Listen on ``settings.host:settings.ws_port``; each connection is served by ``edges``,
    its payloads read only as ``governor`` grants them."""

    def check_path(conn: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != INGEST_PATH:
            return conn.respond(404, f"WebSocket ingest is at {INGEST_PATH}\n")
        if edges.draining:
            return conn.respond(503, "draining\n")
        return None

    class Connection(GovernedConnection):
        pass

    Connection.governor = governor

    async def handler(ws: ServerConnection) -> None:
        assert isinstance(ws, GovernedConnection)
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = WsTransport(ws)
        token = _bearer(ws.request.headers) if ws.request is not None else ""
        try:
            await edges.serve(transport, token, certificate_names(ws.transport))
        except MalformedMessage as exc:  # a text frame: refuse like any malformed message
            metrics.refused("ws", exc.reason)
            await transport.reject(exc)
        finally:
            # websockets enforces max_size itself (closing with 1009): count it here, whichever
            # of our reads or writes noticed the closed connection first.
            sent = ws.protocol.close_sent
            if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
                metrics.refused("ws", FrameTooLarge.reason)

    return await serve(
        handler,
        settings.host,
        settings.ws_port,
        process_request=check_path,
        compression=None,
        # websockets enforces the size (closing with 1009) before we ever see the bytes.
        max_size=settings.max_frame_bytes,
        # Stop reading once one message waits unread; every payload byte is granted first.
        max_queue=1,
        create_connection=Connection,
        ping_interval=settings.ping_interval_seconds,
        ping_timeout=settings.ping_timeout_seconds,
        close_timeout=2.0,
        ssl=server_ssl_context(settings),
        reuse_port=settings.reuse_port,
    )
