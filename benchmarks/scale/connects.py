"""What a pod adds to a session's setup, measured beside ``make bench-scale``'s cells: the claim.

In a pod every Hello waits for one claim round trip to the supervisor over its Unix control
socket before the Welcome (docs/pod-worker.md); a frame costs no claim. Two measurements:

- :func:`connect_loop`: connections one after the other against a running bridge, each timed
  in two parts: connect (TCP + WebSocket upgrade) and Hello→Welcome (where the claim sits).
  ``new``: a device never seen (a claim granted at once); ``resume``: one device reconnecting
  (in a pod of N > 1 the kernel lands it on any process: when it changes process, the claim
  asks the previous owner to release it: a second round trip, and the release's wait).
- :func:`claim_rtts`: the claim alone, ``claim`` → ``claimed``, against the supervisor's real
  control server (:class:`bridge.pod.control.ControlServer` and its ownership table) in a
  process of its own (``python -m benchmarks.scale.connects``), from a blocking client here: the
  round trip an ingest process's Hello waits for, and the supervisor's CPU per claim.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from websockets.asyncio.client import connect

from benchmarks.relay.clients import Client, hello_message

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Timing:
    """Milliseconds: median and 90th percentile over ``count`` runs (NaN when none ran)."""

    count: int
    p50_ms: float
    p90_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Timing:
        if not seconds:
            return cls(0, float("nan"), float("nan"))
        ordered = sorted(seconds)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        return cls(len(ordered), 1e3 * statistics.median(ordered), 1e3 * p90)


@dataclass
class ConnectTimes:
    label: str  # "plain" (a single bridge, no supervisor) or "pod"
    procs: int
    connect: Timing  # TCP connect + WebSocket upgrade, new devices
    hello_welcome: Timing  # Hello sent -> Welcome read, new devices
    resume_hello_welcome: Timing  # the same for one device reconnecting
    errors: list[str]


async def _session(address: str, device: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    async with connect(f"ws://{address}/v1/ingest", compression=None, ping_interval=None) as ws:
        t1 = time.perf_counter()
        await ws.send(hello_message(device))
        Client.check_welcome(await asyncio.wait_for(ws.recv(), 10))
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


async def connect_loop(
    address: str, label: str, procs: int, count: int, prefix: str
) -> ConnectTimes:
    """``count`` new devices, then ``count`` reconnects of one device, one at a time."""
    connects: list[float] = []
    hellos: list[float] = []
    resumes: list[float] = []
    errors: list[str] = []
    try:
        for i in range(count):
            c, h = await _session(address, f"{prefix}-new-{i}")
            connects.append(c)
            hellos.append(h)
        for _ in range(count):
            _, h = await _session(address, f"{prefix}-again")
            resumes.append(h)
    except Exception as exc:  # reported with the figures, the run goes on
        errors.append(f"connect loop: {type(exc).__name__}: {exc}")
    return ConnectTimes(
        label, procs, Timing.of(connects), Timing.of(hellos), Timing.of(resumes), errors
    )


# -- the claim alone -------------------------------------------------------------------------


@dataclass
class ClaimRtt:
    rtt: Timing
    mean_us: float
    supervisor_cpu_us_per_claim: float  # the control server's process, per claim
    errors: list[str]


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICK


def claim_rtts(count: int) -> ClaimRtt:
    """``count`` claims of new devices, one at a time, against the real control server."""
    from bridge.protocol import podcontrol

    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.scale.connects"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    times: list[float] = []
    errors: list[str] = []
    cpu = float("nan")
    try:
        path = proc.stdout.readline().strip()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            reader = sock.makefile("rb")  # closed below: until then the socket stays open
            for i in range(-20, count):  # 20 unmeasured: the first calls pay for imports
                if i == 0:
                    cpu0 = _cpu_seconds(proc.pid)
                line = podcontrol.encode(
                    "claim", id=i + 100, device=f"d{i}", token="", proven=False
                )
                t0 = time.perf_counter()
                sock.sendall(line)
                reply = podcontrol.decode(reader.readline(), expect=podcontrol.KINDS_TO_WORKER)
                t1 = time.perf_counter()
                if reply.kind != "claimed" or not reply["granted"]:
                    errors.append(f"claim {i}: {reply}")
                    break
                if i >= 0:
                    times.append(t1 - t0)
            cpu = _cpu_seconds(proc.pid) - cpu0
            reader.close()
    except (OSError, ValueError) as exc:
        errors.append(f"claim loop: {type(exc).__name__}: {exc}")
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    timing = Timing.of(times)
    mean = 1e6 * statistics.fmean(times) if times else float("nan")
    per_claim = 1e6 * cpu / len(times) if times else float("nan")
    return ClaimRtt(timing, mean, per_claim, errors)


async def _serve() -> None:
    """The supervisor's control server alone: every peer is slot 0; runs until stdin closes."""
    from bridge.pod.control import ControlServer
    from bridge.pod.ownership import Ownership

    server = ControlServer(Ownership(6.0), lambda _pid: 0, lambda _peer: None)
    await server.start()
    print(server.path, flush=True)
    try:
        await asyncio.to_thread(sys.stdin.read)
        # The client hung up first: let its channel end by EOF (cancelling a live one makes
        # Python 3.11's start_server callback log a CancelledError).
        for _ in range(100):
            if not server.peers:
                break
            await asyncio.sleep(0.01)
    finally:
        await server.close()


def main() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(_serve())
    else:  # as the supervisor runs
        uvloop.run(_serve())


if __name__ == "__main__":
    main()
