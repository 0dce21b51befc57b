"""TLS material from settings, for each transport's own API (PEM files read once at startup).

WebSocket ingest takes an ``ssl.SSLContext``; gRPC takes credentials objects. Keeping both here
means one place decides what "TLS on" and "clients must present a certificate" mean.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc

from bridge.config.settings import Settings


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """WSS context, or None for plaintext. With a client CA, edges must present a certificate."""
    if not settings.tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file:
        ctx.load_verify_locations(settings.tls_client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def grpc_server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert_file:
        return None
    client_ca = _read(settings.tls_client_ca_file) if settings.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(_read(settings.tls_key_file), _read(settings.tls_cert_file))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def sink_channel_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """Credentials for the push connection to the sink (TLS, or mTLS with a client pair)."""
    if not settings.sink_ca_file:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(settings.sink_ca_file),
        private_key=_read(settings.sink_key_file) if settings.sink_key_file else None,
        certificate_chain=_read(settings.sink_cert_file) if settings.sink_cert_file else None,
    )


def certificate_names(transport: asyncio.BaseTransport | None) -> frozenset[str]:
    """CN and subject alternative names of the peer's verified certificate (mTLS), else empty."""
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return frozenset()
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    names += [value for _kind, value in cert.get("subjectAltName", ())]
    return frozenset(str(n) for n in names)
