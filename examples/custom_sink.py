"""A minimal visualization sink in Python: what a third party needs to receive simbridge's
processed frames (docs/protocol.md §10). Run it, then point the bridge at it:

    python examples/custom_sink.py --listen 127.0.0.1:50051 --record frames.jsonl
    simbridge serve --sink-address 127.0.0.1:50051

The protocol, in the order this file follows it:
1. On every new Push stream, first send one SinkAck with bridge_seq 0 and the watermarks: per
   (device, stream), the highest seq already held. Then the bridge never resends those.
2. For each frame: drop it if its seq is at or below the watermark (a replay after a crash),
   otherwise make it durable (here: one JSON line, flushed and fsynced).
3. Acknowledge cumulatively by bridge_seq, only after step 2. bridge_seq is per bridge process:
   never store it; identify frames by (device_id, stream_id, seq).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bridge.v1 import bridge_pb2 as pb
from bridge.v1 import bridge_pb2_grpc


class Sink(bridge_pb2_grpc.VisualizationSinkServicer):
    def __init__(self, record: Path) -> None:
        self.record = record
        self.watermarks: dict[tuple[str, str], int] = {}
        if record.exists():  # what we already hold survives a restart
            for line in record.read_text().splitlines():
                f = json.loads(line)
                key = (f["device"], f["stream"])
                self.watermarks[key] = max(self.watermarks.get(key, 0), f["seq"])
        self.out = open(record, "a")  # noqa: SIM115 - lives as long as the process

    async def Push(self, frames: AsyncIterator[pb.ProcessedFrame], context: Any) -> None:
        # 1. Watermarks first (an empty SinkAck when we hold nothing).
        await context.write(
            pb.SinkAck(
                bridge_seq=0,
                watermarks=[
                    pb.StreamWatermark(device_id=d, stream_id=s, seq=seq)
                    for (d, s), seq in self.watermarks.items()
                ],
            )
        )
        async for frame in frames:
            key = (frame.device_id, frame.stream_id)
            if frame.seq > self.watermarks.get(key, 0):  # 2. new: make it durable
                points = 0
                if frame.HasField("point_cloud") and frame.point_cloud.point_stride:
                    points = len(frame.point_cloud.data) // frame.point_cloud.point_stride
                line = {"device": frame.device_id, "stream": frame.stream_id, "seq": frame.seq,
                        "points": points, "gap": frame.gap.count,
                        "values": dict(frame.telemetry.values)}  # fmt: skip
                self.out.write(json.dumps(line) + "\n")
                self.out.flush()
                os.fsync(self.out.fileno())
                self.watermarks[key] = frame.seq
                print(f"{frame.device_id}/{frame.stream_id} seq {frame.seq}: {points} points",
                      flush=True)  # fmt: skip
            # 3. Cumulative ack: everything up to this bridge_seq is durable.
            await context.write(pb.SinkAck(bridge_seq=frame.bridge_seq))


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:50051")
    p.add_argument("--record", default="frames.jsonl", help="durable record (JSON lines)")
    args = p.parse_args()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    bridge_pb2_grpc.add_VisualizationSinkServicer_to_server(Sink(Path(args.record)), server)
    port = server.add_insecure_port(args.listen)
    await server.start()
    print(f"CUSTOM_SINK_READY port={port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
