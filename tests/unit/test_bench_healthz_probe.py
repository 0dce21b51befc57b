"""The container rig's ``/healthz`` probe measures the bridge, not the harness: its timing runs in
a process of its own, so a harness busy in C code (parsing ``/metrics``, holding its GIL) does not
inflate it (before, a probe thread of the harness waited for that GIL after its answer came)."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.container.probe import HealthProbe

SERVER = r"""
import socket, sys
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
"""
PAUSE = "conn.recv(1024); __import__('time').sleep({})"  # a server that answers this late
SLOW_SERVER = SERVER.replace("conn.recv(1024)", PAUSE.format(0.15))


def test_a_harness_holding_its_gil_does_not_slow_the_probes() -> None:
    """A probe is in flight (the server takes 50 ms) when the harness enters a long C call that
    holds its GIL: measured in a harness thread, that probe's answer waited for the GIL and read
    as the hold's length; measured in the probe's own process it reads 50 ms."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER.replace("conn.recv(1024)", PAUSE.format(0.05))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        probe = HealthProbe(int(server.stdout.readline()), period_s=0.01)
        probe.start()
        try:
            deadline = time.monotonic() + 10
            while len(probe.results) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            held_from = time.monotonic()
            sum(range(40_000_000))  # one C call: this process's GIL is held throughout
            held_s = time.monotonic() - held_from
            time.sleep(0.3)
        finally:
            probe.stop()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert held_s > 0.2, f"the hold was too short to tell ({held_s:.2f} s)"
    overlapping = [
        lat for t, lat, _ in probe.results if t <= held_from + held_s and t + lat >= held_from
    ]
    assert overlapping, "no probe was in flight while the harness held its GIL"
    assert all(ok for _, _, ok in probe.results)
    assert max(overlapping) < held_s / 2, (max(overlapping), held_s)


def test_a_slow_bridge_is_measured_and_the_control_stays_fast() -> None:
    """Each round probes the bridge and a trivial control server at once: a bridge that takes
    150 ms shows 150 ms, the control (its own process) a few ms, so nothing is set apart."""
    server = subprocess.Popen(
        [sys.executable, "-c", SLOW_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        probe = HealthProbe(int(server.stdout.readline()), period_s=0.05)
        probe.start()
        try:
            deadline = time.monotonic() + 10
            while len(probe.results) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            probe.stop()
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert len(probe.control) == len(probe.results) >= 4
    assert min(lat for _, lat, _ in probe.results) >= 0.15
    assert max(probe.control) < 0.15
    worst, probes, failed = probe.worst(0, time.monotonic(), host_busy_s=1.0)
    assert worst >= 0.15 and probes == len(probe.results) and failed == 0


def test_probes_taken_while_the_host_was_busy_are_set_apart() -> None:
    """Only OK probes whose control answered slower than the threshold are set apart; a failed
    probe never is."""
    probe = HealthProbe(0)
    probe.results += [(1.0, 0.004, True), (2.0, 0.120, True), (3.0, 0.300, True), (4.0, 2.0, False)]
    probe.control += [0.002, 0.003, 0.110, 0.200]
    assert probe.host_busy(0, 10, 0.05) == [(0.300, 0.110)]
    assert probe.worst(0, 10, 0.05) == (2.0, 3, 1)  # the failed one stays
    assert probe.worst(0, 3.5, 0.05) == (0.120, 2, 0)  # 0.120 was the bridge: kept
    assert probe.worst(0, 3.5) == (0.300, 3, 0)


def test_free_ports_are_distinct() -> None:
    from benchmarks.container.probe import free_ports

    for _ in range(50):
        ports = free_ports(3)
        assert len(set(ports)) == 3, ports
