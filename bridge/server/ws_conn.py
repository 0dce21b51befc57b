"""One WebSocket connection: our own asyncio ``Protocol`` over ``websockets``' public sans-I/O
``ServerProtocol`` (``receive_data``, ``events_received``, ``data_to_send``, ``send_binary``,
``send_close``, ``fail``, ``accept``, ``reject``, ``state``, ``close_exc``).

Receive is bounded in bytes, not messages: a data frame's payload is read only after the memory
governor granted it. The size comes from the frame header
(:class:`bridge.server.wsmeter.FrameMeter`) before the payload arrives. While a grant waits the
connection stops reading (TCP flow control
stops the sender) and the edge is told ``FlowControl PAUSE`` (``on_wait``). What a connection
holds beyond its grants is one socket read (<= 256 KiB, the event loop's read size) plus control
frames. The first message (the Hello, up to :data:`HELLO_BYTES`) is charged without waiting, so
an edge is always welcomed (and paused) even while the budget is full. A frame that can never fit
the budget closes the connection with 1009.

Where the payload goes once granted:

- A whole binary message (one final, masked, binary frame, its header read in one piece, no
  fragmented message under way) skips the library's parser: small ones are unmasked straight
  from the read (:meth:`GovernedConnection._direct`: the parser's pass was ~40 % of the
  adapter's cost per 1 KB message, ``python -m benchmarks.ws_small``); a large one is written
  into ONE buffer of its size, allocated when its grant arrives, and unmasked there read by read
  (:class:`bridge.server.wsmeter.Payload`), and that buffer is what ``recv()`` returns (a
  ``bytearray``; no join, no list of reads, no copy after the last read).
- Everything else (control frames, text, fragments, reserved bits, an unmasked frame, a header
  split over reads) is fed to ``ServerProtocol.receive_data()``, so its checks and close codes
  are the library's own. A large payload on this path is collected whole before it is fed, so
  the parser's buffer is not regrown read by read.

``tests/fuzz/test_fuzz_ws_frames.py`` holds the two paths to what plain ``websockets`` yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import cast

from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import SERVER, Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build of websockets without its C extension
    from websockets.utils import apply_mask

from bridge.server.governor import Charge, Component, Governor, Waiter
from bridge.server.wsmeter import FrameMeter, Payload, Unread

log = logging.getLogger("bridge.ws")

HELLO_BYTES = 64 * 1024  # a first message up to this size is read without waiting for a grant
WHOLE_PAYLOAD_BYTES = 64 * 1024  # a data frame at least this large is collected in one piece
WRITE_LIMIT = 32 * 1024  # bytes buffered for the socket before send() waits (websockets' default)
_FINAL_BINARY = 0x80 | int(Opcode.BINARY)  # FIN, no RSV bits, binary: a whole message
_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)

Message = bytes | bytearray | str
RequestCheck = Callable[["GovernedConnection", Request], "Response | None"]
Handler = Callable[["GovernedConnection"], Awaitable[None]]


class GovernedConnection(asyncio.Protocol):
    """A server connection whose data-frame payloads are read only once granted.

    The asyncio side is small glue: ``data_received`` meters, feeds ``ServerProtocol``, writes
    what it has to send and queues the messages; ``recv``/``send``/``close`` are what the
    bridge's transport (:class:`bridge.server.ws_impl.WsTransport`) calls. Keepalive pings, the
    close timeout and the opening handshake timeout are here too.
    """

    def __init__(
        self,
        governor: Governor,
        *,
        max_size: int | None,
        ping_interval: float | None = None,
        ping_timeout: float | None = None,
        close_timeout: float = 2.0,
        open_timeout: float | None = 10.0,
        process_request: RequestCheck | None = None,
        handler: Handler | None = None,
        serving: Callable[[], bool] = lambda: True,
    ) -> None:
        self.governor = governor
        self.max_size = max_size
        self.protocol = ServerProtocol(max_size=max_size)  # no extensions: compression off
        self.loop = asyncio.get_running_loop()
        self.ping_interval, self.ping_timeout = ping_interval, ping_timeout
        self.close_timeout, self.open_timeout = close_timeout, open_timeout
        self.process_request, self.handler, self.serving = process_request, handler, serving
        self.transport: asyncio.Transport | None = None
        self.request: Request | None = None
        self.response: Response | None = None
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.task: asyncio.Task[None] | None = None  # the handler's
        self._keepalive: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # open timeout, then close timeout
        self._tail = b""  # the last bytes of the request read so far (to find its end)
        self._pings: dict[bytes, tuple[asyncio.Future[float], float]] = {}
        self._drains: list[asyncio.Future[None]] = []
        self._write_paused = False
        # Receiving.
        self.meter = FrameMeter()
        self.held: Charge | None = None  # granted bytes not yet handed to recv()'s caller
        self.hello: Charge | None = None  # the first message's, charged without waiting
        self.waiter: Waiter | None = None
        self.stash = Unread()  # bytes of the current read behind an ungranted header
        self.payload: Payload | None = None  # a large binary message being read past the parser
        self.whole: bytearray | None = None  # a large payload being collected for the parser
        self.collected = 0
        self.messages: deque[Message] = deque()
        self._fragments: list[bytes] | None = None  # a fragmented message under way
        self._text = False
        self._getter: asyncio.Future[None] | None = None
        self.queue_full = False
        self.refused = False
        self.reading = True
        self.on_wait: Callable[[bool], None] | None = None  # PAUSE/RESUME to the edge
        self._closing: asyncio.Future[None] | None = None

    # The state of the connection, as the library keeps it.

    @property
    def state(self) -> State:
        return self.protocol.state

    @property
    def close_code(self) -> int | None:
        return self.protocol.close_code

    def respond(self, status: int, text: str) -> Response:
        """A response refusing the upgrade (for ``process_request``)."""
        return self.protocol.reject(status, text)

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        transport.set_write_buffer_limits(WRITE_LIMIT)  # send() waits above it, as websockets'
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.open_timeout is not None:
            self._timer = self.loop.call_later(self.open_timeout, self._open_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.protocol.state is State.CONNECTING:
            self._request_data(data)
        elif self.refused:
            pass  # reading stopped; what was in flight is dropped with the connection
        else:
            self.stash.add(data)
            self._feed()

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._send_data()
        self._events()

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        for pong, _ in self._pings.values():
            pong.cancel()
        self._pings.clear()
        for drain in self._drains:
            if not drain.done():
                drain.set_result(None)
        self.stash.clear()
        self.payload = self.whole = None
        if self.waiter is not None:
            self.governor.cancel(self.waiter)
            self.waiter = None
        held, hello, self.held, self.hello = self.held, self.hello, None, None
        for charge in (held, hello):
            if charge is not None:
                charge.release()
        self.governor.end_owner(self, "WebSocket connection")  # debug mode: nothing left behind
        self._wake()
        self.lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for drain in self._drains:
            if not drain.done():
                drain.set_result(None)

    # The opening handshake

    def _request_data(self, data: bytes) -> None:
        """Feed the library the HTTP request, up to its end; what follows it is metered."""
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        if end < 0:
            self._tail = seen[-3:]
            self.protocol.receive_data(data)
            self._send_data()
            self._events()
            return
        cut = end + 4 - len(self._tail)
        self._tail = b""
        self.protocol.receive_data(data[:cut])
        self._send_data()  # a malformed request's answer, if any
        self._events()  # the Request: answered there
        if self.protocol.state is State.OPEN and len(data) > cut:
            self.stash.add(data[cut:])
            self._feed()

    def _handshake(self, request: Request) -> None:
        self.request = request
        response = None
        if self.process_request is not None:
            try:
                response = self.process_request(self, request)
            except Exception:
                log.exception("ws: checking the upgrade request failed")
                response = self.protocol.reject(500, "Failed to open a WebSocket connection.\n")
        if response is None:
            response = self.protocol.accept(request)
        if response.status_code == 101 and not self.serving():
            response = self.protocol.reject(503, "Server is shutting down.\n")
        response.headers["Server"] = SERVER
        self.response = response
        self.protocol.send_response(response)
        self._send_data()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.protocol.state is not State.OPEN:
            assert self.transport is not None
            self.transport.close()  # after the response is written
            return
        if self.ping_interval is not None:
            self._keepalive = self.loop.create_task(self._keep_alive(self.ping_interval))
        if self.handler is not None:
            self.task = self.loop.create_task(self._serve(self.handler))

    async def _serve(self, handler: Handler) -> None:
        try:
            await handler(self)
        except Exception:
            log.exception("ws: connection handler failed")
            await self.close(CloseCode.INTERNAL_ERROR)
        else:
            await self.close()

    def _open_timed_out(self) -> None:
        self._timer = None
        if self.protocol.state is State.CONNECTING and self.transport is not None:
            self.transport.abort()

    # Events from the library

    def _send_data(self) -> None:
        transport = self.transport
        assert transport is not None
        for data in self.protocol.data_to_send():
            if data:
                transport.write(data)
            elif transport.can_write_eof():  # the library's end of the stream: half-close
                with contextlib.suppress(Exception):  # uvloop: RuntimeError when closing
                    transport.write_eof()
            else:
                transport.close()
        if self.protocol.close_expected() and self._timer is None and not self.lost.done():
            self._timer = self.loop.call_later(self.close_timeout, self._close_timed_out)

    def _close_timed_out(self) -> None:
        self._timer = None
        if self.transport is not None and not self.lost.done():
            self.transport.abort()

    def _parse(self, data: bytes | bytearray) -> None:
        self.protocol.receive_data(data)
        self._send_data()
        self._events()

    def _events(self) -> None:
        for event in self.protocol.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif isinstance(event, Frame):
                if event.opcode in _DATA:
                    self._frame(event)
                elif event.opcode is Opcode.PONG:
                    self._ponged(bytes(event.data))

    def _frame(self, frame: Frame) -> None:
        """Assemble a message from the parser's data frames (it checked their order)."""
        if frame.opcode is not Opcode.CONT:
            self._text = frame.opcode is Opcode.TEXT
            if frame.fin:
                self._queue(self._decoded(frame.data))
                return
            self._fragments = [bytes(frame.data)]
            return
        assert self._fragments is not None
        self._fragments.append(bytes(frame.data))
        if frame.fin:
            data, self._fragments = b"".join(self._fragments), None
            self._queue(self._decoded(data))

    def _decoded(self, data: bytes | bytearray | memoryview) -> Message:
        if self._text:  # refused by the bridge anyway: decoded only to say it was text
            return bytes(data).decode("utf-8", "replace")
        return bytes(data) if isinstance(data, memoryview) else data

    # Metering

    def _feed(self) -> None:
        """Pass stashed bytes on up to the next payload nobody granted yet."""
        while self.stash and self.waiter is None and not self.refused:
            if self.payload is not None or self.whole is not None:
                self._collect()
                continue
            used, owed = self.meter.feed(self.stash.view())
            hello = owed and self.meter.frames == 1 and owed <= HELLO_BYTES
            if owed and not hello:
                direct, used = self._bypassable(used, owed)
                if direct and owed < WHOLE_PAYLOAD_BYTES:
                    if self._direct(used, owed):
                        continue
                elif direct:  # the header stays here; the payload goes to one buffer
                    mask = self.meter.mask
                    self.stash.skip(used)
                    self._need(owed)
                    if not self.refused:
                        self._open_payload(owed, mask)
                    continue
            self._parse(self.stash.take(used))
            if hello:
                # The Hello never queues behind the data of others.
                self.hello = self.governor.force(Component.TRANSPORT, owed, owner=self)
            elif owed:
                self._need(owed)
            if owed >= WHOLE_PAYLOAD_BYTES and self._parsing(owed) and not self.refused:
                self.whole, self.collected = bytearray(owed), 0
        self._apply()

    def _direct(self, used: int, owed: int) -> bool:
        """Queue a whole small binary message of this read without the parser, if its payload is
        in this read and its grant at hand (True); else the header is left to the caller."""
        if used + owed > len(self.stash):
            return False
        got = self.governor.request(Component.TRANSPORT, owed, self._granted, owner=self)
        if not isinstance(got, Charge):
            self.stash.skip(used)
            self._requested(got, owed)
            if self.waiter is not None:  # the payload waits unread; it goes to one buffer
                self._open_payload(owed, self.meter.mask)
            return True
        self._hold(got)
        payload = apply_mask(self.stash.view()[used : used + owed], self.meter.mask)
        self.stash.skip(used + owed)
        self.meter.skip_payload(owed)
        self._queue(payload)
        return True

    def _open_payload(self, owed: int, mask: bytes) -> None:
        self.payload = Payload(owed, mask)

    def _bypassable(self, used: int, owed: int) -> tuple[bool, int]:
        """Whether the frame whose header ends at ``used`` may skip the parser: one final,
        masked, binary frame within the size limit, its whole header in this read, no fragmented
        message under way, an open connection. What the stash holds before that header (control
        frames, the end of an earlier payload) goes to the parser first, in order; returns the
        decision and ``used`` less those bytes."""
        meter = self.meter
        start = meter.head_at
        if start < 0 or meter.first_byte != _FINAL_BINARY or not meter.mask:
            return False, used
        if start:
            self._parse(self.stash.take(start))
            used -= start
        limit = self.max_size
        return (
            self.protocol.state is State.OPEN
            and self._fragments is None
            and not self.refused
            and (limit is None or owed <= limit)
        ), used

    def _parsing(self, nbytes: int) -> bool:
        """Whether the library will read a payload of ``nbytes`` (not one it refuses as too big,
        nor one of a connection it is closing)."""
        limit = self.max_size
        return self.protocol.state is State.OPEN and (limit is None or nbytes <= limit)

    def _collect(self) -> None:
        """The next stashed bytes of a large payload; the message or the parser has it once
        whole."""
        left = self.payload.left if self.payload is not None else self.meter.payload_left
        take = min(left, len(self.stash))
        piece = self.stash.view()[:take]
        self.meter.skip_payload(take)
        payload = self.payload
        if payload is not None:
            message = payload.write(piece)
            del piece
            self.stash.skip(take)
            if message is not None:
                self.payload = None
                if self.protocol.state is State.OPEN:  # closing meanwhile: not delivered
                    self._queue(message)
            return
        whole = self.whole
        assert whole is not None
        with memoryview(whole) as into:  # not whole[...] = piece: that copies piece first
            into[self.collected : self.collected + take] = piece
        del piece
        self.stash.skip(take)
        self.collected += take
        if self.collected == len(whole):
            self.whole = None
            self._parse(whole)

    def _queue(self, message: Message) -> None:
        self.messages.append(message)
        self._wake()
        if len(self.messages) > 1 and not self.queue_full:  # max_queue=1, as before
            self.queue_full = True
            self._apply()

    def _wake(self) -> None:
        getter, self._getter = self._getter, None
        if getter is not None and not getter.done():
            getter.set_result(None)

    def _apply(self) -> None:
        want = not self.queue_full and self.waiter is None and not self.refused
        transport = self.transport
        if want != self.reading and transport is not None and not transport.is_closing():
            self.reading = want
            if want:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def _need(self, nbytes: int) -> None:
        got = self.governor.request(Component.TRANSPORT, nbytes, self._granted, owner=self)
        self._requested(got, nbytes)

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
        self.payload = self.whole = None
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
        """The charge for one message that recv() returned, carved out of the grants: the
        caller owns it (and transfers it on, or releases it)."""
        if self.hello is not None:
            charge = self.hello.transfer()  # out of this connection's hands
            self.hello = None
            charge.resize(nbytes)
            return charge
        if self.held is None:
            self.held = self.governor.force(Component.TRANSPORT, 0, owner=self)
        have = self.held.nbytes
        charge = self.held.split(min(have, nbytes))
        if have < nbytes:
            charge.resize(nbytes)  # not expected: every payload byte is granted first
        return charge

    # What the bridge's transport calls

    async def recv(self) -> Message:
        """The next message; ConnectionClosed once the connection is closed and none is left."""
        while not self.messages:
            if self.lost.done():
                raise self.protocol.close_exc
            self._getter = self.loop.create_future()
            await self._getter
        message = self.messages.popleft()
        if self.queue_full and not self.messages:
            self.queue_full = False
            self._apply()
        return message

    async def send(self, data: bytes) -> None:
        if self.protocol.state is not State.OPEN:
            await self.wait_closed()
            raise self.protocol.close_exc
        self.protocol.send_binary(data)
        self._send_data()
        if self._write_paused:
            drain = self.loop.create_future()
            self._drains.append(drain)
            try:
                await drain
            finally:
                self._drains.remove(drain)
        if self.lost.done():
            raise self.protocol.close_exc

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """The closing handshake; returns once the TCP connection is gone (at most the close
        timeout after the close frame, then it is aborted)."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self._send_data()
        elif self._timer is None and not self.lost.done() and self.transport is not None:
            self._timer = self.loop.call_later(self.close_timeout, self._close_timed_out)
        await self.wait_closed()

    async def wait_closed(self) -> None:
        await asyncio.shield(self.lost)

    # Keepalive

    def send_ping(self) -> asyncio.Future[float]:
        """A ping now (the keepalive's, a challenge's): its pong's future, cancelled if lost."""
        data = os.urandom(4)
        while data in self._pings:
            data = os.urandom(4)
        pong: asyncio.Future[float] = self.loop.create_future()
        self._pings[data] = (pong, self.loop.time())
        self.protocol.send_ping(data)
        self._send_data()
        return pong

    async def _keep_alive(self, interval: float) -> None:
        latency = 0.0
        while self.protocol.state is State.OPEN:
            await asyncio.sleep(interval - latency)
            if self.protocol.state is not State.OPEN:
                return
            pong = self.send_ping()
            if self.ping_timeout is None:
                continue
            try:
                latency = await asyncio.wait_for(pong, self.ping_timeout)
            except TimeoutError:
                if self.protocol.state is State.OPEN:
                    self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                    self._send_data()
                return

    def _ponged(self, data: bytes) -> None:
        if data not in self._pings:
            return  # unsolicited
        now = self.loop.time()
        for key in list(self._pings):  # a pong acknowledges every earlier ping too
            pong, sent = self._pings.pop(key)
            if not pong.done():
                pong.set_result(now - sent)
            if key == data:
                break


__all__ = ["HELLO_BYTES", "ConnectionClosed", "GovernedConnection", "Message"]
