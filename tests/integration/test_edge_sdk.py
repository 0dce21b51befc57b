"""The edge SDK's delivery suite against the real bridge and the reference sink, on both transports.

The connection is cut by a TCP relay between the edge and the bridge (both sockets aborted, as a
network failure would), so the edge, the bridge and the sink all see a real broken connection.
The sink's record is the judge: every published frame delivered exactly once, none lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.client import DeliveryTimeout, EdgeClient, StreamSpec, SyncEdgeClient, TlsConfig
from bridge.server.app import BridgeService
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration import test_tls
from tests.integration.harness import metric, running_bridge, wait_until

TRANSPORTS = ["ws", "grpc"]


class TcpRelay:
    """Forwards 127.0.0.1:port to a target port; ``cut()`` aborts every relayed connection."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._pairs.append((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
        dst.transport.abort()

    def cut(self) -> None:
        for a, b in self._pairs:
            a.transport.abort()
            b.transport.abort()
        self._pairs.clear()
        self.cuts += 1


def url_for(transport: str, port: int, secure: bool = False) -> str:
    scheme = transport + ("s" if secure else "")
    return f"{scheme}://127.0.0.1:{port}" + ("/v1/ingest" if transport == "ws" else "")


def port_of(bridge: BridgeService, transport: str) -> int:
    assert bridge.ports is not None
    return bridge.ports.ws if transport == "ws" else bridge.ports.grpc


def cloud(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-20, 20, (n, 3)).astype(np.float32)


@contextlib.asynccontextmanager
async def bridge_and_sink(**overrides: Any) -> AsyncIterator[tuple[BridgeService, SinkServer]]:
    async with (
        SinkServer(fsync=False) as sink,
        running_bridge(sink_address=sink.address, passthrough=True, **overrides) as bridge,
    ):
        yield bridge, sink


def assert_exactly_once(sink: SinkServer, frames: int) -> None:
    totals = sink.record.totals()
    assert totals["delivered"] == frames, totals
    assert totals["duplicates"] == totals["lost"] == totals["gap_frames"] == 0, totals
    assert totals["reorders"] == 0, totals


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cut_connections_resume_with_no_loss_and_no_duplicate(transport: str) -> None:
    streams = [StreamSpec("lidar"), StreamSpec("status", kind="telemetry")]
    async with bridge_and_sink() as (bridge, sink), TcpRelay(port_of(bridge, transport)) as relay:
        url = url_for(transport, relay.port)
        async with EdgeClient(url, device_id="robot-1", streams=streams, seed=1) as edge:
            for i in range(60):
                await edge.publish("lidar", cloud(300, i))
                await edge.publish("status", {"battery": 1.0 - i / 100})
                if i in (20, 40):
                    # Connected again since the last cut (on a fast machine the 20 publishes
                    # after it can all happen before the edge even notices that cut).
                    assert await edge.wait_for(
                        lambda cuts=relay.cuts: edge.connected and edge.stats.reconnects >= cuts,
                        10,
                    )
                    relay.cut()  # frames in flight, others buffered or being written
            await edge.drain(timeout=20)
            assert edge.stats.reconnects >= 2 and edge.stats.disconnects >= 2
            assert edge.stats.resent >= 1 or edge.stats.sent == 120
            assert edge.stats.dropped == 0 and edge.undelivered == 0
        assert_exactly_once(sink, 120)
        assert sink.record.streams[("robot-1", "lidar")].delivered == 60


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_restarted_device_process_continues_its_streams(transport: str) -> None:
    async with bridge_and_sink() as (bridge, sink):
        url = url_for(transport, port_of(bridge, transport))
        for run in range(3):  # three processes in turn, each with fresh client state
            edge = EdgeClient(url, device_id="robot-1", streams=[StreamSpec("lidar")])
            async with edge:
                seqs = [await edge.publish("lidar", cloud(50, run * 10 + i)) for i in range(4)]
                await edge.drain(timeout=20)
            assert seqs == list(range(run * 4 + 1, run * 4 + 5))
        assert_exactly_once(sink, 12)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_publish_waits_during_pause_and_loses_nothing(transport: str, free_port: int) -> None:
    frame_bytes = 300 * 12
    # The sink is down at first: nothing gets delivered, the small ring fills, the bridge pauses.
    async with running_bridge(
        sink_address=f"127.0.0.1:{free_port}",
        passthrough=True,
        max_frame_bytes=20_000,
        # the data budget also holds the session's own state (24 KiB) and, on gRPC, the call's
        # receive window (64 KiB), see README "Memory model"
        ring_budget_bytes=8 * frame_bytes + 128 * 1024,
    ) as bridge:
        url = url_for(transport, port_of(bridge, transport))
        edge = EdgeClient(url, device_id="dev", streams=[StreamSpec("lidar")])
        async with edge:
            published = 0
            stream = edge.core.streams["lidar"]
            for i in range(200):  # one at a time until the bridge says PAUSE
                await edge.publish("lidar", cloud(300, i))
                published += 1
                await edge.wait_for(
                    lambda n=published: edge.core.paused("lidar") or stream.accepted == n, 5.0
                )
                if edge.core.paused("lidar"):
                    break
            assert edge.core.paused("lidar"), "the ring never filled"
            waiting = asyncio.create_task(edge.publish("lidar", cloud(300, 999)))
            await asyncio.sleep(0.3)
            assert not waiting.done(), "publish must wait while the stream is paused"
            assert edge.stats.published == published
            async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False) as sink:
                assert await asyncio.wait_for(waiting, 20) == published + 1
                await edge.drain(timeout=20)
                assert_exactly_once(sink, published + 1)
            assert edge.stats.pauses >= 1 and edge.stats.dropped == 0
        assert metric(bridge, "bridge_frames_dropped_total", reason="drop_oldest") == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_drain_raises_until_the_sink_has_everything(transport: str, free_port: int) -> None:
    async with running_bridge(sink_address=f"127.0.0.1:{free_port}", passthrough=True) as bridge:
        url = url_for(transport, port_of(bridge, transport))
        async with EdgeClient(url, device_id="dev", streams=[StreamSpec("lidar")]) as edge:
            for i in range(3):
                await edge.publish("lidar", cloud(100, i))
            with pytest.raises(DeliveryTimeout) as info:
                await edge.drain(timeout=0.5)
            assert info.value.undelivered == 3
            assert await wait_until(lambda: edge.stats.accepted == 3)  # accepted is not enough
            async with SinkServer(listen=f"127.0.0.1:{free_port}", fsync=False) as sink:
                await edge.drain(timeout=20)
                assert_exactly_once(sink, 3)
            assert edge.stats.delivered == 3


# ---------------------------------------------------------------------------------------------
# TLS (certificates made by openssl, as in test_tls.py)


pki = test_tls.pki  # the fixture: a CA, a server and a client certificate
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not found")


@needs_openssl
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_mtls_and_token_with_a_cut_connection(transport: str, pki: Path) -> None:
    tls_files = {
        "tls_cert_file": str(pki / "server.pem"),
        "tls_key_file": str(pki / "server.key"),
        "tls_client_ca_file": str(pki / "ca.pem"),
    }
    tls = TlsConfig(
        ca_file=pki / "ca.pem", cert_file=pki / "client.pem", key_file=pki / "client.key"
    )
    async with (
        bridge_and_sink(auth_token="s3cret", **tls_files) as (bridge, sink),
        TcpRelay(port_of(bridge, transport)) as relay,
    ):
        url = url_for(transport, relay.port, secure=True)
        streams = [StreamSpec("lidar")]
        async with EdgeClient(url, device_id="d", streams=streams, token="s3cret", tls=tls) as e:
            for i in range(10):
                await e.publish("lidar", cloud(200, i))
                if i == 5:
                    relay.cut()
            await e.drain(timeout=20)
            assert e.stats.reconnects >= 1
        assert_exactly_once(sink, 10)

        no_cert = TlsConfig(ca_file=pki / "ca.pem")
        wrong_token = {"token": "nope", "tls": tls}
        # Without a client certificate the TLS handshake fails (retried until the timeout); a
        # wrong token is refused for good at once, in the bridge's words.
        refusals = {"no Welcome": no_cert, "wrong bearer token": None}
        for match, tls_kw in refusals.items():
            kw = {"token": "s3cret", "tls": tls_kw} if tls_kw is not None else wrong_token
            edge = EdgeClient(url, device_id="x", streams=streams, **kw)  # type: ignore[arg-type]
            with pytest.raises(ConnectionError, match=match):
                await edge.start(timeout=1.0)
        assert sink.record.totals()["delivered"] == 10


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sync_client_publishes_arrays_from_a_plain_thread(transport: str) -> None:
    received: list[pb.ProcessedFrame] = []
    xyzi = np.zeros(50, dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("intensity", "u1")])
    xyzi["x"] = np.arange(50)
    xyzi["intensity"] = 7
    xyz = cloud(40, 3)

    def device() -> tuple[int, int]:
        streams = [StreamSpec("lidar"), StreamSpec("status", kind="telemetry")]
        url = url_for(transport, port_of(bridge, transport))
        with SyncEdgeClient(url, device_id="sim", streams=streams) as edge:
            seqs = (edge.publish("lidar", xyzi), edge.publish("lidar", xyz))
            edge.publish("status", {"battery": 0.8})
            edge.drain(timeout=20)
            return seqs[0], edge.stats.delivered

    async with (
        SinkServer(fsync=False, on_frame=received.append) as sink,
        running_bridge(sink_address=sink.address, passthrough=True) as bridge,
    ):
        assert await asyncio.to_thread(device) == (1, 3)
        assert_exactly_once(sink, 3)
    clouds = {f.seq: f.point_cloud for f in received if f.stream_id == "lidar"}
    assert clouds[1].point_stride == 13 and clouds[1].data == xyzi.tobytes()
    assert clouds[2].point_stride == 12 and clouds[2].data == xyz.tobytes()
    status = next(f for f in received if f.stream_id == "status")
    assert dict(status.telemetry.values) == {"battery": 0.8}


def test_sync_client_that_cannot_connect_raises_and_leaves_no_thread(free_port: int) -> None:
    before = {t.name for t in threading.enumerate()}
    url = f"grpc://127.0.0.1:{free_port}"
    with (
        pytest.raises(ConnectionError, match="no Welcome"),
        SyncEdgeClient(url, device_id="d", streams=[StreamSpec("a")], start_timeout=0.3),
    ):
        pass
    assert {t.name for t in threading.enumerate()} == before
