"""AckPacer: the core's wake-ups (two a frame) become few Ack messages, and none is lost.

The pacer skips Event.set() for a wake-up that changes nothing; these tests fail if that memory
outlives the writer's take (a wake-up after it would then never reach the writer)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bridge.server.acks import AckPacer
from bridge.v1 import bridge_pb2 as pb

DEADLINE = 5.0  # seconds a step may take on a loaded machine before the test fails


class Writer:
    """A pacer's writer task, with what it took and sent."""

    def __init__(self, pacer: AckPacer) -> None:
        self.takes = 0
        self.sent: list[pb.BridgeMessage] = []
        self.task = asyncio.create_task(pacer.run(self.take, self.send))

    def take(self) -> pb.Ack | None:
        self.takes += 1
        return pb.Ack()

    async def send(self, msg: pb.BridgeMessage) -> None:
        self.sent.append(msg)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, "the writer did not take the acks in time"
        await asyncio.sleep(0.001)


def test_many_wake_ups_before_the_writer_runs_are_one_ack() -> None:
    async def main() -> None:
        pacer = AckPacer(interval_seconds=0.0, accepted_delay_seconds=30.0)
        writer = Writer(pacer)
        for _ in range(100):
            pacer.wake(urgent=False)
            pacer.wake(urgent=True)
        await until(lambda: writer.takes == 1)
        for _ in range(20):  # nothing new: the writer waits, it does not take again
            await asyncio.sleep(0)
        assert writer.takes == 1 and len(writer.sent) == 1
        assert writer.sent[0].WhichOneof("kind") == "ack"
        await writer.stop()

    asyncio.run(main())


def test_a_wake_up_after_each_take_reaches_the_writer() -> None:
    async def main() -> None:
        pacer = AckPacer(interval_seconds=0.0, accepted_delay_seconds=30.0)
        writer = Writer(pacer)
        for expected in range(1, 6):
            pacer.wake(urgent=True)
            await until(lambda n=expected: writer.takes == n)
        await writer.stop()

    asyncio.run(main())


def test_an_accepted_only_change_waits_for_a_delivered_one_each_time() -> None:
    async def main() -> None:
        pacer = AckPacer(interval_seconds=0.0, accepted_delay_seconds=30.0)
        writer = Writer(pacer)
        for expected in range(1, 4):
            pacer.wake(urgent=False)
            for _ in range(20):
                await asyncio.sleep(0)
            assert writer.takes == expected - 1  # waiting (up to 30 s) for a delivery
            pacer.wake(urgent=True)  # delivered: sent now, not 30 s later
            await until(lambda n=expected: writer.takes == n)
        await writer.stop()

    asyncio.run(main())
