"""What receiving one WebSocket message costs: the bridge's adapter against ``websockets``.

Why: at 1 KB a message the bridge's own work per frame is small enough that the WebSocket layer
shows. The adapter (``bridge.server.ws_conn.GovernedConnection``) meters every frame header,
asks the memory governor for each payload and, for a whole binary message, unmasks and queues it
without the library's frame parser (a large one once its reads are collected). This feeds both
connection classes the same reads (1, 3 or 8 masked messages each, as a closed-loop edge's reads
hold; in reads of at most 256 KiB, as the event loop delivers them), receives every message the
way ingest does, interleaved round by round, and prints CPU time per message (median of rounds).
No sockets: a stub transport (``tests/support/ws_stub.py``), so only the per-message Python is
measured; glibc's allocator is tuned as ``simbridge serve`` tunes it (without that, every large
message is a fresh mmap).

    python -m benchmarks.ws_small [--size 1024] [--rounds 9] [--reads 2000]
    python -m benchmarks.ws_small --size 1200000 --reads 100     # a 1.2 MB cloud
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from websockets.asyncio.server import ServerConnection
from websockets.frames import Frame, Opcode

from bridge.server.governor import Governor
from bridge.server.memtrim import tune_allocator
from bridge.server.ws_conn import GovernedConnection
from tests.support.ws_stub import governed_connection, open_connection

PER_READ = (1, 3, 8)
READ_BYTES = 256 * 1024  # uvloop's largest socket read: what one data_received() gets at most


async def cost_us(
    connection: ServerConnection | GovernedConnection, read: bytes, per_read: int, reads: int
) -> float:
    """CPU microseconds per message: ``reads`` times, one read in, every message received."""
    governed = isinstance(connection, GovernedConnection)
    start = time.process_time()
    pieces = [read[i : i + READ_BYTES] for i in range(0, len(read), READ_BYTES)]
    for _ in range(reads):
        for piece in pieces:
            connection.data_received(piece)
        for _ in range(per_read):
            message = await connection.recv()
            if governed:
                assert isinstance(connection, GovernedConnection)
                connection.take(len(message)).release()
    return (time.process_time() - start) / (reads * per_read) * 1e6


async def run(size: int, rounds: int, reads: int) -> list[tuple[int, float, float]]:
    rows = []
    for per_read in PER_READ:
        read = b"".join(
            Frame(Opcode.BINARY, os.urandom(size)).serialize(mask=True, extensions=[])
            for _ in range(per_read)
        )
        costs: dict[str, list[float]] = {"ws": [], "ours": []}
        for _ in range(rounds):  # interleaved: drift hits both alike
            plain = await open_connection(ServerConnection)
            ours = await governed_connection(Governor(1 << 30))
            costs["ws"].append(await cost_us(plain, read, per_read, reads))
            costs["ours"].append(await cost_us(ours, read, per_read, reads))
        rows.append((per_read, statistics.median(costs["ws"]), statistics.median(costs["ours"])))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per message")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reads", type=int, default=2000, help="reads per round")
    args = parser.parse_args(argv)
    tune_allocator()  # as `simbridge serve` does: large messages from the heap, not one mmap each
    rows = asyncio.run(run(args.size, args.rounds, args.reads))
    print(f"receiving {args.size}-byte binary messages, CPU us per message (median of rounds)")
    print("msgs/read  websockets  bridge adapter  adapter/websockets")
    for per_read, plain, ours in rows:
        print(f"{per_read:9d}  {plain:10.2f}  {ours:14.2f}  {ours / plain:18.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
