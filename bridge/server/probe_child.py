"""The ops port's front: a small child process that answers ``/healthz`` and ``/readyz`` itself.

Why a process and not a thread (issue 29): a thread in the bridge answers only while it holds
the GIL, and under load the bridge's own threads hold it (measured with two threads spinning
bytecode in the bridge process: ``/healthz`` p50 55-74 ms, p99 146-197 ms). This process shares
no GIL with the bridge: it reads the probe state from a small shared-memory block that the
bridge's loop writes (:class:`ProbeState`: the loop's last beat on ``CLOCK_MONOTONIC``, is_live,
is_ready, the stall threshold) and answers from it. Every other request (``/metrics``,
``/debug/*``, 401s, 404s, 405s) is relayed byte for byte to the bridge's
:class:`bridge.server.http_impl.OpsHttpServer` on an internal 127.0.0.1 port, which keeps every
auth rule: this process never holds the token.

Standard library only and no ``bridge`` import, so it starts in milliseconds with a few MiB of
its own. The bridge binds the public socket and hands it over (``--listen-fd``): a restarted
child keeps the port (also a port picked with 0), and connections that arrive while none runs
wait in the backlog. The child exits when the pipe from its parent (``--parent-fd``) reads EOF
or its parent changes, so a bridge killed with SIGKILL leaves no child behind.

Bounds, as on the old in-process server: one request per connection, a request head of at most
:data:`MAX_REQUEST_BYTES` read within :data:`READ_SECONDS`, at most :data:`MAX_CONNECTIONS`
open (past that the oldest connection that has not sent its request yet is closed to make room,
else the new one), a relayed answer within :data:`RELAY_SECONDS`.

Run by the bridge as ``python -I -S <this file> ...``; ``python -m bridge.server.probe_child``
works as well.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import time

MAX_REQUEST_BYTES = 8192
READ_SECONDS = 5.0  # a client must send its request line and headers within this
MAX_CONNECTIONS = 256  # open at once; more are closed at once
LOOP_ANSWER_SECONDS = 10.0  # the bridge's loop answers /metrics and /debug within this
RELAY_SECONDS = LOOP_ANSWER_SECONDS + 5.0  # its 503 for a late loop still comes through
RELAY_CHUNK = 16384  # read from the bridge at a time, and only once the client took the last
_REASONS = {
    200: "OK",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
Answer = tuple[int, str, bytes]

# seq (odd while written), beat (CLOCK_MONOTONIC s), stall threshold (s), is_live, is_ready
_LAYOUT = struct.Struct("<QddBB6x")
STATE_BYTES = mmap.PAGESIZE


class ProbeState:
    """The shared block: written by the bridge's loop (one writer), read by the child. A
    sequence number, odd while a write is under way, lets the reader retry a torn read."""

    def __init__(self, fd: int, *, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.map = mmap.mmap(fd, STATE_BYTES, mmap.MAP_SHARED, prot)
        self._seq = _LAYOUT.unpack_from(self.map)[0]

    @classmethod
    def create(cls) -> tuple[ProbeState, int]:
        """A new block, and the fd a child inherits to read it (memfd: no file on disk)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("simbridge-probes", os.MFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            import tempfile

            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, STATE_BYTES)
        return cls(fd, writable=True), fd

    def write(self, *, beat: float, stall: float, live: bool, ready: bool) -> None:
        self._seq += 1
        struct.pack_into("<Q", self.map, 0, self._seq)
        _LAYOUT.pack_into(self.map, 0, self._seq, beat, stall, live, ready)
        self._seq += 1
        struct.pack_into("<Q", self.map, 0, self._seq)

    def read(self) -> tuple[float, float, bool, bool] | None:
        """(beat, stall, live, ready), or None when no consistent read came in 100 tries."""
        for _ in range(100):
            seq, beat, stall, live, ready = _LAYOUT.unpack_from(self.map)
            if seq % 2 == 0 and struct.unpack_from("<Q", self.map)[0] == seq:
                return beat, stall, bool(live), bool(ready)
        return None

    def close(self) -> None:
        self.map.close()


def probe_answer(
    path: str, *, beat_age: float, stall: float, live: bool, ready: bool
) -> Answer | None:
    """The probe rules, one place for both processes (None: not a probe): 503 once the bridge's
    loop has not beaten for ``stall`` seconds, or when it says it is not live / not ready."""
    loop_alive = beat_age <= stall
    if path == "/healthz":
        ok = loop_alive and live
        return (200 if ok else 503), "text/plain", b"ok\n" if ok else b"unhealthy\n"
    if path == "/readyz":
        ok = loop_alive and ready
        return (200 if ok else 503), "text/plain", b"ready\n" if ok else b"not ready\n"
    return None


def response(method: str, answer: Answer) -> bytes:
    status, ctype, body = answer
    auth_header = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{auth_header}\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


def answer_probe(head: bytes, state: ProbeState) -> bytes | None:
    """The response to a GET/HEAD probe from the shared state; None: relay the request."""
    try:
        method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
    except ValueError:
        return None
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD") or path not in ("/healthz", "/readyz"):
        return None
    read = state.read()
    if read is None:
        beat, stall, live, ready = 0.0, 0.0, False, False
    else:
        beat, stall, live, ready = read
    age = time.monotonic() - beat
    answer = probe_answer(path, beat_age=age, stall=stall, live=live, ready=ready)
    assert answer is not None
    return response(method, answer)


class _Conn:
    """One client connection: reading its head, then (when relayed) the upstream's answer."""

    __slots__ = ("buffer", "client", "deadline", "pending", "sent", "upstream", "upstream_done")

    def __init__(self, client: socket.socket, deadline: float) -> None:
        self.client = client
        self.deadline = deadline
        self.buffer = bytearray()
        self.upstream: socket.socket | None = None
        self.pending = b""  # upstream bytes the client has not taken yet
        self.upstream_done = False
        self.sent = False  # any upstream byte went to the client


class ProbeFront:
    """The child's single-threaded server: a selector over the listening sockets, the parent
    pipe, every client and every relay to the bridge."""

    def __init__(
        self,
        listeners: list[socket.socket],
        state: ProbeState,
        upstream_port: int,
        parent_fd: int | None,
    ) -> None:
        self.listeners = listeners
        self.state = state
        self.upstream = ("127.0.0.1", upstream_port)
        self.parent_fd = parent_fd
        self.parent_pid = os.getppid()
        self.sel = selectors.DefaultSelector()
        self.conns: dict[socket.socket, _Conn] = {}  # by client socket
        self.running = True

    def serve(self) -> None:
        for sock in self.listeners:
            sock.setblocking(False)
            self.sel.register(sock, selectors.EVENT_READ, ("accept", sock))
        if self.parent_fd is not None:
            self.sel.register(self.parent_fd, selectors.EVENT_READ, ("parent", None))
        next_sweep = time.monotonic() + 0.25
        while self.running:
            for key, mask in self.sel.select(timeout=0.25):
                kind, obj = key.data
                try:
                    self._dispatch(kind, obj, mask)
                except OSError:
                    if kind in ("client", "upstream"):
                        self._close(obj)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + 0.25
                self._sweep(now)

    def _dispatch(self, kind: str, obj: object, mask: int) -> None:
        if kind == "accept":
            assert isinstance(obj, socket.socket)
            self._accept(obj)
        elif kind == "parent":
            assert self.parent_fd is not None
            if not os.read(self.parent_fd, 64):
                self.running = False  # the bridge is gone
        elif kind == "client":
            assert isinstance(obj, _Conn)
            if mask & selectors.EVENT_WRITE:
                self._flush(obj)
            else:
                self._read_head(obj)
        elif kind == "upstream":
            assert isinstance(obj, _Conn)
            if obj.upstream is not None and obj.buffer:
                self._send_head(obj)
            else:
                self._relay(obj)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):
            try:
                client, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: try again on the next event
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                raise
            if len(self.conns) >= MAX_CONNECTIONS and not self._evict_one():
                client.close()
                continue
            client.setblocking(False)
            conn = _Conn(client, time.monotonic() + READ_SECONDS)
            self.conns[client] = conn
            self.sel.register(client, selectors.EVENT_READ, ("client", conn))

    def _evict_one(self) -> bool:
        """At the cap, the oldest connection still without a request gives way to the new
        one: idle connections (a slowloris) cannot lock a probe out, which sends its request
        as soon as it connects. False when every connection is being answered."""
        for conn in self.conns.values():  # oldest first
            if conn.upstream is None:
                self._close(conn)
                return True
        return False

    def _read_head(self, conn: _Conn) -> None:
        data = conn.client.recv(MAX_REQUEST_BYTES + 1)
        if not data:
            self._close(conn)
            return
        conn.buffer += data
        end = conn.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buffer) > MAX_REQUEST_BYTES:
                self._close(conn)
            return
        head = bytes(conn.buffer[: end + 4])
        conn.buffer = bytearray(head)
        self.sel.unregister(conn.client)  # one request: the rest of its input is ignored
        answer = answer_probe(head, self.state)
        if answer is not None:
            with contextlib.suppress(OSError):
                conn.client.send(answer)  # ~100 bytes: the socket's buffer takes them
            self._close(conn)
            return
        self._start_relay(conn)

    def _start_relay(self, conn: _Conn) -> None:
        conn.deadline = time.monotonic() + RELAY_SECONDS
        up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        up.setblocking(False)
        conn.upstream = up
        code = up.connect_ex(self.upstream)
        if code not in (0, errno.EINPROGRESS):
            self._fail(conn)
            return
        self.sel.register(up, selectors.EVENT_WRITE, ("upstream", conn))

    def _send_head(self, conn: _Conn) -> None:
        assert conn.upstream is not None
        if conn.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self._fail(conn)  # the bridge's internal server is not there
            return
        conn.upstream.sendall(bytes(conn.buffer))  # at most 8 KiB: the buffer takes it
        conn.buffer = bytearray()
        self.sel.modify(conn.upstream, selectors.EVENT_READ, ("upstream", conn))

    def _relay(self, conn: _Conn) -> None:
        assert conn.upstream is not None
        data = conn.upstream.recv(RELAY_CHUNK)
        if not data:
            conn.upstream_done = True
            self.sel.unregister(conn.upstream)
            conn.upstream.close()
            if not conn.pending:
                self._close(conn)
            return
        conn.pending = data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        """Send what the upstream gave; read it again only once the client took all of it."""
        if conn.pending:
            sent = conn.client.send(conn.pending)
            conn.sent = True
            conn.pending = conn.pending[sent:]
        registered = conn.client in self.sel.get_map()
        if conn.pending:
            if not registered:
                self.sel.register(conn.client, selectors.EVENT_WRITE, ("client", conn))
                if conn.upstream is not None and not conn.upstream_done:
                    self.sel.unregister(conn.upstream)
            return
        if registered:
            self.sel.unregister(conn.client)
        if conn.upstream_done:
            self._close(conn)
        elif conn.upstream is not None and conn.upstream not in self.sel.get_map():
            self.sel.register(conn.upstream, selectors.EVENT_READ, ("upstream", conn))

    def _fail(self, conn: _Conn) -> None:
        """The bridge's ops server cannot be reached (or did not answer in time)."""
        if not conn.sent:
            with contextlib.suppress(OSError):
                conn.client.send(
                    response("GET", (503, "text/plain", b"the bridge did not answer\n"))
                )
        self._close(conn)

    def _close(self, conn: object) -> None:
        assert isinstance(conn, _Conn)
        for sock in (conn.client, conn.upstream):
            if sock is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(sock)
            sock.close()
        self.conns.pop(conn.client, None)

    def _sweep(self, now: float) -> None:
        """Past their deadline: a head not read in time is closed, a relay answered 503."""
        for conn in [c for c in self.conns.values() if c.deadline < now]:
            if conn.upstream is None:
                self._close(conn)
            else:
                self._fail(conn)
        if os.getppid() != self.parent_pid:
            self.running = False  # reparented: the bridge died


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe_child", description=__doc__.split("\n")[0])
    parser.add_argument("--listen-fd", type=int, action="append", required=True)
    parser.add_argument("--state-fd", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--parent-fd", type=int, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a console Ctrl-C is the bridge's to handle
    listeners = [socket.socket(fileno=fd) for fd in args.listen_fd]
    front = ProbeFront(
        listeners, ProbeState(args.state_fd, writable=False), args.upstream_port, args.parent_fd
    )
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    front.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
