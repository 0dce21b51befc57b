"""The data plane's Prometheus metrics, registered on an injected registry (never the global).

Names follow docs/design.md §5: namespace ``bridge_``, base units, ``_total`` counters, no
per-device labels on high-rate series (label values are small closed sets: transport, reason,
backend).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

from bridge.protocol.errors import WIRE
from bridge.server.governor import Component, Governor

# ``*_created`` series (one per counter/histogram child: 48 of 257 lines on a fresh bridge) carry
# process start times nothing here or in the chart's alerts and dashboard reads. Process-wide.
disable_created_metrics()  # type: ignore[no-untyped-call]

TRANSPORTS = ("ws", "grpc")
# Closed label sets, pre-created at zero so every family has samples from the first scrape (a
# family with no children exports nothing: rate() and absent() alerts see no series at all).
DROP_REASONS = ("drop_oldest",)
SINK_FAILURE_REASONS = ("ack_timeout", "handshake_timeout")
# A Hello's query of the sink's watermarks (protocol.md §10, bridge.server.push_impl.MarksGate):
# why one was not sent, and how sent ones ended.
SINK_MARKS_SKIP_REASONS = ("cached", "in_flight", "rate", "stalled")
SINK_MARKS_RESULTS = ("answered", "timeout", "failed")
UNAUTHORIZED_SURFACES = ("http", "subscribe", "pod")  # pod: internal calls (podfeed)
# A Hello refused for a device whose session is on another live connection challenges that one
# (bridge.server.challenge): what came of it.
CHALLENGE_RESULTS = ("alive", "dead", "skipped", "unchecked")
# Refusals that close a connection (fatal in the wire table): the reasons of connections_closed.
CLOSE_REASONS = tuple(reason for reason, wire in WIRE.items() if wire.fatal)

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
_DECIMATE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.frames_received = Counter(
            "bridge_frames_received_total", "Frames read from edges", ["transport"], registry=r
        )
        self.bytes_received = Counter(
            "bridge_received_bytes_total", "Frame bytes read from edges", ["transport"], registry=r
        )
        self.frames_accepted = Counter(
            "bridge_frames_accepted_total", "Frames admitted into a ring", registry=r
        )
        self.frames_duplicate = Counter(
            "bridge_frames_duplicate_total",
            "Resent frames at or below accepted_seq (re-acked, ignored)",
            registry=r,
        )
        self.frames_delivered = Counter(
            "bridge_frames_delivered_total",
            "Frames acknowledged by the visualization side",
            registry=r,
        )
        self.frames_dropped = Counter(
            "bridge_frames_dropped_total", "Frames dropped, by reason", ["reason"], registry=r
        )
        self.rejected = Counter(
            "bridge_rejected_messages_total",
            "Bad input refused and reported to its sender, by reason",
            ["transport", "reason"],
            registry=r,
        )
        self.backpressure = Counter(
            "bridge_backpressure_pauses_total",
            "Times an edge was paused for a full ring",
            registry=r,
        )
        self.ring_occupancy = Gauge(
            "bridge_ring_occupancy_bytes", "Bytes held in all stream rings", registry=r
        )
        self.ring_capacity = Gauge(
            "bridge_ring_capacity_bytes", "Per-stream ring capacity", registry=r
        )
        self.ring_frames = Gauge(
            "bridge_ring_frames", "Frames held in all stream rings", registry=r
        )
        self.decimation_seconds = Histogram(
            "bridge_decimation_seconds",
            "Time spent in the decimation kernel per frame",
            ["backend"],
            buckets=_DECIMATE_BUCKETS,
            registry=r,
        )
        self.processing_errors = Counter(
            "bridge_processing_errors_total",
            "Frames the decimator refused (delivered raw as passthrough)",
            registry=r,
        )
        self.e2e_latency = Histogram(
            "bridge_end_to_end_latency_seconds",
            "Capture time to sink acknowledgement",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.sessions = Gauge("bridge_sessions", "Attached edge sessions", registry=r)
        self.connections = Gauge(
            "bridge_connections", "Open edge connections", ["transport"], registry=r
        )
        self.subscribers = Gauge("bridge_subscribers", "Connected Subscribe viewers", registry=r)
        self.subscriber_dropped = Counter(
            "bridge_subscriber_dropped_total",
            "Frames a slow subscriber missed (announced to it as gaps)",
            registry=r,
        )
        self.sink_connected = Gauge(
            "bridge_sink_connected", "1 while the push stream to the sink is up", registry=r
        )
        self.sink_reconnects = _AfterFirst(
            Counter(
                "bridge_sink_reconnects_total",
                "Push stream reconnection attempts (the first connection is not counted)",
                registry=r,
            )
        )
        self.sink_replayed = Counter(
            "bridge_sink_replayed_frames_total",
            "Frames resent to the sink after a reconnect",
            registry=r,
        )
        self.workers = Gauge("bridge_workers", "Worker pool size", registry=r)
        self.decimate_backend = Gauge(
            "bridge_decimate_backend",
            "1 for the decimation backend in use",
            ["backend"],
            registry=r,
        )
        self.ready = Gauge("bridge_ready", "1 when ready to accept edges", registry=r)
        self.sink_failures = Counter(
            "bridge_sink_failures_total",
            "Push streams ended by the bridge, by reason (ack_timeout, handshake_timeout, ...)",
            ["reason"],
            registry=r,
        )
        self.sink_marks_queries = Counter(
            "bridge_sink_marks_queries_total",
            "Sink streams opened to ask one device's watermarks before its Welcome, by result"
            " (answered, timeout, failed)",
            ["result"],
            registry=r,
        )
        self.sink_marks_skipped = Counter(
            "bridge_sink_marks_skipped_total",
            "Welcomes that did not ask the sink for the device's watermarks, by reason (cached:"
            " a recent answer served; in_flight, rate: past the limits; stalled: the sink let a"
            " recent query time out)",
            ["reason"],
            registry=r,
        )
        self.session_challenges = Counter(
            "bridge_session_challenges_total",
            "Hellos without the resume token of their device's live session, by what a ping of"
            " its connection showed (alive: answered, the Hello refused; dead: no answer, closed"
            " and replaced; skipped: a challenge of that device in flight or within the last"
            " second, refused; unchecked: gRPC, or not reading, refused)",
            ["result"],
            registry=r,
        )
        self.connections_closed = Counter(
            "bridge_connections_closed_total",
            "Edge connections the bridge closed, by the refusal that closed them",
            ["transport", "reason"],
            registry=r,
        )
        self.pending_connections = Gauge(
            "bridge_pending_connections", "Connections that have not said Hello yet", registry=r
        )
        self.loop_lag = Histogram(
            "bridge_event_loop_lag_seconds",
            "How late the event loop ran a timer (a stall shows here first)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.loop_busy = Counter(
            "bridge_event_loop_busy_seconds_total",
            "Seconds the event loop's thread was running or waiting for a CPU; its rate is the"
            " loop's busy fraction (0-1), the saturation signal the chart's HPA scales on",
            registry=r,
        )
        self.unauthorized = Counter(
            "bridge_unauthorized_requests_total",
            "Requests refused for missing or wrong credentials, by surface",
            ["surface"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends
        self._zero_known_labels()

    def _zero_known_labels(self) -> None:
        for transport in TRANSPORTS:
            self.frames_received.labels(transport)
            self.bytes_received.labels(transport)
            self.connections.labels(transport)
            for reason in WIRE:
                self.rejected.labels(transport, reason)
            for reason in CLOSE_REASONS:
                self.connections_closed.labels(transport, reason)
        for reason in DROP_REASONS:
            self.frames_dropped.labels(reason)
        for reason in SINK_FAILURE_REASONS:
            self.sink_failures.labels(reason)
        for surface in UNAUTHORIZED_SURFACES:
            self.unauthorized.labels(surface)
        for reason in SINK_MARKS_SKIP_REASONS:
            self.sink_marks_skipped.labels(reason)
        for result in SINK_MARKS_RESULTS:
            self.sink_marks_queries.labels(result)
        for result in CHALLENGE_RESULTS:
            self.session_challenges.labels(result)

    def refused(self, transport: str, reason: str) -> None:
        """Count one refusal of an edge's input; a fatal one (the wire table says which) also
        counts the connection it closed."""
        self.rejected.labels(transport, reason).inc()
        if WIRE[reason].fatal:
            self.connections_closed.labels(transport, reason).inc()

    def watch_governor(self, governor: Governor) -> None:
        """Memory series read from the governor at scrape time (never stale)."""
        r = self.registry
        budget = Gauge(
            "bridge_memory_budget_bytes",
            "Data budget: memory limit - baseline - headroom (or the configured cap)",
            registry=r,
        )
        budget.set_function(lambda: governor.budget_bytes)
        reserve = Gauge(
            "bridge_memory_reserve_bytes",
            "Part of the budget kept for forward progress (decimation, pushes in flight)",
            registry=r,
        )
        reserve.set_function(lambda: governor.reserve_bytes)
        charged = Gauge(
            "bridge_memory_charged_bytes",
            "Bytes held for data, by the component holding them",
            ["component"],
            registry=r,
        )
        for component in Component:
            charged.labels(component.value).set_function(
                lambda c=component: governor.charged(c)  # type: ignore[misc]
            )
        waiting = Gauge(
            "bridge_memory_grants_waiting",
            "Receive grants waiting for room (connections not being read)",
            registry=r,
        )
        waiting.set_function(lambda: governor.waiting)
        overdraft = Gauge(
            "bridge_memory_overdraft_peak_bytes",
            "Highest charged - budget seen (forced forward-progress charges only)",
            registry=r,
        )
        overdraft.set_function(lambda: governor.stats.overdraft_peak_bytes)

    def publish_backend(self, name: str | None) -> None:
        """``bridge_decimate_backend{backend}``: 1 for the backend in use, 0 for the others."""
        for backend in ("cuda", "c", "numpy"):
            self.decimate_backend.labels(backend).set(1 if backend == name else 0)


class _AfterFirst:
    """A counter whose first ``inc()`` is ignored: the push loop counts every connection attempt,
    and the first one is a connect, not a reconnect."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self._first = True

    def inc(self, amount: float = 1) -> None:
        if self._first:
            self._first = False
            amount -= 1
        if amount > 0:
            self.counter.inc(amount)
