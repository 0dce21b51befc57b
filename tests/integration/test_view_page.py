"""The browser page at 800x600 in a real headless Chromium (issue 33): the status panel is compact
there and opens on demand, the camera fits a 5 m ring even when a small cloud arrived first, and a
stream that stopped is no longer drawn over the live ones.

Real ``simbridge view`` and ``simbridge serve`` processes, an edge publishing through the bridge,
Chromium driven over the DevTools protocol (``viewproc.Browser``); the page's own state
(``window.simbridgeView``: the camera's projection, the topics drawn) and the DOM's geometry are
read back. Needs Debian's ``chromium``; skips visibly without it.
"""

from __future__ import annotations

import asyncio
import json
import math
from io import BytesIO

import numpy as np
import pytest
from PIL import Image

from bridge.client import StreamSpec
from bridge.client.client import EdgeClient
from tests.integration.test_view import view_and_bridge
from tests.integration.viewproc import CHROMIUM, Browser

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium)"
)

STALE_S = 3.0  # the page's ?stale_s= (default 5 s), short for the test
W, H = 800, 600

# World points -> normalized device coordinates with the page's own camera and matrices (the
# page's top-level names; the same before and after issue 33).
PROJECT = """(pts => { const w = canvas.clientWidth, h = canvas.clientHeight;
  const m = mul(perspective(0.9, w / h, state.dist / 1000, state.dist * 20),
    lookAt(eye(), state.target, [0, 0, 1]));
  return JSON.stringify(pts.map(p => { const v = [0, 1, 2, 3].map(r =>
    m[r] * p[0] + m[4 + r] * p[1] + m[8 + r] * p[2] + m[12 + r]);
    return [v[0] / v[3], v[1] / v[3]]; })); })"""
DEPTH_CORNERS = [[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (1.7, 2.3)]


def vivid_in(png: bytes, ndc: list[list[float]]) -> int:
    """Coloured pixels inside the screen box of the projected points."""
    img = np.asarray(Image.open(BytesIO(png)).convert("RGB")).astype(int)
    xs = [(x + 1) / 2 * W for x, _ in ndc]
    ys = [(1 - y) / 2 * H for _, y in ndc]
    x0, x1 = max(int(min(xs)), 0), min(int(max(xs)) + 1, W)
    y0, y1 = max(int(min(ys)), 0), min(int(max(ys)) + 1, H)
    region = img[y0:y1, x0:x1]
    return int(((region.max(axis=2) - region.min(axis=2)) > 60).sum())


def ring(i: int, n: int = 4000) -> np.ndarray:
    """The README example's lidar: a ring of points 5 m around the sensor."""
    a = np.linspace(0, 2 * math.pi, n, endpoint=False)
    z = 0.5 * np.sin(3 * a + 0.3 * i)
    return np.stack([5 * np.cos(a), 5 * np.sin(a), z], axis=1).astype(np.float32)


def depth(i: int, n: int = 2000) -> np.ndarray:
    """The example's depth camera: 2 m x 2 m, 2 m up."""
    rng = np.random.default_rng(i)
    return np.stack(
        [rng.uniform(-1, 1, n), rng.uniform(-1, 1, n), 2.0 + 0.1 * rng.standard_normal(n)], axis=1
    ).astype(np.float32)


RING_EXTREMES = [
    [5 * math.cos(a), 5 * math.sin(a), z]
    for a in np.linspace(0, 2 * math.pi, 16)
    for z in (-0.5, 0.5)
]


async def test_page_at_800x600_compact_panel_fitted_ring_and_stale_streams_gone() -> None:
    async with view_and_bridge("--foxglove-port", "off", "--web-port", "0") as (view, bridge):
        edge = EdgeClient(
            bridge.ws_url,
            device_id="robot-1",
            streams=[StreamSpec("lidar", voxel_size=0.05), StreamSpec("depth", voxel_size=0.05)],
        )
        stop = asyncio.Event()

        async def lidar() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                await edge.publish("lidar", ring(i))
                await asyncio.sleep(0.1)

        url = f"http://127.0.0.1:{view.web}/?stale_s={STALE_S}"
        await edge.start()
        try:
            async with Browser.open(url, W, H) as page:
                assert await page.wait_js(
                    "window.simbridgeView && document.readyState == 'complete'"
                )
                for _ in range(100):  # the page's /ws is up
                    if (await view.status())["web"]["clients"] == 1:
                        break
                    await asyncio.sleep(0.05)
                # The small cloud first: the camera used to fit it once and keep that view.
                await edge.publish("depth", depth(0))
                assert await page.wait_js("simbridgeView.topics.includes('/robot-1/depth')")
                publisher = asyncio.create_task(lidar())
                try:
                    assert await page.wait_js("simbridgeView.topics.includes('/robot-1/lidar')")
                    await asyncio.sleep(0.2)
                    ndc = json.loads(await page.js(f"{PROJECT}({RING_EXTREMES})"))
                    depth_box = json.loads(await page.js(f"{PROJECT}({DEPTH_CORNERS})"))
                    depth_live = vivid_in(await page.screenshot(), depth_box)
                    # The panel is one line at 800x600 (it covered a third) and opens on a click.
                    rect = "(r => r.width * r.height)(panel.getBoundingClientRect())"
                    panel_small = await page.js(rect)
                    assert panel_small < 0.06 * W * H, f"panel {panel_small} px of {W * H}"
                    await page.js("document.getElementById('toggle').click()")
                    panel_open = await page.js(rect)
                    await page.js("document.getElementById('toggle').click()")
                    summary = await page.js(
                        "(document.getElementById('summary') || {}).textContent"
                    )
                    # The depth stream stops (its edge finished); the lidar goes on.
                    await asyncio.sleep(STALE_S + 0.5)
                    depth_box = json.loads(await page.js(f"{PROJECT}({DEPTH_CORNERS})"))
                    depth_stale = vivid_in(await page.screenshot(), depth_box)
                    drawn = await page.js("simbridgeView.drawnTopics")
                    stale = await page.js("simbridgeView.staleTopics")
                    shot = Image.open(BytesIO(await page.screenshot())).convert("RGB")
                finally:
                    stop.set()
                    await publisher
        finally:
            await edge.close()

    # The camera fits the ring: every extreme point is on screen, and the ring is not a speck.
    points = np.array(ndc)
    assert np.all(np.abs(points) <= 1.0), points.round(2).tolist()
    assert np.ptp(points[:, 0]) > 0.8 and np.ptp(points[:, 1]) > 0.5
    assert panel_open > 2 * panel_small
    assert "streams live" in summary
    # The finished stream is no longer drawn (its screen box was full of its points) ...
    assert depth_live > 300, depth_live
    assert depth_stale < depth_live / 4, (depth_live, depth_stale)
    # ... and only the live stream is drawn; the finished one is listed as stale.
    assert drawn == ["/robot-1/lidar"]
    assert stale == ["/robot-1/depth"]
    img = np.asarray(shot).astype(int)
    assert ((img.max(axis=2) - img.min(axis=2)) > 60).sum() > 500  # the ring is on screen
