"""A live MCAP is readable by an ordinary reader while the view writes it (issue 33).

``mcap.reader.make_reader`` on a seekable file is the seeking (summary/index) reader; before, it
refused the file being written ("expected footer"), so only a stream reader could read it. Now
each batch leaves the live file with a provisional DataEnd + Footer (no summary) + magic, which
the seeking reader reads linearly, and files are finished (summary, indexes, watermarks) on age
even when no frame comes. Real ``simbridge view`` processes fed over ``VisualizationSink.Push``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.v1 import bridge_pb2 as pb
from tests.integration.test_view import cloud
from tests.integration.viewproc import ViewProcess

pytest.importorskip("mcap", reason="mcap not installed (pip install simbridge[view])")

from mcap.reader import make_reader


def frame(seq: int) -> pb.ProcessedFrame:
    return pb.ProcessedFrame(
        device_id="robot-1", stream_id="lidar", seq=seq, point_cloud=cloud(seq, n=300)
    )


async def recorded(view: ViewProcess, n: int, timeout: float = 15.0) -> dict[str, Any]:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while True:
        status = await view.status()
        if status["bridge"]["frames_recorded"] >= n or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


def read(path: Path) -> tuple[list[int], Any, list[Any]]:
    """Frame seqs through the ordinary reader, the file's summary (None: unindexed) and its
    recorded watermarks."""
    with open(path, "rb") as f:
        reader = make_reader(f)
        seqs = [
            json.loads(m.data)["seq"]
            for _, _, m in reader.iter_messages(topics=["/simbridge/frames"])
        ]
        marks = [
            json.loads(m.metadata["watermarks"])
            for m in reader.iter_metadata()
            if m.name == "simbridge.watermarks"
        ]
        return seqs, reader.get_summary(), marks


async def test_the_file_being_written_reads_with_make_reader_and_a_crash_is_repaired(
    tmp_path: Path,
) -> None:
    from bridge.view.feed import ViewFeed

    args = ("--foxglove-port", "off", "--web-port", "0", "--mcap", str(tmp_path))
    view = await ViewProcess.start(*args)
    feed = ViewFeed(view.sink_address)
    try:
        for seq in range(1, 21):
            feed.offer(frame(seq))
        status = await recorded(view, 20)
        live = Path(status["mcap"]["current"])
        seqs, summary, _ = read(live)  # while the view holds it open for writing
        assert seqs == list(range(1, 21))
        assert summary is None  # the live file: unindexed, read linearly
        for seq in range(21, 31):
            feed.offer(frame(seq))
        await recorded(view, 30)
        assert read(live)[0] == list(range(1, 31))  # the next batches replaced the tail
        await feed.close()
        view.proc.kill()  # SIGKILL: the file ends with the provisional tail, not a summary
        await asyncio.to_thread(view.proc.wait)
    finally:
        await feed.close()
        view.kill()
    view = await ViewProcess.start(*args)
    try:
        assert "resuming with 1 stream watermarks" in view.logs()
        assert "repaired unfinished MCAP" in view.logs()
        seqs, summary, _ = read(live)
        assert seqs == list(range(1, 31)) and summary is not None and summary.chunk_indexes
        assert await view.stop(signal.SIGTERM) == 0
    finally:
        view.kill()


async def test_a_quiet_file_is_finished_on_age_with_its_summary(tmp_path: Path) -> None:
    view = await ViewProcess.start(
        "--foxglove-port", "off", "--web-port", "0", "--mcap", str(tmp_path),
        "--mcap-max-seconds", "1",
    )  # fmt: skip
    from bridge.view.feed import ViewFeed

    feed = ViewFeed(view.sink_address)
    try:
        for seq in range(1, 6):
            feed.offer(frame(seq))
        first = Path((await recorded(view, 5))["mcap"]["current"])
        for _ in range(100):  # no more frames come: the age alone finishes the file
            status = await view.status()
            if not status["mcap"]["current"]:
                break
            await asyncio.sleep(0.1)
        seqs, summary, marks = read(first)
    finally:
        await feed.close()
        view.kill()
    assert status["mcap"]["current"] == ""
    assert seqs == [1, 2, 3, 4, 5]
    assert summary is not None and summary.chunk_indexes and summary.statistics is not None
    assert marks == [[["robot-1", "lidar", 5]]]
