"""The N = 2 against N = 1 line of ``make bench-scale`` and where the difference comes from,
from figures the run measured (issue 31: "with N = 2, CPU per frame is within 15 % of N = 1, and
the difference is explained").

The explanation separates what the pod adds per *connection* (the claim: one round trip to the
supervisor at each Hello) from what a second process changes per *frame* (the loops, the other
threads, and how many frames a loop handles each time it wakes).
"""

from __future__ import annotations

import math
from typing import Protocol


class Costs(Protocol):
    """Means over the rounds of one (workload, N) (``report.Summary``)."""

    @property
    def loop_us(self) -> float: ...
    @property
    def other_us(self) -> float: ...
    @property
    def cpu_us(self) -> float: ...
    @property
    def wakeups(self) -> float: ...
    @property
    def preempted(self) -> float: ...
    @property
    def acks(self) -> float: ...
    @property
    def per_push(self) -> float: ...
    @property
    def conns(self) -> int: ...
    @property
    def frames_per_s(self) -> float: ...
    @property
    def frames(self) -> float: ...


def pct(new: float, old: float) -> float:
    return 100 * (new / old - 1) if old and math.isfinite(old) else float("nan")


def claim_us_per_frame(costs: Costs, claim_us: float) -> float:
    """One claim per connection of a cell, spread over the frames of its measured window."""
    return costs.conns * claim_us / costs.frames if costs.frames else float("nan")


def comparison_lines(
    cloud1: Costs | None,
    cloud2: Costs | None,
    small1: Costs | None,
    small2: Costs | None,
    claim_us: float,
    idle_cores: dict[int, float] | None = None,
    rtt_us: float = float("nan"),
) -> list[str]:
    """The line, the claims' share, and per workload the measured deltas: loops, other
    threads, wake-ups, preemptions, the sink's acks, and the processes' background CPU (what
    they burn with no edge: timers, samplers) spread over the frames/s of N = 2."""
    idle = idle_cores or {}
    pairs = {"clouds": (cloud1, cloud2), "1 KB": (small1, small2)}
    figures = {
        name: pct(two.cpu_us, one.cpu_us)
        for name, (one, two) in pairs.items()
        if one is not None and two is not None
    }
    if not figures:
        return []
    line = ", ".join(f"{v:+.1f} % ({name})" for name, v in figures.items())
    out = ["", f"N = 2 vs N = 1: CPU per frame {line}"]
    claims = ", ".join(
        f"{name} {one.conns} x {claim_us:.0f} us / {one.frames:.0f} frames = "
        f"{claim_us_per_frame(one, claim_us):.3f} us per frame"
        for name, (one, two) in pairs.items()
        if one is not None and two is not None
    )
    out.append(
        f"# claims: one Unix-socket round trip to the supervisor per connection, at its Hello, "
        f"none per frame: a Hello->Welcome in the pod at N = 1 takes {claim_us:.0f} us more than "
        f"in a single bridge (p50s below; the round trip alone: {rtt_us:.0f} us, the rest is "
        "waking the supervisor and the worker's await on shared cores). The cells open "
        "every connection before the warm-up, so no claim falls in a measured window; spread "
        f"over a cell anyway: {claims}. Claims are not the difference"
    )
    for name, (one, two) in pairs.items():
        if one is None or two is None:
            continue
        d_loop, d_other = two.loop_us - one.loop_us, two.other_us - one.other_us
        out.append(
            f"# {name}: {one.cpu_us:.1f} -> {two.cpu_us:.1f} us per frame; loops "
            f"{d_loop:+.1f} us ({pct(two.loop_us, one.loop_us):+.1f} %), other threads "
            f"{d_other:+.1f} us ({pct(two.other_us, one.other_us):+.1f} %); per 1000 frames the "
            f"loops woke {one.wakeups:.0f} -> {two.wakeups:.0f} times and were preempted "
            f"{one.preempted:.0f} -> {two.preempted:.0f} times; the sink's acks "
            f"{one.acks:.0f} -> {two.acks:.0f}; frames per push message {one.per_push:.1f} -> "
            f"{two.per_push:.1f}" + _background(idle, two)
        )
    out.append(
        "# where a second process costs per frame: each loop sees half the traffic, so it "
        "handles fewer frames each time it wakes or turns (more wake-ups per frame: more epoll "
        "waits, socket reads and timer passes per frame) and packs fewer frames into each push "
        "message to the sink (frames per push above: each message has a fixed gRPC cost); "
        "each process keeps its own push stream to the sink (its acks amortised over half the "
        "frames) and its own periodic tasks "
        "(background CPU above); "
        "two loops, the workers and the generator take turns on the shared cores (preemptions "
        "above: each costs a switch and cold caches). "
        "None of it is ownership: a frame never meets the supervisor"
    )
    return out


def _background(idle: dict[int, float], two: Costs) -> str:
    """The second process's background CPU (measured with no edge) per frame at N = 2's rate."""
    if 1 not in idle or 2 not in idle or not two.frames_per_s:
        return ""
    extra = idle[2] - idle[1]
    return (
        f"; background CPU with no edge {1e3 * idle[1]:.1f} -> {1e3 * idle[2]:.1f} ms/s, "
        f"{1e6 * extra / two.frames_per_s:+.2f} us per frame at N = 2's rate"
    )
