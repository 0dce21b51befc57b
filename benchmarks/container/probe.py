"""Probes the container rig reads on the host: process RSS, the cgroup's anonymous memory, the
kernel's OOM-kill lines, the bridge's ``/metrics`` over plain HTTP, ``/healthz`` latency (from a
process of its own), and the rlimits a container may be given."""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def _ulimit(kind: int, want: int) -> int:
    """``want``, capped at this process's hard limit (a container may not raise it)."""
    hard = resource.getrlimit(kind)[1]
    return want if hard == resource.RLIM_INFINITY else min(hard, want)


_NOFILE = _ulimit(resource.RLIMIT_NOFILE, 16384)
_NPROC = _ulimit(resource.RLIMIT_NPROC, 4096)
ULIMITS = ("--ulimit", f"nofile={_NOFILE}:{_NOFILE}", "--ulimit", f"nproc={_NPROC}:{_NPROC}")
# Metrics the rig reads; the governor's are used when the bridge exports them.
WANTED = {
    "bridge_limit_cpu_cores",
    "bridge_limit_memory_bytes",
    "bridge_plan_memory_limit_bytes",
    "bridge_plan_ring_budget_bytes",
    "bridge_plan_workers",
    "bridge_memory_budget_bytes",
    "bridge_memory_charged_bytes",
    "process_resident_memory_bytes",
    "bridge_frames_delivered_total",
    "bridge_ring_occupancy_bytes",
    "bridge_subscribers",
}


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now: all bound at once, then released (one at a time, the
    kernel may hand the same port out twice: a rig run failed with "http_port: port 51893 is
    also ws_port")."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def process_rss(pid: int) -> tuple[int, int]:
    """(anonymous + shmem RSS, VmRSS) of ``pid`` in bytes; (0, 0) when the process is gone.

    The first is what the container's memory cgroup is charged for this process for certain: file
    pages in VmRSS (the shared libraries) are charged to whichever cgroup first read them, so
    VmRSS can exceed the limit of a healthy container."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return fields.get("RssAnon", 0) + fields.get("RssShmem", 0), fields.get("VmRSS", 0)


def cgroup_anon(memory_dir: Path, version: str) -> int:
    """Anonymous memory charged to the container's memory cgroup (``memory.stat``: v1
    ``total_rss``, transparent huge pages included; v2 ``anon``), in bytes. What an OOM kill is
    about: page cache is reclaimed before it, anonymous memory is not (there is no swap)."""
    key = "anon" if version == "v2" else "total_rss"
    for line in (memory_dir / "memory.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise ValueError(f"memory.stat has no {key}")


@dataclass(slots=True)
class HealthProbe:
    """``GET /healthz`` every ``period_s`` from a process of its own
    (:mod:`benchmarks.container.healthz_probe`), beside a control: a trivial server in its own
    process (:mod:`benchmarks.container.null_http`) probed at the same instant. In a thread of
    the harness, a probe's timing waited for the harness's GIL while it parsed ``/metrics``; and
    on this 2-vCPU host a trivial server itself sometimes answers in 100 ms. ``(t, latency_s,
    ok)`` per probe, ``t`` on ``time.monotonic`` (the system-wide clock), and the control's
    latency in ``control`` (same index). A probe that gets no 200 within ``timeout_s`` counts
    as that long, not OK."""

    port: int
    period_s: float = 0.1
    timeout_s: float = 2.0
    results: list[tuple[float, float, bool]] = field(default_factory=list)
    control: list[float] = field(default_factory=list)
    _procs: list[subprocess.Popen[str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def start(self) -> None:
        root = Path(__file__).resolve().parents[2]
        null = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.container.null_http"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        self._procs.append(null)
        assert null.stdout is not None
        control_port = null.stdout.readline().strip()
        args = [str(self.port), str(self.period_s), str(self.timeout_s), control_port]
        probe = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.container.healthz_probe", *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        self._procs.append(probe)
        self._reader = threading.Thread(
            target=self._read, args=(probe,), name="healthz-lines", daemon=True
        )
        self._reader.start()

    def _read(self, probe: subprocess.Popen[str]) -> None:
        assert probe.stdout is not None
        for line in probe.stdout:
            t, latency, ok, control = line.split()
            self.control.append(float(control))
            self.results.append((float(t), float(latency), ok == "1"))

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
            try:
                proc.wait(self.timeout_s + 1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(self.timeout_s + 1)
        for proc in self._procs:
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()

    def _window(
        self, since: float, until: float, host_busy_s: float | None
    ) -> list[tuple[float, bool]]:
        """(latency, ok) of the probes started in [since, until]; with ``host_busy_s``, without
        the OK ones whose control took longer than that (the host was busy, not the bridge)."""
        return [
            (lat, ok)
            for (t, lat, ok), ctl in zip(self.results, self.control, strict=True)
            if since <= t <= until and not (ok and host_busy_s is not None and ctl > host_busy_s)
        ]

    def host_busy(
        self, since: float, until: float, host_busy_s: float
    ) -> list[tuple[float, float]]:
        """(bridge latency, control latency) of the OK probes in [since, until] whose control
        answered slower than ``host_busy_s``."""
        return [
            (lat, ctl)
            for (t, lat, ok), ctl in zip(self.results, self.control, strict=True)
            if since <= t <= until and ok and ctl > host_busy_s
        ]

    def percentile(
        self, since: float, until: float, q: float, host_busy_s: float | None = None
    ) -> float:
        """The ``q`` quantile (0..1, nearest rank) of the latencies in [since, until]."""
        window = sorted(lat for lat, _ in self._window(since, until, host_busy_s))
        return window[min(len(window) - 1, int(q * len(window)))] if window else 0.0

    def worst(
        self, since: float, until: float, host_busy_s: float | None = None
    ) -> tuple[float, int, int]:
        """(max latency s, probes, failed probes) of the probes started in [since, until]."""
        window = self._window(since, until, host_busy_s)
        return (
            max((lat for lat, _ in window), default=0.0),
            len(window),
            sum(1 for _, ok in window if not ok),
        )


def kernel_oom_kills(container_id: str) -> list[str]:
    """The kernel log's OOM-kill lines for this container's memory cgroup (``dmesg``; empty when
    the log cannot be read). Why: when the kill ends the container, its cgroup and counters go
    with it, and podman does not always flag OOMKilled under runc with cgroup v1."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        line.strip()
        for line in out.splitlines()
        if "oom-kill:" in line and f"task_memcg=/libpod_parent/libpod-{container_id}" in line
    ]


async def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str]:  # noqa: ASYNC109
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: rig\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def parse_metrics(text: str) -> dict[str, float]:
    """The wanted samples; labelled ones are summed (``bridge_memory_charged_bytes`` over its
    components) and also kept per label set as ``name{k=v}``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in WANTED:
                continue
            out[s.name] = out.get(s.name, 0.0) + s.value
            if s.labels:
                key = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{key}}}"] = s.value
    return out
