"""Probes the container rig reads on the host: process RSS, the kernel's OOM-kill lines, the
bridge's ``/metrics`` over plain HTTP, and the rlimits a container may be given."""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
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
