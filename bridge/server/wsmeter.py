"""Counts the payload bytes that WebSocket frame headers announce, as the raw bytes arrive
(sans-I/O: fed the bytes of each read, returns what must be granted).

Why: ``websockets`` reads a connection into its own buffers (up to ``max_queue`` messages of up to
``max_size`` each) whether or not anyone calls ``recv()``. To bound that in bytes, the WebSocket
adapter reads a frame's payload only once the memory governor has granted it, and the payload
size is known from the frame's header before the payload arrives (RFC 6455 §5.2). Control frames
(ping, pong, close: at most 125 bytes each) are not metered. :class:`Payload` is where a large
binary message's granted bytes go: one buffer, unmasked in place.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import cast

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a build of websockets without its C extension
    from websockets.utils import apply_mask


_CONTROL = 0x8  # opcodes 0x8-0xF


class FrameMeter:
    """Tracks frame boundaries in the byte stream of one connection."""

    __slots__ = (
        "_header",
        "_need",
        "_payload_left",
        "first_byte",
        "frames",
        "head_at",
        "mask",
        "metered_bytes",
    )

    def __init__(self) -> None:
        self._header = bytearray()  # header bytes of the frame being parsed
        self._need = 2  # header bytes needed before the length is known
        self._payload_left = 0  # payload bytes of the current frame still to come
        self.frames = 0  # data frames with a payload whose header was seen
        self.metered_bytes = 0  # payload bytes announced by data frames so far
        # The header that announced the last payload: where it began in the bytes of the feed()
        # call that announced it (-1: in an earlier call), its first byte (FIN, RSV, opcode) and
        # its masking key (empty when unmasked).
        self.head_at = -1
        self.first_byte = 0
        self.mask = b""

    def skip_payload(self, nbytes: int) -> None:
        """The caller took ``nbytes`` of the current payload itself (not fed through here)."""
        if not 0 <= nbytes <= self._payload_left:
            raise ValueError(f"{nbytes} bytes is not within the {self._payload_left} left")
        self._payload_left -= nbytes

    @property
    def payload_left(self) -> int:
        """Payload bytes of the current frame still to come."""
        return self._payload_left

    def feed(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Consume bytes up to the end of ``data`` or up to the end of the first data-frame
        header announcing a payload, whichever comes first. Returns (bytes consumed, payload
        bytes announced); the caller feeds the rest once that payload was granted, so no
        payload byte reaches the WebSocket parser before its grant."""
        announced = 0
        view = memoryview(data)
        pos, end = 0, len(view)
        start = -1
        while pos < end and not announced:
            if self._payload_left:
                step = min(self._payload_left, end - pos)
                self._payload_left -= step
                pos += step
                continue
            if not self._header:
                start = pos
            take = min(self._need - len(self._header), end - pos)
            self._header += view[pos : pos + take]
            pos += take
            if len(self._header) < self._need:
                break
            length = self._parse()
            if length is None:
                continue  # the header is longer than we thought: read the rest
            header = self._header
            if header[0] & 0x0F < _CONTROL and length:
                announced = length
                self.frames += 1
                self.head_at = start
                self.first_byte = header[0]
                self.mask = bytes(header[-4:]) if header[1] & 0x80 else b""
            header.clear()
            self._need = 2
            self._payload_left = length
        self.metered_bytes += announced
        return pos, announced

    def _parse(self) -> int | None:
        """The payload length once the whole header is in, else None (and a new ``_need``)."""
        h = self._header
        masked = h[1] & 0x80
        len7 = h[1] & 0x7F
        ext = 2 if len7 == 126 else 8 if len7 == 127 else 0
        need = 2 + ext + (4 if masked else 0)
        if len(h) < need:
            self._need = need
            return None
        if ext == 2:
            return int.from_bytes(h[2:4], "big")
        if ext == 8:
            return int.from_bytes(h[2:10], "big") & 0x7FFF_FFFF_FFFF_FFFF
        return len7


class Unread:
    """The bytes of one connection's reads not yet passed on, consumed from the front.

    An offset instead of slicing off what was taken: a 256 KiB read of 1 KB messages used to
    copy its remaining bytes once per message taken (~32 MB per such read).
    """

    __slots__ = ("_at", "_data")

    def __init__(self) -> None:
        self._data = b""
        self._at = 0

    def __len__(self) -> int:
        return len(self._data) - self._at

    def add(self, data: bytes) -> None:
        """Append a read (the rest of the previous one, if any, is copied once)."""
        self._data = self._data[self._at :] + data if len(self) else data
        self._at = 0

    def view(self) -> memoryview:
        return memoryview(self._data)[self._at :]

    def take(self, nbytes: int) -> bytes:
        """The next ``nbytes`` (all that is left: the read itself, no copy)."""
        data = self._data[self._at : self._at + nbytes]
        self.skip(nbytes)
        return data

    def skip(self, nbytes: int) -> None:
        self._at = min(len(self._data), self._at + nbytes)
        if self._at == len(self._data):  # all passed on: the read is not kept alive
            self.clear()

    def clear(self) -> None:
        self._data = b""
        self._at = 0


def _resizer() -> Callable[[bytearray, int], int] | None:
    try:
        resize = ctypes.pythonapi.PyByteArray_Resize
    except AttributeError:  # pragma: no cover - not CPython
        return None
    resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
    resize.restype = ctypes.c_int
    return cast(Callable[[bytearray, int], int], resize)


_RESIZE = _resizer()


def unfilled(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose content is whatever the allocator had: what
    ``bytearray(size)`` gives without zeroing it (CPython's ``PyByteArray_Resize`` of an empty
    one). For a buffer every byte of which is written before it is read: the zeroing is a whole
    extra pass over a large payload's memory (~11 us per 1.2 MB here, ~15 % of receiving it)."""
    if _RESIZE is None:  # pragma: no cover
        return bytearray(size)
    buffer = bytearray()
    _RESIZE(buffer, size)  # raises MemoryError (ctypes checks the Python error) on failure
    return buffer


class Payload:
    """A large binary message's payload: ONE buffer of its announced size, allocated (not
    zeroed: :func:`unfilled`) when its first granted bytes arrive, never while the grant waits.
    Each read is unmasked (RFC 6455 5.3: byte i is XORed with key[i mod 4], so the key is
    rotated by the read's offset) by websockets' C ``apply_mask`` and copied into its place: the
    same work per byte as unmasking the reads and joining them, without the list of reads (the
    join held two payloads) and with one read's transient at a time. The loop never spends one
    long turn on a whole payload, and the buffer is the message ``recv()`` returns."""

    __slots__ = ("data", "filled", "mask", "size", "view")

    def __init__(self, size: int, mask: bytes) -> None:
        self.size = size
        self.mask = mask
        self.data: bytearray | None = None
        # Written through a memoryview: a bytearray's own slice assignment first copies any
        # value that is not a bytearray (one more pass over every read).
        self.view: memoryview | None = None
        self.filled = 0  # bytes written

    @property
    def left(self) -> int:
        return self.size - self.filled

    def write(self, piece: memoryview) -> bytearray | None:
        """Add the next bytes; the unmasked payload once it is whole."""
        data, view = self.data, self.view
        if data is None or view is None:
            data = self.data = unfilled(self.size)  # every byte is written below
            view = self.view = memoryview(data)
        at, r = self.filled, self.filled & 3
        end = at + len(piece)
        view[at:end] = apply_mask(piece, self.mask[r:] + self.mask[:r])
        self.filled = end
        if end < self.size:
            return None
        view.release()  # the buffer is no longer exported: it may be handed on
        self.data = self.view = None
        return data
