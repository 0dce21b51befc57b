"""``simbridge serve`` with ``processes`` other than 1: the supervisor's main, with the signals of
a single bridge (SIGTERM or a first SIGINT drains every process; a second SIGINT exits now),
installed by the command line's own ``stop_on_signals``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bridge.config.settings import Settings
from bridge.pod.ops_http import PodOpsServer
from bridge.pod.podmetrics import PodMetrics
from bridge.pod.supervisor import Supervisor
from bridge.protocol.errors import StartupError

log = logging.getLogger("bridge.pod.run")
READY_TIMEOUT_SECONDS = 120.0


async def run_pod(
    settings: Settings,
    serve_argv: list[str],
    ready_line: Callable[[int, int, int], str],
    stop_on_signals: Callable[[Callable[[], None]], None],
) -> bool:
    """Run until SIGTERM; True when every process delivered everything it held.
    ``stop_on_signals``: the command line's signal rules (``bridge.cli.stop_on_signals``)."""
    supervisor = Supervisor(settings, serve_argv)
    stop_on_signals(supervisor.request_stop)
    ops: PodOpsServer | None = None
    try:
        ops = await _start_ops(supervisor, settings)  # first: a busy port starts no process
        try:
            await supervisor.start()
        except BaseException:
            await supervisor.shutdown()  # what started drains again
            raise
        waiting = asyncio.ensure_future(supervisor.all_up.wait())
        stopped = asyncio.ensure_future(supervisor.wait_stopped())
        await asyncio.wait(
            {waiting, stopped}, timeout=READY_TIMEOUT_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        waiting.cancel()
        if supervisor.all_up.is_set():
            print(
                ready_line(supervisor.ws_port, supervisor.grpc_port, supervisor.http_port),
                flush=True,
            )
            log.info(
                "simbridge pod ready: ws :%d grpc :%d http :%d, %d processes",
                supervisor.ws_port,
                supervisor.grpc_port,
                supervisor.http_port,
                supervisor.plan.count if supervisor.plan else 0,
            )
        elif not stopped.done():
            log.error(
                "the planned processes did not all come up within %g s", READY_TIMEOUT_SECONDS
            )
        await stopped
        return await supervisor.shutdown()
    finally:
        if ops is not None:
            await ops.close()


async def _start_ops(supervisor: Supervisor, settings: Settings) -> PodOpsServer:
    metrics = PodMetrics()
    ops = PodOpsServer(
        supervisor,
        metrics,
        token=settings.auth_token,
        metrics_open=settings.metrics_auth == "open",
    )
    try:
        supervisor.http_port = await ops.start(settings.host, settings.http_port)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {settings.host}:{settings.http_port} (HTTP): {exc.strerror}"
        ) from None
    supervisor.metrics = metrics
    supervisor.control.counter = lambda result: metrics.claims.labels(result).inc()
    supervisor.publish_metrics()
    return ops
