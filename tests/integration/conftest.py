"""Fixtures shared by integration tests.

Event loops: every async test runs on asyncio's default loop; the modules in ``BOTH_LOOPS`` (the
relay, bad-input, overflow and start paths) also run on uvloop, the loop ``simbridge serve``
uses. ``SIMBRIDGE_TEST_LOOPS=all`` runs every integration test on both (about twice as long).

Loop guard (fixture ``loop_guard``): inside ``with loop_guard():`` the test fails when one
callback holds the loop thread for more than 50 ms (``SLOW_CALLBACK_S``). Wall time alone would be
flaky on a loaded shared machine (load 10+ on 2 cores is normal here), so a callback's wall time is
split with ``/proc/thread-self/schedstat`` into CPU time, time runnable but waiting for a core
(other processes' doing, ignored) and the rest, time blocked by the callback itself (a sleep, a
blocking read, a lock, the GIL). CPU or blocked time above 50 ms fails. Scope: steady-state
phases only, after a warm-up (``tests/integration/test_loop_blocking.py``). Over whole tests
(startup, first connections, teardown) it failed about every other run here, on one-off
callbacks of 60-170 ms (first-use imports, handshakes under load) rather than steady work.
Default loop only: uvloop runs Cython handles the guard cannot time.

Charge debug mode (autouse fixture ``charge_debug``): every governor made during a test tracks its
live charges per owner (``SIMBRIDGE_CHARGE_DEBUG=1``, inherited by child bridges too); the test
fails when an in-process bridge reported a leak: a connection that ended still owning a charge,
or a bridge that closed with live charges (``bridge.server.governor.LEAKS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
    uvloop = None  # type: ignore[assignment]

BOTH_LOOPS = frozenset(
    {
        "test_relay.py",
        "test_bad_input.py",
        "test_overflow.py",
        "test_app_start.py",
        "test_pod_ops_http.py",
    }
)
SLOW_CALLBACK_S = 0.05


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    everywhere = os.environ.get("SIMBRIDGE_TEST_LOOPS") == "all"
    if uvloop is not None and (everywhere or item.path.name in BOTH_LOOPS):
        factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture(autouse=True)
def charge_debug(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Charge debug mode on; no leak reported during the test (see the module docstring)."""
    from bridge.server import governor

    monkeypatch.setenv(governor.DEBUG_ENV, "1")
    before = len(governor.LEAKS)
    yield
    leaks = governor.LEAKS[before:]
    del governor.LEAKS[before:]
    if leaks:
        pytest.fail("memory charges leaked:\n  " + "\n  ".join(leaks), pytrace=False)


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on yet (for peers started later in the test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runqueue_wait_s(fd: int | None) -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (``schedstat`` field 2)."""
    if fd is None:
        return 0.0
    return int(os.pread(fd, 128, 0).split()[1]) / 1e9


@contextlib.contextmanager
def guarding_the_loop() -> Iterator[list[str]]:
    """Time every asyncio callback run on this thread; yields the list of offenders."""
    slow: list[str] = []
    original = asyncio.events.Handle._run
    loop_thread = threading.get_ident()
    try:
        fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:  # no schedstat: only the CPU-time rule applies
        fd = None

    def timed(handle: asyncio.Handle) -> None:
        if threading.get_ident() != loop_thread:
            return original(handle)
        waited = _runqueue_wait_s(fd)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(handle)
        finally:
            wall = time.perf_counter() - wall
            if wall > SLOW_CALLBACK_S:
                cpu = time.thread_time() - cpu
                waited = _runqueue_wait_s(fd) - waited
                blocked = wall - cpu - waited if fd is not None else 0.0
                if cpu > SLOW_CALLBACK_S or blocked > SLOW_CALLBACK_S:
                    slow.append(
                        f"{handle!r}: {wall * 1e3:.0f} ms wall = {cpu * 1e3:.0f} CPU"
                        f" + {blocked * 1e3:.0f} blocked + {waited * 1e3:.0f} waiting for a CPU"
                    )

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    try:
        yield slow
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
        if fd is not None:
            os.close(fd)


@pytest.fixture
def loop_guard() -> Callable[[], contextlib.AbstractContextManager[list[str]]]:
    """``with loop_guard(): ...``: the test fails when a callback inside the block blocks the
    loop (see the module docstring). Used around steady-state phases, after warm-up."""

    @contextlib.contextmanager
    def guard() -> Iterator[list[str]]:
        with guarding_the_loop() as slow:
            yield slow
        if slow:
            lines = "\n  ".join(slow)
            pytest.fail(f"callbacks blocked the event loop:\n  {lines}", pytrace=False)

    return guard


@pytest.fixture
def ws_received(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The messages the bridge's WebSocket transport handed to ingest, in order."""
    from bridge.server.ports import Received
    from bridge.server.ws_impl import WsTransport

    messages: list[bytes] = []
    original = WsTransport.recv

    async def spy(self: WsTransport) -> Received | None:
        got = await original(self)
        if got is not None:
            messages.append(bytes(got.data))
        return got

    monkeypatch.setattr(WsTransport, "recv", spy)
    yield messages
