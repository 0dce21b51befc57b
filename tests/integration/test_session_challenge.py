"""A stranger who knows a live device's id (issue 32, what breaks 4): its Hellos challenge the
device's connection, which answers the ping, so each is refused and the device keeps its
session. What the stranger's loop costs the device is bounded: at most one ping a second.

The pings the device receives are counted on the wire, by a forwarder between it and the
bridge that reads the bridge's WebSocket frames (unmasked, RFC 6455 §5.2); the bridge's
keepalive is set far beyond the test, so every ping seen is a challenge. The half-open case
(no pong: the device is welcomed) is in test_replica_moves.py.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
from websockets.asyncio.client import connect

from bridge.client import EdgeClient, StreamSpec
from bridge.server.challenge import CHALLENGE_INTERVAL_SECONDS, CHALLENGE_SECONDS
from bridge.server.metrics import CHALLENGE_RESULTS
from bridge.v1 import bridge_pb2 as pb
from loadgen.sink import SinkServer
from tests.integration.harness import hello, running_bridge, ws_url

CLOUD = np.zeros((4, 3), np.float32)
_PING = 0x9


class PingCounter:
    """Reads a server's side of a WebSocket stream: the HTTP response, then frames; counts pings."""

    def __init__(self) -> None:
        self.pings = 0
        self._buf = bytearray()
        self._http = True
        self._skip = 0  # payload bytes of the current frame still to pass

    def feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._http:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            del buf[: end + 4]
            self._http = False
        while True:
            if self._skip:
                n = min(self._skip, len(buf))
                del buf[:n]
                self._skip -= n
                if self._skip:
                    return
            if len(buf) < 2:
                return
            len7 = buf[1] & 0x7F
            ext = 2 if len7 == 126 else 8 if len7 == 127 else 0
            head = 2 + ext + (4 if buf[1] & 0x80 else 0)
            if len(buf) < head:
                return
            if buf[0] & 0x0F == _PING:
                self.pings += 1
            self._skip = int.from_bytes(buf[2 : 2 + ext], "big") if ext else len7
            del buf[:head]


async def _pipe(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, counter: PingCounter | None
) -> None:
    try:
        while data := await src.read(65536):
            if counter is not None:
                counter.feed(data)
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.close()


class CountingForwarder:
    """127.0.0.1:0 -> the bridge's WebSocket port, counting what the bridge pings."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.counter = PingCounter()
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CountingForwarder:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        for src, dst, counter in ((reader, up_writer, None), (up_reader, writer, self.counter)):
            task = asyncio.create_task(_pipe(src, dst, counter))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


async def _stranger(url: str) -> tuple[pb.BridgeMessage, float]:
    """One Hello for the live device's id, no token: the bridge's answer and how long it took."""
    loop = asyncio.get_running_loop()
    async with connect(url, compression=None) as ws:
        began = loop.time()
        await ws.send(hello("robot", "s").SerializeToString())
        reply = pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(decode=False), 10))
        return reply, loop.time() - began


def _challenges(registry: object, result: str) -> float | None:
    return registry.get_sample_value(  # type: ignore[attr-defined, no-any-return]
        "bridge_session_challenges_total", {"result": result}
    )


async def test_a_stranger_with_a_live_devices_id_costs_it_at_most_a_ping_a_second() -> None:
    """50 Hellos for a live, reading device's id, 5 at a time every 0.25 s: every one refused
    (UNAUTHENTICATED) within the challenge deadline; the device is never superseded, loses
    nothing, and receives at most one ping per CHALLENGE_INTERVAL_SECONDS (plus one)."""
    sink = SinkServer(fsync=False)
    await sink.start()
    bridge_cm = running_bridge(
        sink_address=sink.address,
        passthrough=True,
        ping_interval_seconds=600.0,  # no keepalive ping within the test: each ping seen is ours
    )
    async with bridge_cm as bridge, CountingForwarder(bridge.ports.ws) as fwd:  # type: ignore[union-attr]
        assert all(_challenges(bridge.registry, r) == 0 for r in CHALLENGE_RESULTS)
        url = f"ws://127.0.0.1:{fwd.port}/v1/ingest"
        device = EdgeClient(url, device_id="robot", streams=[StreamSpec("s")])
        published = 0
        async with device:
            await device.publish("s", CLOUD)
            published += 1
            await device.drain(timeout=10)

            stop = asyncio.Event()

            async def keep_publishing() -> None:
                # Stopped by the event, never cancelled: a cancel inside publish() could send a
                # frame it never counted (CI on 7c709ec: 121 delivered, 120 counted).
                nonlocal published
                while not stop.is_set():
                    await device.publish("s", CLOUD)
                    published += 1
                    await asyncio.sleep(0.02)

            publisher = asyncio.create_task(keep_publishing())
            loop = asyncio.get_running_loop()
            began = loop.time()
            answers: list[tuple[pb.BridgeMessage, float]] = []
            for _ in range(10):
                answers += await asyncio.gather(*(_stranger(ws_url(bridge)) for _ in range(5)))
                await asyncio.sleep(0.25)
            elapsed = loop.time() - began
            stop.set()
            await asyncio.wait_for(publisher, 10)
            await device.drain(timeout=10)
        refused = [a for a, _ in answers if a.error.code == pb.UNAUTHENTICATED and a.error.fatal]
        assert len(refused) == 50, [a for a, _ in answers if a not in refused][:2]
        slowest = max(took for _, took in answers)
        assert slowest < CHALLENGE_SECONDS, f"a refusal took {slowest:.2f} s"
        alive = _challenges(bridge.registry, "alive")
        skipped = _challenges(bridge.registry, "skipped")
        print(
            f"50 stranger Hellos in {elapsed:.2f} s: {fwd.counter.pings} pings at the device, "
            f"challenges alive {alive} skipped {skipped}, slowest refusal {slowest * 1000:.1f} ms"
        )
        assert alive is not None and skipped is not None
        assert (alive, skipped) == (fwd.counter.pings, 50 - fwd.counter.pings)
        assert 1 <= fwd.counter.pings <= elapsed / CHALLENGE_INTERVAL_SECONDS + 1
        assert _challenges(bridge.registry, "dead") == 0
        assert (device.stats.disconnects, device.stats.reconnects) == (0, 0)
        assert device.stats.errors == {}, device.stats.errors
    await sink.stop()
    st = sink.record.streams[("robot", "s")]
    assert (st.delivered, st.lost, st.duplicates, st.gap_markers) == (published, 0, 0, 0)
