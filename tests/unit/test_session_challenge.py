"""The bounds of a session challenge (issue 32, what breaks 4; bridge.server.challenge) and the
WebSocket ping that answers it (WsTransport.ping).

An edge drives challenges (any Hello for a live device's id), so per device at most one is in
flight and at most one starts a second; everything past that is refused at once, without a
ping. The real core decides who holds the session; the incumbent's transport is a fake whose
ping the test answers.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from bridge.protocol.errors import SessionTaken
from bridge.server.challenge import CHALLENGE_SECONDS, ChallengeGate, attach, gate_of
from bridge.server.governor import Component, Governor
from bridge.server.metrics import BridgeMetrics
from bridge.server.ws_conn import WHOLE_PAYLOAD_BYTES
from bridge.server.ws_impl import WsTransport
from tests.support.ws_stub import StubTransport, governed_connection
from tests.unit.test_core import hello, make_core

# -- the gate --------------------------------------------------------------------------------


def test_one_challenge_in_flight_per_device() -> None:
    gate = ChallengeGate(interval=1.0)
    assert gate.begin("a", 0.0)
    assert not gate.begin("a", 5.0)  # still in flight, however long ago it started
    assert gate.begin("b", 0.1)  # other devices are not held up
    gate.end("a")
    assert gate.begin("a", 5.0)


def test_at_most_one_challenge_per_interval_per_device() -> None:
    gate = ChallengeGate(interval=1.0)
    assert gate.begin("a", 10.0)
    gate.end("a")
    assert not gate.begin("a", 10.5)
    assert not gate.begin("a", 10.999)
    assert gate.begin("a", 11.0)
    gate.end("a")


def test_the_gate_forgets_devices_once_their_interval_passed() -> None:
    gate = ChallengeGate(interval=1.0)
    for i in range(1000):
        assert gate.begin(f"d{i}", i * 0.001)
        gate.end(f"d{i}")
    assert len(gate) == 1000
    assert gate.begin("late", 2.0)
    assert len(gate) == 1  # only what started within the last second (or is in flight)


# -- the challenge, against the real core ----------------------------------------------------


class FakeTransport:
    """The incumbent's transport: ``ping`` waits for ``answer`` to be set by the test."""

    name = "ws"

    def __init__(self) -> None:
        self.pings: list[float] = []
        self.answer: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()

    async def ping(self, seconds: float) -> bool | None:
        self.pings.append(seconds)
        return await self.answer


class Conn:
    def __init__(self, transport: FakeTransport | None = None) -> None:
        self.transport = transport


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def challenges(metrics: BridgeMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value("bridge_session_challenges_total", {"result": result})
    assert value is not None
    return value


async def test_hellos_while_a_challenge_is_in_flight_are_refused_at_once() -> None:
    core, _ = make_core()
    metrics, clock = BridgeMetrics(CollectorRegistry()), Clock()
    incumbent = Conn(FakeTransport())
    assert incumbent.transport is not None
    core.hello(hello(), incumbent)
    first = asyncio.create_task(attach(core, hello(), Conn(), False, metrics, clock=clock))
    await asyncio.sleep(0)
    assert incumbent.transport.pings == [CHALLENGE_SECONDS]  # the deadline is the ping's
    for step in range(5):  # the same device again, in flight: no second ping
        clock.now += 0.5 * step
        with pytest.raises(SessionTaken):
            await attach(core, hello(), Conn(), False, metrics, clock=clock)
    assert len(incumbent.transport.pings) == 1
    assert challenges(metrics, "skipped") == 5
    incumbent.transport.answer.set_result(True)  # it answered: alive, the first is refused too
    with pytest.raises(SessionTaken):
        await first
    assert challenges(metrics, "alive") == 1
    assert core.live_connection("dev") is incumbent


async def test_a_device_is_challenged_at_most_once_a_second() -> None:
    core, _ = make_core()
    metrics, clock = BridgeMetrics(CollectorRegistry()), Clock()
    transport = FakeTransport()
    transport.answer.set_result(True)  # a live device that answers at once
    core.hello(hello(), Conn(transport))
    refused_at: list[float] = []
    for _ in range(50):  # a stranger's loop, a Hello every 0.1 s for 5 s
        with pytest.raises(SessionTaken):
            await attach(core, hello(), Conn(), False, metrics, clock=clock)
        refused_at.append(clock.now)
        clock.now += 0.1
    pinged = len(transport.pings)
    assert 5 <= pinged <= 6, pinged  # 5 s of Hellos: one ping per second
    assert (challenges(metrics, "alive"), challenges(metrics, "skipped")) == (pinged, 50 - pinged)


async def test_a_dead_incumbent_is_replaced() -> None:
    core, _ = make_core()
    metrics = BridgeMetrics(CollectorRegistry())
    transport = FakeTransport()
    transport.answer.set_result(False)  # no pong: the transport failed it
    old = Conn(transport)
    session = core.hello(hello(), old).session
    new = Conn()
    attached = await attach(core, hello(), new, False, metrics)
    assert attached.session is session and attached.welcome.resumed
    assert attached.superseded is old  # the caller closes it, as for a token takeover
    assert core.live_connection("dev") is new
    assert challenges(metrics, "dead") == 1


async def test_a_session_taken_by_its_token_during_the_challenge_stays_taken() -> None:
    """The dead incumbent was replaced meanwhile by a Hello with the token: the challenger does
    not take the session from that one."""
    core, _ = make_core()
    metrics = BridgeMetrics(CollectorRegistry())
    transport = FakeTransport()
    session = core.hello(hello(), Conn(transport)).session
    challenger = asyncio.create_task(attach(core, hello(), Conn(), False, metrics))
    await asyncio.sleep(0)
    owner = Conn()
    core.hello(hello(resume_token=session.session_id), owner)
    transport.answer.set_result(False)
    with pytest.raises(SessionTaken):
        await challenger
    assert core.live_connection("dev") is owner


async def test_an_incumbent_that_cannot_be_pinged_keeps_its_session() -> None:
    """gRPC (ping None): refused as before the challenge existed."""
    core, _ = make_core()
    metrics = BridgeMetrics(CollectorRegistry())
    transport = FakeTransport()
    transport.answer.set_result(None)
    incumbent = Conn(transport)
    core.hello(hello(), incumbent)
    with pytest.raises(SessionTaken):
        await attach(core, hello(), Conn(), False, metrics)
    assert challenges(metrics, "unchecked") == 1
    assert core.live_connection("dev") is incumbent


async def test_gates_are_per_bridge() -> None:
    one, _ = make_core()
    two, _ = make_core()
    assert gate_of(one) is gate_of(one) and gate_of(one) is not gate_of(two)


# -- the WebSocket side: WsTransport.ping -----------------------------------------------------

PING_SECONDS = 0.05


def sent_ping(transport: StubTransport) -> bytes:
    """The payload of the ping the connection wrote (server frames are unmasked)."""
    pings = [w for w in transport.written if w[0] == 0x80 | int(Opcode.PING)]
    assert len(pings) == 1, transport.written
    return pings[0][2:]


async def test_a_pong_within_the_deadline_says_alive() -> None:
    connection = await governed_connection(Governor(1 << 20))
    transport = connection.transport
    assert isinstance(transport, StubTransport)
    answer = asyncio.create_task(WsTransport(connection).ping(1.0))
    await asyncio.sleep(0)
    pong = Frame(Opcode.PONG, sent_ping(transport)).serialize(mask=True, extensions=[])
    connection.data_received(pong)
    assert await answer is True
    assert connection.state is State.OPEN


async def test_silence_says_dead_and_fails_the_connection_as_the_keepalive_does() -> None:
    connection = await governed_connection(Governor(1 << 20))
    assert await WsTransport(connection).ping(PING_SECONDS) is False
    await asyncio.sleep(0)  # the close's first step
    assert connection.state is State.CLOSING
    close = connection.protocol.close_sent
    assert close is not None and close.code == 1011 and close.reason == "keepalive ping timeout"
    connection.connection_lost(None)  # the close timeout would abort it; the stub has no socket
    await asyncio.sleep(0)


@pytest.mark.parametrize("cut", [14, 1000], ids=["its-header", "its-first-bytes"])
async def test_data_arriving_without_a_pong_says_alive(cut: int) -> None:
    """A live edge busy sending a large frame over a slow link answers late: the bytes of that
    frame (its 14-byte header alone, or some of its payload) prove it is there."""
    connection = await governed_connection(Governor(1 << 22))
    size = 4 * WHOLE_PAYLOAD_BYTES
    head = Frame(Opcode.BINARY, bytes(size)).serialize(mask=True, extensions=[])
    answer = asyncio.create_task(WsTransport(connection).ping(PING_SECONDS))
    await asyncio.sleep(0)  # the ping is out
    connection.data_received(head[:cut])
    assert await answer is True
    assert connection.state is State.OPEN


async def test_a_connection_not_reading_is_not_pinged() -> None:
    """Reading stopped for a memory grant: a pong would sit unread, so nothing is concluded."""
    governor = Governor(1 << 20)
    hog = governor.force(Component.RING, governor.admissible_bytes)
    connection = await governed_connection(governor)
    transport = connection.transport
    assert isinstance(transport, StubTransport)
    big = Frame(Opcode.BINARY, bytes(1000)).serialize(mask=True, extensions=[])
    connection.data_received(big[:8])  # its header: the payload waits for a grant
    assert not connection.reading
    assert await WsTransport(connection).ping(PING_SECONDS) is None
    assert transport.written == [] and connection.state is State.OPEN
    hog.release()
