"""The hostile cases of the container rig (:mod:`benchmarks.container.hostile`): what each
attacks with, and the phases every case runs through."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Case:
    """``attacks`` are :mod:`benchmarks.hostile` ``--attack`` specs; ``shrink``: two live memory
    decreases (``podman update --memory``) to just above the working set under the attack."""

    name: str
    attacks: tuple[str, ...]
    what: str
    shrink: bool = False


CASES = {
    c.name: c
    for c in (
        Case("baseline", (), "no attacker: the harness's own figures (well-behaved edge only)"),
        Case(
            "ignore-pause",
            ("ws-pause:3", "grpc-pause:1"),
            "3 WebSocket + 1 gRPC edges ignoring PAUSE, never reading, 15 MiB frames",
        ),
        Case("subscribers", ("subscribers:4",), "4 Subscribe calls that never read"),
        Case(
            "bomb-inline",
            ("bomb-quantized",),
            "quantized-codec frames of ~1 KB declaring ~16 MiB (decoded inline)",
        ),
        Case(
            "bomb-offloop",
            ("bomb-quantized-padded",),
            "the same padded to >= 64 KiB (decoded off the event loop)",
        ),
        Case("bomb-zstd", ("bomb-zstd",), "zstd-codec frames of ~530 B inflating to ~16 MiB"),
        Case(
            "chunk-hold",
            ("chunk-hold",),
            "one connection opens 15 MiB chunked frames on 64 streams, never finishes them",
        ),
        Case(
            "shrink",
            ("ws-pause:3", "grpc-pause:1"),
            "live memory shrinks to just above the working set with the ignore-pause edges on",
            shrink=True,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Timing:
    warmup_s: float = 2.0  # the good edge alone, sink down
    down_s: float = 5.0  # attackers on, sink down
    up_s: float = 8.0  # attackers on, sink up
    shrink_hold_s: float = 3.0  # after each shrink step (shrink case only)
    settle_s: float = 2.0  # sink up → first shrink step

    def attack_s(self, case: Case) -> float:
        shrink = self.settle_s + 2 * self.shrink_hold_s if case.shrink else 0.0
        return self.down_s + shrink + self.up_s
