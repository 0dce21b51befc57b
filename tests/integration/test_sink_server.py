"""A real SinkServer on 127.0.0.1:0 and a real grpc.aio client playing the bridge's part."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc
from loadgen.clouds import lidar_xyzi
from loadgen.sink import SinkServer


class Pusher:
    """One Push stream driven from a queue, like the bridge's egress would."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.queue: asyncio.Queue[pb.ProcessedFrame | None] = asyncio.Queue()
        stub = bridge_pb2_grpc.VisualizationSinkStub(self.channel)
        self.call = stub.Push(self._requests())

    async def _requests(self) -> AsyncIterator[pb.ProcessedFrame]:
        while (frame := await self.queue.get()) is not None:
            yield frame

    async def ack(self, wait_s: float = 5.0) -> pb.SinkAck:
        msg = await asyncio.wait_for(self.call.read(), wait_s)
        assert msg is not grpc.aio.EOF
        return msg  # type: ignore[no-any-return]

    async def ack_until(self, bridge_seq: int, wait_s: float = 5.0) -> list[int]:
        seen = []
        while not seen or seen[-1] < bridge_seq:
            seen.append((await self.ack(wait_s)).bridge_seq)
        return seen

    async def close(self) -> None:
        await self.queue.put(None)
        self.call.cancel()
        await self.channel.close()


def pf(seq: int, bridge_seq: int, stream: str = "lidar", device: str = "dev1", **kw: Any) -> Any:
    return pb.ProcessedFrame(
        device_id=device,
        stream_id=stream,
        seq=seq,
        bridge_seq=bridge_seq,
        capture_time_ns=1_000,
        **kw,
    )


def watermarks(ack: pb.SinkAck) -> dict[tuple[str, str], int]:
    return {(w.device_id, w.stream_id): w.seq for w in ack.watermarks}


async def test_watermarks_first_then_cumulative_acks() -> None:
    async with SinkServer(fsync=False) as sink:
        p = Pusher(sink.address)
        first = await p.ack()
        assert first.bridge_seq == 0 and list(first.watermarks) == []
        for i in range(1, 11):
            await p.queue.put(pf(i, bridge_seq=100 + i))
        acks = await p.ack_until(110)
        assert acks == sorted(acks) and acks[-1] == 110  # cumulative, never backwards
        await p.close()
        # a second Push stream (a reconnecting bridge) learns what the sink already holds
        p2 = Pusher(sink.address)
        assert watermarks(await p2.ack()) == {("dev1", "lidar"): 10}
        await p2.close()
        t = sink.record.totals()
        assert (t["delivered"], t["lost"], t["duplicates"]) == (10, 0, 0)


async def test_losses_gaps_and_decimation_are_accounted() -> None:
    cloud = lidar_xyzi(50, seed=1).to_proto()
    dec = pb.DecimationInfo(input_points=200, output_points=50, voxel_size=0.2, backend="numpy")
    async with SinkServer(fsync=False) as sink:
        p = Pusher(sink.address)
        await p.ack()
        await p.queue.put(pf(1, 1, point_cloud=cloud, decimation=dec))
        await p.queue.put(pf(3, 2))  # seq 2 lost
        gap = pb.Gap(first_seq=4, last_seq=6, count=3, reason="drop_oldest")
        await p.queue.put(pf(7, 3, gap=gap))
        bad = pb.DecimationInfo(input_points=200, output_points=49, backend="numpy")
        await p.queue.put(pf(8, 4, point_cloud=cloud, decimation=bad))
        await p.ack_until(4)
        await p.close()
        st = sink.record.stats("dev1", "lidar")
        assert (st.lost, st.gap_frames, st.decimation_mismatches) == (1, 3, 1)
        assert st.input_points == 400 and st.output_points == 99
        assert sink.record.watermarks() == [("dev1", "lidar", 1)]


async def test_record_file_survives_a_restart_and_duplicates_are_not_recorded_twice(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sink.jsonl"
    sink = SinkServer(record_path=path)
    await sink.start()
    p = Pusher(sink.address)
    await p.ack()
    for i in range(1, 6):
        await p.queue.put(pf(i, i, stream="a"))
    for i in (1, 2, 4):
        await p.queue.put(pf(i, 5 + i, stream="b"))
    await p.ack_until(9)
    await p.close()
    before = {(d, s): w for d, s, w in sink.record.watermarks()}
    assert before == {("dev1", "a"): 5, ("dev1", "b"): 2}
    await sink.stop()

    restarted = SinkServer(record_path=path)
    await restarted.start()
    assert restarted.replayed == 8
    p = Pusher(restarted.address)
    assert watermarks(await p.ack()) == before
    # the bridge resends a frame the sink holds, and one it never got
    await p.queue.put(pf(4, 1, stream="a"))
    await p.queue.put(pf(3, 2, stream="b"))
    assert (await p.ack_until(2))[-1] == 2
    await p.close()
    st_a, st_b = restarted.record.stats("dev1", "a"), restarted.record.stats("dev1", "b")
    assert (st_a.delivered, st_a.duplicates) == (5, 1)
    assert (st_b.delivered, st_b.reorders, st_b.lost) == (4, 1, 0)
    await restarted.stop()

    lines = [json.loads(x) for x in path.read_text().splitlines()]
    frames = [(r["stream_id"], r["seq"]) for r in lines if not r.get("dup")]
    assert len(frames) == len(set(frames)) == 9
    assert [(r["stream_id"], r["seq"]) for r in lines if r.get("dup")] == [("a", 4)]


async def test_large_frames_within_the_configured_limit() -> None:
    big = lidar_xyzi(400_000, seed=2).to_proto()  # 6.4 MB: above gRPC's 4 MiB default
    async with SinkServer(fsync=False, max_message_bytes=16 * 1024 * 1024) as sink:
        ch = grpc.aio.insecure_channel(
            sink.address, options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
        )
        stub = bridge_pb2_grpc.VisualizationSinkStub(ch)

        async def one() -> AsyncIterator[pb.ProcessedFrame]:
            yield pf(1, 1, point_cloud=big)

        call = stub.Push(one())
        acks = [a async for a in call]
        assert [a.bridge_seq for a in acks] == [0, 1]
        assert sink.record.stats("dev1", "lidar").delivered == 1
        await ch.close()


async def test_too_large_frame_is_refused() -> None:
    async with SinkServer(fsync=False, max_message_bytes=1024 * 1024) as sink:
        ch = grpc.aio.insecure_channel(
            sink.address, options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
        )
        stub = bridge_pb2_grpc.VisualizationSinkStub(ch)

        async def one() -> AsyncIterator[pb.ProcessedFrame]:
            yield pf(1, 1, point_cloud=lidar_xyzi(100_000).to_proto())

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Push(one()):
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sink.record.totals()["received"] == 0
        await ch.close()


async def test_sink_command_runs_as_a_process_and_summarizes_on_sigterm(tmp_path: Path) -> None:
    record = tmp_path / "cli.jsonl"
    code = "import sys; from loadgen.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["sink", "--listen", "127.0.0.1:0", "--record", str(record), "--json"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert line.startswith("sink listening on 127.0.0.1:")
        p = Pusher(line.split()[-1])
        await p.ack()
        for i in (1, 2, 4):
            await p.queue.put(pf(i, i))
        await p.ack_until(3)
        await p.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    summary = json.loads(out)
    assert summary["totals"]["delivered"] == 3 and summary["totals"]["lost"] == 1
    assert len(record.read_text().splitlines()) == 3
