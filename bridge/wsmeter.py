"""Counts the payload bytes that WebSocket frame headers announce, as the raw bytes arrive
(sans-I/O: fed the bytes of each read, returns what must be granted).

Why: ``websockets`` reads a connection into its own buffers (up to ``max_queue`` messages of up to
``max_size`` each) whether or not anyone calls ``recv()``. To bound that in bytes, the WebSocket
adapter reads a frame's payload only once the memory governor has granted it, and the payload
size is known from the frame's header before the payload arrives (RFC 6455 §5.2). Control frames
(ping, pong, close: at most 125 bytes each) are not metered.
"""

from __future__ import annotations

_CONTROL = 0x8  # opcodes 0x8-0xF


class FrameMeter:
    """Tracks frame boundaries in the byte stream of one connection."""

    __slots__ = ("_header", "_need", "_payload_left", "frames", "metered_bytes")

    def __init__(self) -> None:
        self._header = bytearray()  # header bytes of the frame being parsed
        self._need = 2  # header bytes needed before the length is known
        self._payload_left = 0  # payload bytes of the current frame still to come
        self.frames = 0  # data frames with a payload whose header was seen
        self.metered_bytes = 0  # payload bytes announced by data frames so far

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
        while pos < end and not announced:
            if self._payload_left:
                step = min(self._payload_left, end - pos)
                self._payload_left -= step
                pos += step
                continue
            take = min(self._need - len(self._header), end - pos)
            self._header += view[pos : pos + take]
            pos += take
            if len(self._header) < self._need:
                break
            length = self._parse()
            if length is None:
                continue  # the header is longer than we thought: read the rest
            opcode = self._header[0] & 0x0F
            self._header.clear()
            self._need = 2
            self._payload_left = length
            if opcode < _CONTROL and length:
                announced = length
                self.frames += 1
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
