"""What every edge connection is configured with, derived from the bridge's settings in one place
(:mod:`bridge.server.ingest` reads it; the app builds it once)."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.config.credentials import DeviceTokenFile
from bridge.config.settings import Settings
from bridge.protocol import codec
from bridge.server.chunks import DEFAULT_MAX_AGE_SECONDS
from bridge.server.uplink import REFUSED_DECODE_BUDGET_BYTES


@dataclass(frozen=True, slots=True)
class IngestConfig:
    limits: codec.Limits
    auth_token: str = ""
    ack_interval_seconds: float = 0.01
    ack_accepted_delay_seconds: float = 0.05
    reconnect_after_ms: int = 1000
    hello_timeout_seconds: float = 5.0
    max_pending_connections: int = 256
    device_tokens: DeviceTokenFile | None = None
    bind_device_to_certificate: bool = False
    # Incomplete chunked frames (docs/protocol.md §3.2): dropped at this age, checked this
    # often while any are held; a connection that holds them this long without completing a
    # frame is closed.
    chunk_max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS
    chunk_stall_seconds: float = 30.0
    chunk_check_interval_seconds: float = 0.25
    refused_decode_budget_bytes: int = REFUSED_DECODE_BUDGET_BYTES

    @classmethod
    def from_settings(cls, settings: Settings, limits: codec.Limits) -> IngestConfig:
        return cls(
            limits=limits,
            auth_token=settings.auth_token,
            ack_interval_seconds=settings.ack_interval_seconds,
            ack_accepted_delay_seconds=settings.ack_accepted_delay_seconds,
            reconnect_after_ms=settings.reconnect_after_ms,
            hello_timeout_seconds=settings.hello_timeout_seconds,
            max_pending_connections=settings.max_pending_connections,
            bind_device_to_certificate=settings.bind_device_to_certificate,
            chunk_max_age_seconds=settings.chunk_max_age_seconds,
            chunk_stall_seconds=settings.chunk_stall_seconds,
            chunk_check_interval_seconds=settings.chunk_check_interval_seconds,
            refused_decode_budget_bytes=settings.refused_decode_budget_bytes,
            device_tokens=(
                DeviceTokenFile(
                    settings.device_tokens_file,
                    check_seconds=settings.device_tokens_check_seconds,
                )
                if settings.device_tokens_file
                else None
            ),
        )
