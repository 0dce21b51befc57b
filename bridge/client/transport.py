"""The two transports behind one narrow interface: send bytes, receive BridgeMessages, close.

Why so thin: everything the protocol needs (seqs, resend, flow control) lives in the sans-I/O core;
a transport only moves already-serialized ``EdgeMessage`` bytes. Both set their message size cap
deliberately (websockets defaults to 1 MiB and gRPC to 4 MiB, too small for a cloud) and keep
WebSocket compression off (it slows a cloud relay about 30 times).

URLs: ``ws://host:port/v1/ingest``, ``wss://…``, ``grpc://host:port``, ``grpcs://host:port``.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import grpc
import websockets
from websockets.asyncio.client import connect as ws_connect

from bridge.v1 import bridge_pb2 as pb

#: Where a load balancer finds the device id to hash on (docs/protocol.md §1): this header (the
#: WebSocket upgrade; gRPC metadata of the same name) and the WebSocket URL's query parameter.
ROUTING_HEADER = "x-simbridge-device"
ROUTING_QUERY = "device"

Transport = Literal["ws", "grpc"]
#: Linux ioctl: bytes in a TCP socket's send queue not yet sent (``linux/sockios.h``).
SIOCOUTQNSD = 0x894B
#: ``tcpi_delivery_rate`` (u64, bytes/s) in Linux's ``struct tcp_info`` (since 4.9).
_DELIVERY_RATE = 160
_SCHEMES: dict[str, tuple[Transport, bool]] = {
    "ws": ("ws", False),
    "wss": ("ws", True),
    "grpc": ("grpc", False),
    "grpcs": ("grpc", True),
}
_CONNECT = pb.DESCRIPTOR.services_by_name["Ingest"].methods_by_name["Connect"]
#: ``/bridge.v1.Ingest/Connect``, from the descriptor rather than spelled out.
CONNECT_METHOD = f"/{_CONNECT.containing_service.full_name}/{_CONNECT.name}"
#: WebSocket close codes the bridge uses, named in ``EdgeStats.close_reasons``.
WS_CLOSE_NAMES = {
    1000: "normal",
    1001: "going_away",
    1006: "abnormal",
    1007: "malformed",
    1008: "policy",
    1009: "too_big",
    1011: "internal_error",
}


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for ``wss://`` and ``grpcs://``: a CA bundle to trust (default: the system's), an
    optional client certificate and key (mTLS), and an optional server name to verify instead of
    the URL's host."""

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    def grpc_credentials(self) -> Any:
        def read(p: str | Path | None) -> bytes | None:
            return Path(p).read_bytes() if p is not None else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A parsed bridge URL."""

    transport: Transport
    secure: bool
    url: str  # what the transport dials: the WebSocket URL, or host:port for gRPC

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in _SCHEMES or not parts.netloc:
            raise ValueError(
                f"bridge URL must be ws://, wss://, grpc:// or grpcs://host:port, got {url!r}"
            )
        transport, secure = _SCHEMES[parts.scheme]
        if transport == "grpc":
            if parts.path not in ("", "/"):
                raise ValueError(f"a gRPC URL has no path, got {url!r}")
            return cls(transport, secure, parts.netloc)
        return cls(transport, secure, url)


class Connection(Protocol):
    """One connection to the bridge, as the client sees it."""

    async def send(self, data: bytes) -> None: ...
    async def recv(self) -> pb.BridgeMessage | None:
        """The next message, or None once the connection ended."""
        ...

    async def close(self) -> None: ...
    def close_reason(self) -> str: ...
    def close_detail(self) -> str:
        """What the bridge said when it ended the connection (close reason, gRPC status
        details), or ""."""
        ...

    def unsent_bytes(self) -> int:
        """Bytes written but not yet on the wire, as far as this transport can tell (0 when
        it cannot)."""
        ...

    def link_bytes_per_second(self) -> float | None:
        """The connection's recent delivery rate (None when unknown)."""
        ...


async def open_connection(
    endpoint: Endpoint,
    *,
    token: str,
    tls: TlsConfig | None,
    max_message_bytes: int,
    connect_timeout: float,
    send_lowat_bytes: int = 0,
    device_id: str = "",
) -> Connection:
    """Connect; ``device_id`` (when given) goes where a load balancer can hash it."""
    if endpoint.transport == "ws":
        conn = await WsConnection.open(
            endpoint, token, tls, max_message_bytes, connect_timeout, device_id
        )
        if send_lowat_bytes:
            conn.limit_unsent(send_lowat_bytes)
        return conn
    return GrpcConnection(endpoint, token, tls, max_message_bytes, device_id)


def routed_url(url: str, device_id: str) -> str:
    """``url`` with ``?device=<device_id>`` (a query parameter of that name is replaced)."""
    if not device_id:
        return url
    parts = urlsplit(url)
    query = [
        (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != ROUTING_QUERY
    ]
    query.append((ROUTING_QUERY, device_id))
    return urlunsplit(parts._replace(query=urlencode(query)))


class WsConnection:
    """One WebSocket connection; binary messages only."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        token: str,
        tls: TlsConfig | None,
        max_bytes: int,
        connect_timeout: float,
        device_id: str = "",
    ) -> WsConnection:
        extra: dict[str, Any] = {}
        if endpoint.secure:
            tls = tls or TlsConfig()
            extra["ssl"] = tls.ssl_context()
            if tls.server_name:
                extra["server_hostname"] = tls.server_name
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if device_id:
            headers[ROUTING_HEADER] = device_id
        ws = await ws_connect(
            routed_url(endpoint.url, device_id),
            max_size=max_bytes,
            compression=None,
            ping_interval=20,
            open_timeout=connect_timeout,
            additional_headers=headers or None,
            **extra,
        )
        return cls(ws)

    def limit_unsent(self, nbytes: int) -> None:
        """Keep at most about ``nbytes`` unsent in the kernel (``TCP_NOTSENT_LOWAT``): the rest
        waits in the client, where a higher lane can still overtake it."""
        sock = self._ws.transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_NOTSENT_LOWAT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, nbytes)

    def link_bytes_per_second(self) -> float | None:
        sock = self._ws.transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except OSError:
            return None
        if len(info) < _DELIVERY_RATE + 8:
            return None
        rate = int.from_bytes(info[_DELIVERY_RATE : _DELIVERY_RATE + 8], sys.byteorder)
        return float(rate) or None

    def unsent_bytes(self) -> int:
        transport = self._ws.transport
        queued = int(transport.get_write_buffer_size())
        sock = transport.get_extra_info("socket")
        if sock is None:
            return queued
        try:
            raw = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
        except OSError:
            return queued
        return queued + int.from_bytes(raw, sys.byteorder, signed=True)

    async def send(self, data: bytes) -> None:
        await self._ws.send(data)

    async def recv(self) -> pb.BridgeMessage | None:
        try:
            data = await self._ws.recv()
        except websockets.ConnectionClosed:
            return None
        if isinstance(data, str):
            raise ValueError("bridge sent a text frame; the protocol is binary")
        return pb.BridgeMessage.FromString(data)

    async def close(self) -> None:
        await self._ws.close()

    def close_detail(self) -> str:
        return self._ws.close_reason or ""

    def close_reason(self) -> str:
        code = self._ws.close_code
        if code is None:
            return "ws:none"
        return f"ws:{code}:{WS_CLOSE_NAMES[code]}" if code in WS_CLOSE_NAMES else f"ws:{code}"


class GrpcConnection:
    """One ``Ingest.Connect`` call on its own channel, written with ``call.write``.

    Why not a request iterator: grpc.aio consumes one in a task of its own, which stays parked
    on the iterator when the call is cancelled, so every reconnect left a pending task behind.
    Direct writes have no such task, wait for HTTP/2 flow control, and take the prepared bytes
    as they are (no parse and re-serialize per frame).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        token: str,
        tls: TlsConfig | None,
        max_bytes: int,
        device_id: str = "",
    ) -> None:
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.max_receive_message_length", max_bytes),
            # Channels to one target share subchannels by default, and a shared subchannel in
            # gRPC's own reconnect backoff fails every new call at once: the client's reconnect
            # loop would keep failing after the bridge is back. One pool per channel.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if endpoint.secure:
            tls = tls or TlsConfig()
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.aio.secure_channel(
                endpoint.url, tls.grpc_credentials(), options=options
            )
        else:
            self._channel = grpc.aio.insecure_channel(endpoint.url, options=options)
        connect = self._channel.stream_stream(
            CONNECT_METHOD,
            request_serializer=None,  # the core hands out serialized EdgeMessages
            response_deserializer=pb.BridgeMessage.FromString,
        )
        metadata = [("authorization", f"Bearer {token}")] if token else []
        if device_id:
            metadata.append((ROUTING_HEADER, device_id))
        self._call = connect(metadata=tuple(metadata) or None)
        self._status = ""
        self._details = ""

    async def send(self, data: bytes) -> None:
        try:
            await self._call.write(data)
        except grpc.aio.AioRpcError as exc:
            self._status, self._details = exc.code().name, exc.details() or ""
            raise

    async def recv(self) -> pb.BridgeMessage | None:
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            self._status, self._details = exc.code().name, exc.details() or ""
            return None
        if msg is grpc.aio.EOF:
            self._status = "OK"
            return None
        assert isinstance(msg, pb.BridgeMessage)
        return msg

    async def close(self) -> None:
        self._call.cancel()
        await self._channel.close()

    def unsent_bytes(self) -> int:
        return 0  # gRPC's socket is not ours to look at

    def link_bytes_per_second(self) -> float | None:
        return None

    def close_reason(self) -> str:
        return f"grpc:{self._status or 'CANCELLED'}"

    def close_detail(self) -> str:
        return self._details
