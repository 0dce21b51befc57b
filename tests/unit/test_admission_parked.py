"""A parked frame's bytes live exactly as long as their charge (issue 29: the container's
ignore-pause case was OOM-killed because frames the ring had taken, delivered and released
stayed referenced by their parked task while it waited to send RESUME: 21 x 15 MiB, uncharged)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry

from bridge.server.admission import Admission
from bridge.server.governor import Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import Offer
from bridge.v1 import bridge_pb2 as pb


@dataclass
class FullOnceCore:
    """A ring that is full until the parked task waits for space, then takes the frame and
    (like a delivered, acknowledged frame) lets go of it at once; never ready to RESUME."""

    offers: int = 0
    sent: list[pb.BridgeMessage] = field(default_factory=list)

    def offer(self, session, frame, size, now_ns, charge, data=None):  # type: ignore[no-untyped-def]
        self.offers += 1
        if self.offers <= 3:  # admit's offer and the parked task's looks before it waits
            return Offer.FULL
        charge.release()  # the ring took it, delivered it and freed it
        return Offer.ACCEPTED

    def resume_ready(self, session, stream_id, size):  # type: ignore[no-untyped-def]
        return False

    def reclaim_for_waiters(self) -> int:
        return 0


class Edges:
    draining = False

    def __init__(self) -> None:
        self.events: dict[object, asyncio.Event] = {}

    def space_event(self, key: object) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())


@dataclass
class FakeSession:
    device_id: str = "d"
    streams: dict[str, object] = field(default_factory=dict)


def test_a_taken_parked_frame_is_not_held_while_waiting_to_resume() -> None:
    async def main() -> None:
        core, edges = FullOnceCore(), Edges()
        sent: list[pb.BridgeMessage] = []

        async def send(msg: pb.BridgeMessage) -> None:
            sent.append(msg)

        admission = Admission(
            core,  # type: ignore[arg-type]
            edges,
            FakeSession(),  # type: ignore[arg-type]
            BridgeMetrics(CollectorRegistry()),
            send,
        )
        governor = Governor(64 << 20)
        payload = np.zeros(1 << 20, dtype=np.uint8)
        alive = weakref.ref(payload)
        points = payload.data
        del payload
        frame = pb.Frame(stream_id="s", seq=1)
        await admission.admit(frame, 1 << 20, governor.force(Component.TRANSPORT, 1 << 20), points)
        del points
        for _ in range(5):
            await asyncio.sleep(0)
        assert core.offers == 3 and sent  # parked, waiting for space; PAUSE sent
        edges.events[("d", "s")].set()  # space freed: the parked task offers again
        for _ in range(20):
            await asyncio.sleep(0)
        assert core.offers == 4  # taken; the task now waits for the low watermark
        assert admission._park_tasks, "the parked task should still wait to send RESUME"
        gc.collect()
        assert alive() is None, "a frame the ring took and released is still held"
        assert governor.total_bytes == 0
        await admission.close()

    asyncio.run(main())
