"""Protobuf wire-format helpers for the few places that splice encodings by hand.

Splicing (prefixing an already-serialized payload with its field key and length instead of
re-encoding it) saves a copy of a 1 MB cloud per frame. The field numbers come from the generated
descriptors, never from literals, so a renumbered field in ``bridge.proto`` changes the splice with
it; ``tests/unit/test_wire.py`` checks every splice against the real protobuf encoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

Part = bytes | memoryview
"""A piece of a message that is joined only when written: serialized bytes, or a view of
received bytes (a passthrough cloud's points) that is never copied before then."""


class _Field(Protocol):
    @property
    def number(self) -> int: ...


class Descriptor(Protocol):
    """A generated message's ``DESCRIPTOR`` (pure-Python or upb: both fit)."""

    @property
    def name(self) -> str: ...
    @property
    def fields_by_name(self) -> Mapping[str, _Field]: ...


WIRE_VARINT = 0
WIRE_LEN = 2


def encode_varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer."""
    if value < 0:
        raise ValueError("varints here are unsigned")
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:  # a frame's length or a bridge_seq up to 16k: two bytes, no loop
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf: bytes | memoryview, i: int) -> tuple[int, int]:
    """The varint at ``buf[i]``: (value, index after it). Raises ``IndexError`` when truncated."""
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
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def field_number(message: Descriptor, name: str) -> int:
    """The number of ``message.name`` from the generated descriptor (KeyError if it is gone)."""
    return int(message.fields_by_name[name].number)


def field_key(message: Descriptor, name: str, wire_type: int = WIRE_LEN) -> bytes:
    """The encoded key (tag) of a field: ``number << 3 | wire_type`` as a varint."""
    return encode_varint(field_number(message, name) << 3 | wire_type)


def key_byte(message: Descriptor, name: str, wire_type: int = WIRE_LEN) -> int:
    """The one key byte of a field numbered below 16 (what a scanner compares with ``buf[0]``)."""
    key = field_key(message, name, wire_type)
    if len(key) != 1:
        raise ValueError(f"{message.name}.{name} has a multi-byte key")
    return key[0]


def length_prefix(key: bytes, length: int) -> bytes:
    """Key plus length of a length-delimited field whose ``length`` bytes follow."""
    return key + encode_varint(length)


def repeated_spans(
    buf: bytes | memoryview, key: bytes, limit: int | None = None
) -> list[tuple[int, int]]:
    """(start, end) of every ``key`` field in a message made only of that repeated
    length-delimited field (a batch); no payload is copied. Raises ``ValueError`` on any other
    content or a truncated value. With ``limit``, stops after that many spans (the rest of
    ``buf`` unread): a caller that refuses more than N asks for N + 1, and 16 MiB of empty
    fields cost it N + 1 steps of this loop, not 8 million."""
    spans: list[tuple[int, int]] = []
    i, n, k = 0, len(buf), len(key)
    while i < n and (limit is None or len(spans) < limit):
        if bytes(buf[i : i + k]) != key:
            raise ValueError(f"unexpected field at byte {i}")
        length, i = decode_varint(buf, i + k)
        end = i + length
        if end > n:
            raise ValueError("truncated field")
        spans.append((i, end))
        i = end
    return spans
