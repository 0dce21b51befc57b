"""The replicas run's calls on a replica's ops port: ``POST /admin/rebalance`` after the scale-up,
and the attached sessions (``bridge_sessions``) to see where the devices are."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


async def request(
    port: int, method: str, path: str, token: str, read_seconds: float = 10.0
) -> tuple[int, str]:
    """One HTTP/1.1 request to 127.0.0.1:``port`` with the bearer token: status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: replica\r\nAuthorization: Bearer {token}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), read_seconds)
    finally:
        writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def rebalance(port: int, token: str, spread_seconds: float) -> dict[str, Any]:
    """Ask a replica to drain its edges over ``spread_seconds``; its JSON answer (202)."""
    status, body = await request(
        port, "POST", f"/admin/rebalance?spread_seconds={spread_seconds:g}", token
    )
    if status != 202:
        raise RuntimeError(f"rebalance on :{port}: {status} {body.strip()}")
    answer: dict[str, Any] = json.loads(body)
    return answer


async def sessions(port: int, token: str) -> int:
    """The replica's attached sessions (one per connected device)."""
    status, body = await request(port, "GET", "/metrics", token)
    if status != 200:
        raise RuntimeError(f"/metrics on :{port}: {status}")
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "bridge_sessions"
    )
