"""What Prometheus sees from a bridge that has done nothing yet (issue 33).

A labelled family with no children exports no sample at all, so ``rate()`` and absence alerts
have nothing to work on until the first event; every known label value must be there at zero
from the start. ``_created`` series double the line count for nothing the project reads, and the
first connection to the sink is not a reconnect.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from bridge.protocol.errors import WIRE
from loadgen.sink import SinkServer
from tests.integration.harness import http_get, metric, running_bridge, wait_until

LABELLED_AT_ZERO = {
    "bridge_frames_received": {("transport",): {("ws",), ("grpc",)}},
    "bridge_received_bytes": {("transport",): {("ws",), ("grpc",)}},
    "bridge_frames_dropped": {("reason",): {("drop_oldest",)}},
    "bridge_sink_failures": {("reason",): {("ack_timeout",), ("handshake_timeout",)}},
    "bridge_unauthorized_requests": {("surface",): {("http",), ("subscribe",)}},
    "bridge_connections": {("transport",): {("ws",), ("grpc",)}},
    "bridge_sink_marks_queries": {("result",): {("answered",), ("timeout",), ("failed",)}},
    "bridge_sink_marks_skipped": {
        ("reason",): {("cached",), ("in_flight",), ("rate",), ("stalled",)}
    },
    "bridge_session_challenges": {
        ("result",): {("alive",), ("dead",), ("skipped",), ("unchecked",)}
    },
}


async def _scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        status, body = await http_get(bridge.ports.http, "/metrics")
    assert status == 200
    assert "_created" not in body, [ln for ln in body.splitlines() if "_created" in ln][:3]
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        families[family.name] = [(s.labels, s.value) for s in family.samples]
    return families


async def test_labelled_families_exist_at_zero_on_a_fresh_bridge() -> None:
    families = await _scrape()
    for name, expected in LABELLED_AT_ZERO.items():
        samples = families.get(name, [])
        assert samples, f"{name}: no samples on a fresh bridge"
        ((keys, values),) = expected.items()
        seen = {tuple(labels[k] for k in keys) for labels, _ in samples}
        assert values <= seen, f"{name}: missing {values - seen}"
        assert all(value == 0 for _, value in samples), name
    # Every refusal reason the wire table knows, on both transports.
    rejected = {(lb["transport"], lb["reason"]) for lb, _ in families["bridge_rejected_messages"]}
    assert {(t, r) for t in ("ws", "grpc") for r in WIRE} <= rejected
    closed = {(lb["transport"], lb["reason"]) for lb, _ in families["bridge_connections_closed"]}
    assert {("ws", "hello_timeout"), ("grpc", "too_many_pending")} <= closed


async def test_first_sink_connection_is_not_a_reconnect() -> None:
    sink = SinkServer(fsync=False)
    await sink.start()
    port = sink.port
    async with running_bridge(sink_address=f"127.0.0.1:{port}", passthrough=True) as bridge:
        assert await wait_until(lambda: metric(bridge, "bridge_sink_connected") == 1)
        assert metric(bridge, "bridge_sink_reconnects_total") == 0
        await sink.stop(grace=0)
        assert await wait_until(lambda: metric(bridge, "bridge_sink_connected") == 0)
        sink = SinkServer(listen=f"127.0.0.1:{port}", fsync=False)
        await sink.start()
        assert await wait_until(lambda: metric(bridge, "bridge_sink_connected") == 1)
        assert metric(bridge, "bridge_sink_reconnects_total") >= 1
    await sink.stop()
