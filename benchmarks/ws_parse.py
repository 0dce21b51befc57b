"""What ``websockets`` costs to parse one large frame, by the size of the pieces it is fed.

Why: its parser keeps unread bytes in a bytearray grown by reallocation, so a frame fed read by
read is copied again and again; the bridge's WebSocket adapter therefore hands a large payload
over in one piece (``bridge.server.ws_impl.GovernedConnection``), or, for a whole binary message,
unmasks it itself without the parser (``python -m benchmarks.ws_small --size 1200000``). This
prints the cost per frame for each piece size, side by side in one run (CPU time of this
process, median of rounds), with glibc's allocator tuned as ``simbridge serve`` tunes it
(``--default-malloc``: as glibc ships, where every large buffer is a fresh mmap).

    python -m benchmarks.ws_parse [--size 1200000] [--rounds 9] [--frames 20] [--default-malloc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from bridge.server.memtrim import tune_allocator

PIECES = (16 * 1024, 64 * 1024, 256 * 1024)  # 256 KiB: the event loop's largest read


def cost_us(wire: bytes, piece: int, frames: int) -> float:
    """CPU microseconds per frame to parse ``frames`` copies of ``wire`` fed ``piece`` bytes at
    a time (``piece`` 0: the whole frame at once)."""
    step = piece or len(wire)
    chunks = [wire[i : i + step] for i in range(0, len(wire), step)]
    protocol = Protocol(Side.SERVER, state=State.OPEN, max_size=None)
    start = time.process_time()
    for _ in range(frames):
        for chunk in chunks:
            protocol.receive_data(chunk)
        (event,) = protocol.events_received()
        assert isinstance(event, Frame)
    return (time.process_time() - start) / frames * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_200_000, help="payload bytes")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--frames", type=int, default=20, help="frames per round")
    parser.add_argument(
        "--default-malloc", action="store_true", help="leave glibc's allocator untuned"
    )
    args = parser.parse_args(argv)
    if not args.default_malloc:
        tune_allocator()  # as `simbridge serve` does: large buffers from the heap
    wire = Frame(Opcode.BINARY, os.urandom(args.size)).serialize(mask=True, extensions=[])
    pieces = (*PIECES, 0)
    rounds: dict[int, list[float]] = {p: [] for p in pieces}
    for _ in range(args.rounds):  # interleaved: drift hits every piece size alike
        for piece in pieces:
            rounds[piece].append(cost_us(wire, piece, args.frames))
    whole = statistics.median(rounds[0])
    malloc = "glibc defaults" if args.default_malloc else "tuned as simbridge serve"
    print(
        f"websockets parse of one {args.size}-byte masked frame, CPU us per frame (median); "
        f"allocator: {malloc}"
    )
    for piece in pieces:
        label = "whole frame" if piece == 0 else f"{piece // 1024} KiB pieces"
        cost = statistics.median(rounds[piece])
        print(f"  {label:>16}  {cost:8.0f} us  {cost / whole:5.1f}x whole")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
