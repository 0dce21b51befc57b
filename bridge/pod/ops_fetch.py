"""A GET to an ingest process's internal ops HTTP (``127.0.0.1:port``), for the pod's ops port.

Why not urllib or an HTTP library: one bounded GET on the supervisor's event loop (no thread per
fetch), with one deadline for connect, send and read, a cap on what is read, and an answer that
says why it failed in the words the scrape-error metric counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

READ_CHUNK = 65536
MAX_HEAD_BYTES = 16384  # the response's status line and headers


@dataclass(frozen=True, slots=True)
class Fetched:
    """A 200's body, or ``error``: one of unreachable, timeout, status, too_large."""

    body: bytes | None
    error: str = ""
    detail: str = ""
    status: int = 0  # the response's status (0: none)
    said: bytes = b""  # its body whatever the status


async def fetch(address: str, path: str, *, token: str, max_body: int, seconds: float) -> Fetched:
    """GET ``path`` from ``address`` ("host:port"), with ``Authorization: Bearer <token>`` when
    a token is set, within ``seconds`` and at most ``max_body`` bytes of body."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        port_number = int(port)
    except ValueError:
        return Fetched(None, "unreachable", f"not host:port: {address!r}")
    try:
        async with asyncio.timeout(seconds):
            return await _request(host, port_number, address, path, token, max_body)
    except TimeoutError:
        return Fetched(None, "timeout", f"no answer within {seconds:g} s")
    except OSError as exc:
        return Fetched(None, "unreachable", str(exc))


async def post(
    address: str, path: str, *, token: str, max_body: int, seconds: float
) -> tuple[int, bytes]:
    """POST ``path`` (no body) to ``address``: the answer's status and body, whatever the status
    (a route's 4xx is an answer to pass on); (0, reason) when there was none."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(seconds):
            got = await _request(
                host.strip("[]"), int(port), address, path, token, max_body, "POST"
            )
    except (TimeoutError, OSError, ValueError) as exc:
        return 0, str(exc).encode() or b"timeout"
    return got.status, got.said or got.detail.encode()


async def _request(
    host: str, port: int, address: str, path: str, token: str, limit: int, method: str = "GET"
) -> Fetched:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        length = "Content-Length: 0\r\n" if method == "POST" else ""
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {address}\r\n{auth}{length}"
            "Connection: close\r\n\r\n".encode()
        )
        data = bytearray()
        while chunk := await reader.read(READ_CHUNK):
            data += chunk
            if len(data) > limit + MAX_HEAD_BYTES:
                return Fetched(None, "too_large", f"over {limit} bytes")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return _response(bytes(data), limit)


def _response(data: bytes, limit: int) -> Fetched:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or len(head) > MAX_HEAD_BYTES:
        return Fetched(None, "status", "no complete response head")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return Fetched(None, "status", lines[0][:100].decode("latin-1"))
    status = int(parts[1])
    length: int | None = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and value.strip().lower() != b"identity":
            return Fetched(None, "status", "chunked responses are not read")
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return Fetched(None, "status", "bad content-length")
    if len(body) > limit or (length is not None and length > limit):
        return Fetched(None, "too_large", f"over {limit} bytes")
    if length is not None and len(body) != length:
        return Fetched(None, "unreachable", f"body of {len(body)} bytes, {length} announced")
    if status != 200:  # no body to use; what it said is kept for a POST's caller
        return Fetched(None, "status", lines[0][:100].decode("latin-1"), status, body)
    return Fetched(body, status=status, said=body)
