"""After a kill -9 restart of the bridge the page shows no viewer drops (issue 33).

What happened: the edges kept publishing while the bridge was down; the restarted bridge sent
that backlog to the view at once, in Push batches of up to ``ack_batch_frames`` frames, each
recorded and then fanned out in one go. The page's outlet took deliveries through a 4-deep
dropping queue and counted every overflow as a viewer drop, with or without a browser open:
measured here before the fix, 142 "viewer drops" over two streams with no browser at all. The
page shows the newest cloud of each stream, so frames that a newer one replaces before the page
converts them are now *skipped* (counted apart); viewer drops are what a browser was too slow for.

Real processes: ``simbridge view``, ``simbridge serve`` killed with SIGKILL and restarted on the
same ports, two edges publishing through it, a browser-like WebSocket client reading the page's
``/ws``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from websockets.asyncio.client import connect

from bridge.client import EdgeClient, StreamSpec
from bridge.view import webframe
from tests.integration.harness import BridgeProcess
from tests.integration.test_view import cloud
from tests.integration.viewproc import ViewProcess


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_bridge_restart_backlog_is_not_counted_as_viewer_drops() -> None:
    view = await ViewProcess.start("--foxglove-port", "off", "--web-port", "0")
    args = ("--sink-address", view.sink_address, "--ws-port", str(_port()), "--grpc-port",
            str(_port()), "--http-port", str(_port()), "--sink-backoff-initial-seconds", "0.05",
            "--sink-backoff-max-seconds", "0.3")  # fmt: skip
    bridge = await BridgeProcess.start(*args)
    edges = [
        EdgeClient(bridge.ws_url, device_id=f"robot-{i}", streams=[StreamSpec("lidar")])
        for i in range(2)
    ]
    published = [0, 0]
    newest: dict[str, int] = {}
    stop = asyncio.Event()

    async def publish(i: int) -> None:
        while not stop.is_set():
            published[i] += 1
            await edges[i].publish("lidar", cloud(published[i], n=1000))
            await asyncio.sleep(0.02)

    async def browse() -> None:
        async with connect(f"ws://127.0.0.1:{view.web}/ws", max_size=None) as ws:
            async for message in ws:
                assert isinstance(message, bytes)
                header = webframe.decode(message)[0]
                newest[header["topic"]] = header["seq"]

    browser = asyncio.create_task(browse())
    try:
        for e in edges:
            await e.start()
        publishers = [asyncio.create_task(publish(i)) for i in range(2)]
        await asyncio.sleep(1.5)
        bridge.proc.kill()  # kill -9: the edges keep publishing into their buffers
        await asyncio.to_thread(bridge.proc.wait)
        await asyncio.sleep(2.0)
        bridge.kill()
        bridge = await BridgeProcess.start(*args)
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.gather(*publishers)
        for e in edges:
            assert await e.wait_delivered(20)
        await asyncio.sleep(0.5)
        status = await view.status()
    finally:
        browser.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await browser
        for e in edges:
            await e.close()
        bridge.kill()
        view.kill()

    streams = {s["topic"]: s for s in status["streams"]}
    assert sorted(streams) == ["/robot-0/lidar", "/robot-1/lidar"]
    for i in range(2):
        s = streams[f"/robot-{i}/lidar"]
        assert s["frames"] == s["last_seq"] == published[i]  # every frame recorded once
        assert s["viewer_drops"] == 0, status
        assert newest[f"/robot-{i}/lidar"] == published[i]  # the page shows the newest
    assert status["web"]["dropped"] == 0
    assert status["web"]["skipped"] > 0  # the backlog did arrive as a burst, and was coalesced
