"""Clouds whose decode can never be granted cost their sender its refused-decode budget (issue
29, container case bomb-offloop at 400m: valid 16 MiB quantized clouds padded to 64 KiB, each
refused as never fitting and none counted, 38,989 of them in 19 s: the connection was never
closed and the good edge stalled 5.5 s)."""

from __future__ import annotations

from collections.abc import Iterator

from bridge.v1 import bridge_pb2 as pb
from tests.codec_bombs import frame, quantized_bomb, ws_bomber
from tests.integration.harness import running_bridge

MiB = 1 << 20
POINTS = 1_000_000  # a valid cloud declaring 16 MB decoded: its decode peak is ~148 MiB


async def test_decodes_that_never_fit_close_their_sender() -> None:
    bomb = pb.EdgeMessage(frame=frame("q", 1, quantized_bomb(POINTS, poisoned=False)))
    async with running_bridge(ring_budget_bytes=64 * MiB, max_frame_bytes=16 * MiB) as bridge:
        assert bridge.ports is not None
        url = f"ws://127.0.0.1:{bridge.ports.ws}/v1/ingest"

        def bombs() -> Iterator[bytes]:
            for seq in range(1, 41):
                bomb.frame.seq = seq
                yield bomb.SerializeToString()

        code, errors = await ws_bomber(url, "never-fits", bombs(), read_timeout_s=20)
    never_fits = [e for e in errors if e.code == pb.TOO_LARGE]
    fatal = [e for e in errors if e.fatal]
    assert never_fits, [pb.ErrorCode.Name(e.code) for e in errors]
    assert code == 1008, (code, len(errors))
    assert fatal and fatal[-1].code == pb.CODEC_ERROR, [pb.ErrorCode.Name(e.code) for e in fatal]
    assert len(never_fits) <= 4, len(never_fits)
