"""The probes come from a child process (bridge.server.probe_child): answered fast while the
bridge's threads hold the GIL, through a slowloris, and never outliving the bridge."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from tests.integration.harness import ROOT, http_get, running_bridge, serve_process, wait_until

BOUND_S = 0.020  # p99 of the probes' answers (the kubelet's timeout is 1 s; a thread got 146 ms)


def _prober(port: int, period: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.container.healthz_probe", str(port), str(period), "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def probe_latencies(port: int, count: int, period: float = 0.02) -> list[tuple[float, bool]]:
    """``count`` probes of ``/healthz`` from a process of its own (in a thread of this process
    the timing would wait for this process's GIL): (seconds to the status line, 200) each."""
    proc = _prober(port, period)
    assert proc.stdout is not None
    out: list[tuple[float, bool]] = []
    try:
        while len(out) < count:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)
            assert line, "the prober stopped"
            _, latency, ok, *_ = line.split()
            out.append((float(latency), ok == "1"))
    finally:
        proc.terminate()
        proc.wait(5)
        proc.stdout.close()
    return out


def p99(latencies: list[tuple[float, bool]]) -> float:
    return sorted(s for s, _ in latencies)[int(0.99 * len(latencies)) - 1]


def _spin(stop: threading.Event) -> None:
    """Python bytecode without a pause: holds the GIL but for the switch interval."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


async def test_healthz_answers_within_20ms_while_the_bridges_threads_hold_the_gil() -> None:
    """Issue 29: answered by a thread of the bridge, a probe waited for the GIL (two spinning
    threads: p50 55-74 ms, p99 146-197 ms on 2 vCPUs); the child has a GIL of its own."""
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        stop = threading.Event()
        spinners = [threading.Thread(target=_spin, args=(stop,)) for _ in range(2)]
        for t in spinners:
            t.start()
        try:
            answers = await probe_latencies(bridge.ports.http, 100)
        finally:
            stop.set()
            for t in spinners:
                t.join()
    assert all(ok for _, ok in answers), answers
    ms = [s * 1000 for s, _ in answers]
    summary = f"p50 {statistics.median(ms):.1f} ms, p99 {p99(answers) * 1000:.1f} ms"
    assert p99(answers) <= BOUND_S, summary


async def test_idle_connections_and_oversized_heads_do_not_hold_the_probes_up() -> None:
    """300 connections that never send a request: more than the 256 allowed, so the oldest idle
    ones give way to new connections (before, a probe past the cap was closed at once); a head
    over 8 KiB is closed unanswered."""
    async with running_bridge() as bridge:
        assert bridge.ports is not None
        port = bridge.ports.http
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        try:
            big = socket.create_connection(("127.0.0.1", port))
            big.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 9000)
            big.settimeout(5)
            try:
                assert big.recv(64) == b"", "a head over 8 KiB was answered"
            except ConnectionResetError:
                pass  # closed with the unread rest of it in its buffer: closed all the same
            finally:
                big.close()
            answers = await probe_latencies(port, 30)
            assert all(ok for _, ok in answers), answers
            assert p99(answers) <= BOUND_S, answers
            assert (await http_get(port, "/metrics"))[0] == 200
        finally:
            for sock in idle:
                sock.close()


def _probe_children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line names the probe child."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"probe_child" in f.read():
                    found.append(int(entry))
    return found


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its reaper counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_the_probe_child_exits_when_the_bridge_is_killed() -> None:
    async with serve_process() as bridge:
        assert (await http_get(bridge.http, "/healthz"))[0] == 200
        children = _probe_children(bridge.proc.pid)
        assert len(children) == 1, children
        bridge.proc.send_signal(signal.SIGKILL)
        bridge.proc.wait()
        assert await wait_until(lambda: _gone(children[0]), timeout=5), "the probe child lives on"


async def test_a_dead_probe_child_is_started_again() -> None:
    async with running_bridge() as bridge:
        assert bridge.ports is not None and bridge._http is not None
        child = bridge._http.child
        assert child is not None and child.proc is not None
        first = child.proc.pid
        os.kill(first, signal.SIGKILL)
        began = time.monotonic()
        assert await wait_until(lambda: child.restarts == 1, timeout=5)
        assert child.proc.pid != first
        assert (await http_get(bridge.ports.http, "/healthz"))[0] == 200
        assert time.monotonic() - began < 2.0  # the first back-off is 0.1 s
