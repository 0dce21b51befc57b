"""Probes the container rig reads on the host: process RSS, the cgroup's anonymous memory, the
kernel's OOM-kill lines, the bridge's ``/metrics`` over plain HTTP, ``/healthz`` latency (from a
thread of its own), and the rlimits a container may be given."""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import threading
import time
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    """``GET /healthz`` every ``period_s`` from a thread of its own (so the harness's event loop,
    busy with scrapes and podman calls, never delays a probe): ``(t, latency_s, ok)`` per probe,
    ``t`` on ``time.monotonic``. A probe that gets no 200 within ``timeout_s`` counts as that
    long, not OK."""

    port: int
    period_s: float = 0.1
    timeout_s: float = 2.0
    results: list[tuple[float, float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)

    def once(self) -> tuple[float, bool]:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.port), self.timeout_s) as sock:
                sock.settimeout(max(0.001, self.timeout_s - (time.monotonic() - t0)))
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: rig\r\nConnection: close\r\n\r\n")
                head = sock.recv(64)
            ok = head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200")
        except OSError:
            ok = False
        latency = time.monotonic() - t0
        return (latency if ok else max(latency, self.timeout_s)), ok

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            latency, ok = self.once()
            self.results.append((t, latency, ok))
            next_t = max(next_t + self.period_s, time.monotonic())
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def percentile(self, since: float, until: float, q: float) -> float:
        """The ``q`` quantile (0..1, nearest rank) of the latencies in [since, until]."""
        window = sorted(lat for t, lat, _ in self.results if since <= t <= until)
        return window[min(len(window) - 1, int(q * len(window)))] if window else 0.0

    def worst(self, since: float, until: float) -> tuple[float, int, int]:
        """(max latency s, probes, failed probes) of the probes started in [since, until]."""
        window = [(lat, ok) for t, lat, ok in self.results if since <= t <= until]
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
