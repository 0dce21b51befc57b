"""The container rig's ``/healthz`` probe measures the bridge, not the harness: its timing runs in
a process of its own, so a harness busy in C code (parsing ``/metrics``, holding its GIL) does not
inflate it (before, a probe thread of the harness waited for that GIL after its answer came)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.container.probe import HealthProbe

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def slow_server(delay_s: float) -> Iterator[int]:
    """The rig's own trivial server (``benchmarks.container.null_http``), answering ``delay_s``
    late, in a process of its own; its port."""
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.container.null_http", str(delay_s)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def probing(probe: HealthProbe, rounds: int) -> None:
    """Until ``probe`` has ``rounds`` results (10 s at most)."""
    deadline = time.monotonic() + 10
    while len(probe.results) < rounds and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_harness_holding_its_gil_does_not_slow_the_probes() -> None:
    """A probe is in flight (the server takes 50 ms) when the harness enters a long C call that
    holds its GIL: measured in a harness thread, that probe's answer waited for the GIL and read
    as the hold's length; measured in the probe's own process it reads 50 ms."""
    with slow_server(0.05) as port:
        probe = HealthProbe(port, period_s=0.01)
        probe.start()
        try:
            probing(probe, 3)
            held_from = time.monotonic()
            sum(range(40_000_000))  # one C call: this process's GIL is held throughout
            held_s = time.monotonic() - held_from
            time.sleep(0.3)
        finally:
            probe.stop()
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
    with slow_server(0.15) as port:
        probe = HealthProbe(port, period_s=0.05)
        probe.start()
        try:
            probing(probe, 4)
        finally:
            probe.stop()
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
