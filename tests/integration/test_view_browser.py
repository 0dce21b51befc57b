"""The browser page in a real headless Chromium: it loads offline, draws the bridge's clouds
(asserted on the screenshot's pixels) and shows the status panel.

Needs Debian's ``chromium`` (``apt-get install chromium``); skips visibly without it. With
``SIMBRIDGE_WRITE_DOCS=1`` the screenshot is also saved as ``docs/view.png`` for the README.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.integration.harness import ROOT
from tests.integration.test_view import cloud, edge_for, view_and_bridge

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium)"
)

W, H = 1000, 700
BACKGROUND = np.array([16, 20, 24])  # the page's clear colour


def screenshot(url: str, out: Path, profile: Path) -> None:
    assert CHROMIUM is not None
    subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--use-angle=swiftshader",
         "--enable-unsafe-swiftshader", "--disable-gpu-sandbox", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--window-size={W},{H}", f"--screenshot={out}", url],
        check=True, capture_output=True, timeout=90,
    )  # fmt: skip


def cloud_pixels(png: Path) -> int:
    """Coloured pixels in the lower part of the page (the status panel is at the top left)."""
    img = np.asarray(Image.open(png).convert("RGB")).astype(int)
    region = img[int(H * 0.4) : H - 30, :]
    vivid = (region.max(axis=2) - region.min(axis=2)) > 60
    not_bg = np.abs(region - BACKGROUND).sum(axis=2) > 40
    return int((vivid & not_bg).sum())


async def test_page_draws_the_points_in_headless_chromium(tmp_path: Path) -> None:
    async with view_and_bridge("--foxglove-port", "off", "--web-port", "0") as (view, bridge):
        edge = edge_for(bridge)
        stop = asyncio.Event()

        async def live() -> None:  # keep publishing while Chromium looks (rates, lag on screen)
            i = 0
            while not stop.is_set():
                await edge.publish("lidar", cloud(i, n=30000))
                await edge.publish("imu", {"speed": 1.0})
                i += 1
                await asyncio.sleep(0.2)

        try:
            await edge.start()
            publisher = asyncio.create_task(live())
            url = f"http://127.0.0.1:{view.web}/"
            shot = tmp_path / "view.png"
            for _ in range(3):  # the screenshot races the first frame over the WebSocket
                await asyncio.to_thread(screenshot, url, shot, tmp_path / "profile")
                if cloud_pixels(shot) > 2000:
                    break
            stop.set()
            await publisher
            assert await edge.wait_delivered(15)
            status = await view.status()
        finally:
            await edge.close()
    assert cloud_pixels(shot) > 2000, "no points drawn"
    assert status["web"]["clients"] == 0  # Chromium has gone
    assert [s["topic"] for s in status["streams"]] == ["/robot-1/imu", "/robot-1/lidar"]
    if os.environ.get("SIMBRIDGE_WRITE_DOCS"):
        shutil.copyfile(shot, ROOT / "docs" / "view.png")


async def test_blank_page_has_no_points(tmp_path: Path) -> None:
    """The pixel check's control: the same page with nothing published draws no points."""
    async with view_and_bridge("--foxglove-port", "off", "--web-port", "0") as (view, _bridge):
        shot = tmp_path / "blank.png"
        await asyncio.to_thread(screenshot, f"http://127.0.0.1:{view.web}/", shot, tmp_path / "p")
    assert cloud_pixels(shot) < 200
