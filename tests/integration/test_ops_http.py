"""The operations endpoint over real HTTP: metrics, liveness, readiness, resource debug."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from tests.integration.harness import http_get, running_bridge


async def test_metrics_health_ready_and_debug() -> None:
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        port = bridge.ports.http
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert bridge.capacity is not None
        name = bridge.capacity.decimator.name
        assert f'bridge_decimate_backend{{backend="{name}"}} 1.0' in body
        for name in (
            "bridge_frames_accepted_total",
            "bridge_ring_capacity_bytes",
            "bridge_decimation_seconds",
            "bridge_ready 1.0",
        ):
            assert name in body, name
        assert (await http_get(port, "/healthz"))[0] == 200
        assert await _answers(port, "/readyz", 200)
        status, body = await http_get(port, "/debug/resources")
        assert status == 200 and json.loads(body)["workers"] == 2
        assert (await http_get(port, "/nope"))[0] == 404
        bridge.ready = False
        assert await _answers(port, "/readyz", 503)  # within one beat (BEAT_SECONDS)


async def _answers(port: int, path: str, status: int, seconds: float = 1.0) -> bool:
    """``path`` answers ``status`` within ``seconds``: the probe child reads readiness from the
    shared block, which the bridge's loop refreshes every ``BEAT_SECONDS`` (0.1 s)."""
    deadline = time.monotonic() + seconds
    while (await http_get(port, path))[0] != status:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _get_from_a_thread(port: int, path: str, out: list[tuple[int, float]], delay: float) -> None:
    """GET ``path`` after ``delay`` seconds with plain sockets (the loop under test is blocked);
    appends (status, seconds to the answer)."""
    time.sleep(delay)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = sock.recv(64)
    out.append((int(head.split()[1]), time.monotonic() - start))


def _hold_the_loop(seconds: float) -> None:
    """Called from a coroutine: the event loop makes no turn meanwhile."""
    time.sleep(seconds)


async def test_the_probes_answer_while_the_event_loop_is_busy() -> None:
    """Issue 29: under 15 MiB floods the probes waited for the loop's turns (130-1,078 ms in the
    container); a liveness probe that times out gets a busy pod restarted."""
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        answers: list[tuple[int, float]] = []
        threads = [
            threading.Thread(target=_get_from_a_thread, args=(bridge.ports.http, p, answers, 0.2))
            for p in ("/healthz", "/readyz")
        ]
        for t in threads:
            t.start()
        _hold_the_loop(1.0)  # the loop is busy for a second
        for t in threads:
            t.join(5)
    assert sorted(status for status, _ in answers) == [200, 200]
    assert max(seconds for _, seconds in answers) < 0.5, answers


async def test_liveness_fails_once_the_event_loop_stops_turning() -> None:
    async with running_bridge() as bridge:
        assert bridge.ports is not None and bridge._http is not None
        bridge._http.loop_stall_seconds = 0.3
        answers: list[tuple[int, float]] = []
        thread = threading.Thread(
            target=_get_from_a_thread, args=(bridge.ports.http, "/healthz", answers, 0.8)
        )
        thread.start()
        _hold_the_loop(1.2)  # a stuck loop: no turn for longer than the threshold
        thread.join(5)
        assert answers and answers[0][0] == 503, answers
        await asyncio.sleep(0.6)  # turning again
        status, _ = await http_get(bridge.ports.http, "/healthz")
        assert status == 200


async def test_slow_clients_do_not_starve_the_probes() -> None:
    """100 connections that never send a request (a slowloris) hold no slot a probe needs."""
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        idle = [socket.create_connection(("127.0.0.1", bridge.ports.http)) for _ in range(100)]
        try:
            answers: list[tuple[int, float]] = []
            await asyncio.to_thread(_get_from_a_thread, bridge.ports.http, "/healthz", answers, 0)
            assert answers[0][0] == 200 and answers[0][1] < 0.5, answers
            status, _ = await http_get(bridge.ports.http, "/metrics")
            assert status == 200
        finally:
            for sock in idle:
                sock.close()


async def test_closing_ends_every_open_connection_on_its_own_loop() -> None:
    """CI (f3944c3): the slowloris test's idle connections left their handlers pending when the
    ops loop closed; garbage collection later ran their ``finally`` against the closed loop
    (82 "Event loop is closed" warnings, blamed on whichever test ran then). Closing must end
    every connection itself: each idle client reads EOF, and collection finds nothing pending."""
    import gc
    import sys

    caught: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: caught.append(f"{u.exc_value!r} in {u.object!r}")
    try:
        async with running_bridge() as bridge:
            assert bridge.ports is not None
            idle = [socket.create_connection(("127.0.0.1", bridge.ports.http)) for _ in range(20)]
            await asyncio.sleep(0.2)  # every connection accepted, each handler reading
        try:
            for sock in idle:
                sock.settimeout(2.0)
                assert sock.recv(16) == b"", "the server left a connection open"
        finally:
            for sock in idle:
                sock.close()
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert caught == [], caught[:3]
