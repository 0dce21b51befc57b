"""A Hello that finds its device's session on another live connection challenges that one
(issue 32, what breaks 4).

Why: a device id is no credential (every subscriber sees them), so a Hello without the
session's resume token or a per-device credential may not take a live session (SessionTaken).
But a device whose old connection went half-open (no FIN, no RST: a dead NAT, a pulled cable)
and that comes back with another replica's token, or none, looked like such a stranger until
the keepalive gave up on the old connection (ping interval + ping timeout + close timeout,
about 42 s by default). Now the refused Hello pings the incumbent once and waits at most
:data:`CHALLENGE_SECONDS`:

- an answer (a pong, or data arriving) proves it alive: the Hello is refused as before, so a
  stranger who knows the id takes nothing over;
- silence proves it dead: its transport closes it as the keepalive would, and the Hello takes
  the session over (the Welcome says ``resumed``);
- a transport that cannot ping (gRPC) or a connection that is not reading decides nothing: the
  Hello is refused as before.

An edge can drive this, so per device at most one challenge is in flight and at most one starts
per :data:`CHALLENGE_INTERVAL_SECONDS`; past that a Hello is refused at once. Hellos in a loop
cost the real device at most one ping a second, and a challenged Hello waits at most the
deadline. ``bridge_session_challenges_total{result}`` counts what happened.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable

from bridge.protocol.errors import SessionTaken
from bridge.server.metrics import BridgeMetrics
from bridge.server.ports import Attached, EdgeTransport, IngestCore
from bridge.v1 import bridge_pb2 as pb

log = logging.getLogger("bridge.server.challenge")

#: How long a challenged Hello waits for the incumbent's pong.
CHALLENGE_SECONDS = 2.0
#: Per device, at most one challenge starts in this many seconds.
CHALLENGE_INTERVAL_SECONDS = 1.0


class ChallengeGate:
    """Whether a device may be challenged now: none of its challenges in flight, none started in
    the last ``interval`` seconds. Sans-I/O (``now`` is passed in, monotonic seconds). Holds
    only devices challenged within ``interval`` or in flight, each of which had a live session."""

    def __init__(self, interval: float = CHALLENGE_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self._started: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._in_flight: set[str] = set()

    def __len__(self) -> int:
        return len(self._started.keys() | self._in_flight)

    def begin(self, device_id: str, now: float) -> bool:
        """True: the caller challenges ``device_id`` and calls :meth:`end` when done."""
        started = self._started
        while started:  # forget starts older than the interval (oldest first)
            device, at = next(iter(started.items()))
            if now - at < self.interval:
                break
            del started[device]
        if device_id in self._in_flight or device_id in started:
            return False
        self._in_flight.add(device_id)
        started[device_id] = now
        return True

    def end(self, device_id: str) -> None:
        self._in_flight.discard(device_id)


# One gate per core (one bridge): the core owns the sessions whose devices are challenged.
_gates: weakref.WeakKeyDictionary[object, ChallengeGate] = weakref.WeakKeyDictionary()


def gate_of(core: object) -> ChallengeGate:
    gate = _gates.get(core)
    if gate is None:
        gate = _gates[core] = ChallengeGate()
    return gate


async def attach(
    core: IngestCore,
    hello: pb.Hello,
    connection: object,
    proven: bool,
    metrics: BridgeMetrics,
    *,
    deadline: float = CHALLENGE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Attached:
    """``core.hello``; when it refuses only because the device's session is attached to
    another connection (SessionTaken), challenge that connection (see the module) and, if it
    is dead, attach in its place. Raises what ``core.hello`` raises otherwise."""
    try:
        return core.hello(hello, connection, identity_proven=proven)
    except SessionTaken as exc:
        taken = exc
    device = hello.device_id
    incumbent = core.live_connection(device)
    transport: EdgeTransport | None = getattr(incumbent, "transport", None)
    if transport is None:  # not an edge connection (a unit test's handle): nothing to ask
        raise taken
    gate = gate_of(core)
    if not gate.begin(device, clock()):
        metrics.session_challenges.labels("skipped").inc()
        raise taken
    try:
        alive = await transport.ping(deadline)
    finally:
        gate.end(device)
    if alive is not False:
        metrics.session_challenges.labels("alive" if alive else "unchecked").inc()
        raise taken
    metrics.session_challenges.labels("dead").inc()
    log.info(
        "device %s: its %s connection did not answer a ping within %g s; a new Hello takes "
        "its session",
        device,
        transport.name,
        deadline,
    )
    # Taken over only if the dead one still holds the session: it may have ended meanwhile
    # (then the session is free anyway), or a Hello with the token may have taken it.
    takeover = core.live_connection(device) is incumbent
    return core.hello(hello, connection, identity_proven=proven or takeover)
