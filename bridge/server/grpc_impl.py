"""gRPC adapters on one ``grpc.aio`` server: ``Ingest.Connect`` (edges),
``Visualization.Subscribe`` (viewers) and the standard ``grpc.health.v1`` service.

Handlers are registered with raw-bytes (de)serializers: ingest bytes go through the same codec as
WebSocket messages (one set of limits and errors), and subscribers receive the already-serialized
processed frames without a parse/serialize round trip.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from bridge.config.settings import Settings
from bridge.protocol.errors import FrameTooLarge, ProtocolError, TooManySessions
from bridge.server.governor import Charge, Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.podfeed import POD_SECRET_METADATA, PodFeed, PodSubscriptions, SiblingSource
from bridge.server.ports import Edges, Received
from bridge.server.subscribers import Subscriber
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.grpc")

SERVICE_INGEST = "bridge.v1.Ingest"
SERVICE_VISUALIZATION = "bridge.v1.Visualization"


_FIRST_GRANT = 64 * 1024  # before the first message: what a Hello may take


class GrpcTransport:
    """Pulls the next message only after the governor granted its expected size.

    gRPC gives no message size before the message is read, so the grant is sized by the
    previous message and corrected once the real size is known: a message larger than its
    grant is charged in full (forced, counted as overdraft when over budget) and the next read
    waits for a grant of that size. Beyond grants, a call holds at most one HTTP/2 stream
    window (fixed, BDP probing is off) until we read; :func:`build_server` charges that window
    for as long as the call is open.

    A message above ``max_frame_bytes`` is refused here, before any parsing, as websockets'
    ``max_size`` refuses it on the WebSocket side: every EdgeMessage meets one size rule,
    whichever path (split cloud, batch, parse) would take it next.
    """

    name = "grpc"

    def __init__(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        governor: Governor,
        max_frame_bytes: int = Settings.max_frame_bytes,
    ) -> None:
        self.context = context
        self.governor = governor
        self.max_frame_bytes = max_frame_bytes
        self.expected = _FIRST_GRANT
        self.first = True
        self._notify: Callable[[bool], None] | None = None
        self._waiting: asyncio.Future[Charge | None] | None = None  # a queued grant's future

    def on_wait(self, notify: Callable[[bool], None]) -> None:
        self._notify = notify

    def _granted(self, charge: Charge | None) -> None:
        future = self._waiting
        if future is None or future.cancelled():
            if charge is not None:
                charge.release()
        else:
            future.set_result(charge)

    async def _grant(self, nbytes: int) -> Charge:
        nbytes = min(nbytes, max(1, self.governor.admissible_bytes))
        got = self.governor.request(Component.TRANSPORT, nbytes, self._granted, self)
        if isinstance(got, Charge):  # the common case: no future, no wake-up
            return got
        if got is None:
            raise FrameTooLarge("the memory budget leaves no room for a message")
        future: asyncio.Future[Charge | None] = asyncio.get_running_loop().create_future()
        self._waiting = future
        if self._notify is not None:
            self._notify(True)
        try:
            charge = await future
        except asyncio.CancelledError:
            self.governor.cancel(got)
            if future.done() and not future.cancelled() and (late := future.result()):
                late.release()  # granted, then cancelled before this task resumed
            raise
        finally:
            self._waiting = None
            if self._notify is not None:
                self._notify(False)
        if charge is None:
            raise FrameTooLarge("the memory budget fell below the size of this call's messages")
        return charge

    async def recv(self) -> Received | None:
        if self.first:  # the Hello never queues behind the data of others
            self.first = False
            charge = self.governor.force(Component.TRANSPORT, _FIRST_GRANT, self)
        else:
            charge = await self._grant(self.expected)
        with charge:  # released on every path but the message's, where it is transferred
            try:
                data = await self.context.read()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return None
            if data is grpc.aio.EOF:
                return None
            if len(data) > self.max_frame_bytes:
                raise FrameTooLarge(
                    f"message of {len(data)} bytes exceeds max {self.max_frame_bytes}"
                )
            raw = bytes(data)
            charge.resize(len(raw))  # a larger message than granted is forced in (see above)
            self.expected = max(len(raw), 1)
            return Received(raw, charge.transfer())

    async def send(self, data: bytes) -> None:
        try:
            await self.context.write(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a peer that just cancelled fails the write in several ways
            # (AioRpcError, InvalidStateError, cygrpc's ExecuteBatchError): all mean "gone".
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from None

    async def reject(self, error: ProtocolError) -> None:
        self.context.set_code(grpc.StatusCode[error.wire.grpc_status])
        self.context.set_details(str(error))

    async def close_going_away(self, reason: str = "bridge shutting down") -> None:
        self.context.set_code(grpc.StatusCode.UNAVAILABLE)
        self.context.set_details(reason)

    async def ping(self, seconds: float) -> bool | None:
        """None: grpc.aio offers no ping of one call (the HTTP/2 keepalive set up in
        :func:`build_server` is gRPC core's, per connection), so a Hello for this device's id
        is refused as before the challenge existed."""
        return None


def _certificate_names(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[str]:
    """CN and subject alternative names of a verified client certificate (mTLS), else empty."""
    auth = context.auth_context() or {}
    names = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return frozenset(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def _bearer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if (
            key == "authorization"
            and isinstance(value, str)
            and value.lower().startswith("bearer ")
        ):
            return value[7:]
    return ""


def _pod_secret(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The pod secret an internal call presents (None: a viewer's call)."""
    for key, value in context.invocation_metadata() or ():
        if key == POD_SECRET_METADATA:
            return value if isinstance(value, str) else ""
    return None


def build_server(
    settings: Settings,
    edges: Edges,
    subscribers: PodSubscriptions,
    metrics: BridgeMetrics,
    governor: Governor,
    pod: Callable[[], SiblingSource | None] | None = None,
) -> tuple[grpc.aio.Server, health_aio.HealthServicer]:
    """``pod``: in a pod's worker, returns the pod link (``service.podlink``; None outside a
    pod), read at each Subscribe call. A viewer's call then also relays the other processes'
    frames (:class:`bridge.server.podfeed.PodFeed`), and an internal call from one of them is
    checked against the pod secret and served this process's devices only."""
    # Receive cap: gRPC's own default (4 MiB) is too small. The 64 KiB above max_frame_bytes
    # lets a message just over the limit reach GrpcTransport.recv, which refuses it with the
    # bridge's own error and counts it; beyond the cap gRPC refuses it itself (same status).
    max_msg = settings.max_frame_bytes + 64 * 1024
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_msg),
            ("grpc.max_send_message_length", max_msg),
            ("grpc.keepalive_time_ms", int(settings.ping_interval_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", int(settings.ping_timeout_seconds * 1000)),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
            # Peers that ping more often than allowed are sent GOAWAY after this many strikes.
            ("grpc.http2.max_ping_strikes", 2),
            # A TCP connection that never completes the HTTP/2 handshake (the client preface
            # and SETTINGS) is dropped after the Hello deadline, so raw sockets cannot pile up.
            ("grpc.server_handshake_timeout_ms", int(settings.hello_timeout_seconds * 1000)),
            # A connection with no call for a while is closed (edges keep their one call open).
            ("grpc.max_connection_idle_ms", int(settings.session_ttl_seconds * 1000)),
            # A fixed window, never grown by BDP probing: unread bytes per call stay bounded by
            # what each call is charged (see connect).
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", settings.grpc_window_bytes),
            # gRPC sets SO_REUSEPORT unless told not to: a second bridge on this port would then
            # start and take a share of the connections (and of reconnecting edges' sessions).
            ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
        ]
    )
    viewer_token = settings.viewer_token or settings.auth_token

    async def connect(
        _request_iterator: object, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        # What the edge may send ahead of our reads is charged while the call is open, so a
        # larger window is paid for in sessions rather than hidden from the budget.
        window = governor.try_charge(Component.TRANSPORT, settings.grpc_window_bytes, pinned=True)
        if window is None:
            metrics.refused("grpc", TooManySessions.reason)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"no memory for another gRPC call's {settings.grpc_window_bytes}-byte receive "
                f"window (budget {governor.budget_bytes} bytes)",
            )
            return  # abort raises; this line is for the type checker
        transport = GrpcTransport(context, governor, settings.max_frame_bytes)
        with window:
            try:
                await edges.serve(transport, _bearer(context), _certificate_names(context))
            except ProtocolError as exc:  # refused by the transport itself (size, memory grant)
                metrics.refused("grpc", exc.reason)
                await transport.reject(exc)
            finally:
                governor.end_owner(transport, "gRPC call")  # debug mode: no grant left behind

    async def subscribe(
        request_bytes: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        source = pod() if pod is not None else None
        presented = _pod_secret(context)
        internal = presented is not None
        if presented is not None:  # a sibling's call: the pod secret, never a viewer token
            if (
                source is None
                or not source.secret
                or not hmac.compare_digest(presented.encode(), source.secret.encode())
            ):
                metrics.unauthorized.labels("pod").inc()
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "pod secret required")
        elif viewer_token and not hmac.compare_digest(
            _bearer(context).encode(), viewer_token.encode()
        ):
            metrics.unauthorized.labels("subscribe").inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "viewer bearer token required")
        try:
            request = pb.SubscribeRequest.FromString(request_bytes)
        except DecodeError:
            metrics.rejected.labels("grpc", "malformed").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a valid SubscribeRequest")
        if len(subscribers) >= settings.max_subscribers:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many subscribers")
        queue_frames = min(
            request.queue_frames or settings.subscriber_queue_frames,
            settings.subscriber_queue_frames,
        )
        sub = Subscriber(set(request.stream_ids), queue_frames)
        try:
            backlog = subscribers.attach(sub, request.from_bridge_seq)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        metrics.subscribers.set(len(subscribers))
        feed = None
        if source is not None and not internal:
            feed = PodFeed(
                source,
                sub,
                subscribers,
                request,
                window_bytes=settings.grpc_window_bytes,
                max_message_bytes=max_msg,
                on_dropped=metrics.subscriber_dropped.inc,
            )
            feed.start()
        try:
            for data in backlog:
                yield data
            while True:
                item = await sub.get()
                if item is None:
                    return
                yield item
        finally:
            if feed is not None:
                await feed.close()  # before detach: nothing is queued for sub after this
            subscribers.detach(sub)
            metrics.subscribers.set(len(subscribers))

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE_INGEST, {"Connect": grpc.stream_stream_rpc_method_handler(connect)}
            ),
            grpc.method_handlers_generic_handler(
                SERVICE_VISUALIZATION,
                {"Subscribe": grpc.unary_stream_rpc_method_handler(subscribe)},
            ),
        )
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return server, health


async def set_health(health: health_aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for service in ("", SERVICE_INGEST, SERVICE_VISUALIZATION):
        await health.set(service, status)
