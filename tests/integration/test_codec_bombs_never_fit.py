"""Clouds whose decode can never be granted cost their sender its refused-decode budget (issue
29, container case bomb-offloop at 400m: valid 16 MiB quantized clouds padded to 64 KiB, each
refused as never fitting and none counted, 38,989 of them in 19 s: the connection was never
closed and the good edge stalled 5.5 s)."""

from __future__ import annotations

import asyncio
import contextlib

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bridge.v1 import bridge_pb2 as pb
from tests.codec_bombs import frame, quantized_bomb, quantized_stream
from tests.integration.harness import running_bridge

MiB = 1 << 20
POINTS = 1_000_000  # a valid cloud declaring 16 MB decoded: its decode peak is ~148 MiB


async def test_decodes_that_never_fit_close_their_sender() -> None:
    bomb = pb.EdgeMessage(frame=frame("q", 1, quantized_bomb(POINTS, poisoned=False)))
    async with running_bridge(ring_budget_bytes=64 * MiB, max_frame_bytes=16 * MiB) as bridge:
        assert bridge.ports is not None
        url = f"ws://127.0.0.1:{bridge.ports.ws}/v1/ingest"
        errors: list[pb.Error] = []
        async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
            hello = pb.Hello(device_id="never-fits", streams=[quantized_stream("q")])
            await ws.send(pb.EdgeMessage(hello=hello).SerializeToString())

            async def read() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for raw in ws:
                        msg = pb.BridgeMessage.FromString(raw)  # type: ignore[arg-type]
                        if msg.WhichOneof("kind") == "error":
                            errors.append(msg.error)

            reader = asyncio.create_task(read())
            with contextlib.suppress(ConnectionClosed):
                for seq in range(1, 41):
                    bomb.frame.seq = seq
                    await ws.send(bomb.SerializeToString())
            await asyncio.wait_for(reader, 20)
            code = ws.close_code
    never_fits = [e for e in errors if e.code == pb.TOO_LARGE]
    fatal = [e for e in errors if e.fatal]
    assert never_fits, [pb.ErrorCode.Name(e.code) for e in errors]
    assert code == 1008, (code, len(errors))
    assert fatal and fatal[-1].code == pb.CODEC_ERROR, [pb.ErrorCode.Name(e.code) for e in fatal]
    assert len(never_fits) <= 4, len(never_fits)
