"""Shared helpers for integration tests: real bridges (in-process or as a child process), raw
protocol clients for bad-input tests, and small cloud builders. Everything binds 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bridge.config import settings as settings_mod
from bridge.server.app import BridgeService
from bridge.v1 import bridge_pb2 as pb
from loadgen.launch import ChildProcess, serve_command

ROOT = Path(__file__).resolve().parents[2]


def bridge_settings(**overrides: Any) -> settings_mod.Settings:
    base = settings_mod.Settings(
        host="127.0.0.1",
        ws_port=0,
        grpc_port=0,
        http_port=0,
        adapt=False,
        ack_interval_seconds=0.001,
        sink_backoff_initial_seconds=0.05,
        sink_backoff_max_seconds=0.5,
        workers=2,
    )
    return base.replace(**overrides)


@asynccontextmanager
async def running_bridge(**overrides: Any) -> AsyncIterator[BridgeService]:
    service = BridgeService(bridge_settings(**overrides), CollectorRegistry())
    await service.start()
    try:
        yield service
    finally:
        await service.close()


def ws_url(service: BridgeService) -> str:
    assert service.ports is not None
    return f"ws://127.0.0.1:{service.ports.ws}/v1/ingest"


def grpc_target(service: BridgeService) -> str:
    assert service.ports is not None
    return f"127.0.0.1:{service.ports.grpc}"


def metric(service: BridgeService, name: str, **labels: str) -> float:
    value = service.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def xyz_cloud(points: np.ndarray) -> pb.PointCloud:
    data = np.ascontiguousarray(points, dtype="<f4")
    return pb.PointCloud(
        point_stride=12,
        fields=[
            pb.PackedField(name="x", offset=0, type=pb.FLOAT32),
            pb.PackedField(name="y", offset=4, type=pb.FLOAT32),
            pb.PackedField(name="z", offset=8, type=pb.FLOAT32),
        ],
        data=data.tobytes(),
    )


def cloud_frame(stream: str, seq: int, n: int = 8, seed: int = 0) -> pb.Frame:
    rng = np.random.default_rng(seed + seq)
    return pb.Frame(stream_id=stream, seq=seq, point_cloud=xyz_cloud(rng.uniform(-5, 5, (n, 3))))


def hello(device: str, *streams: str, **kw: Any) -> pb.EdgeMessage:
    specs = [pb.StreamSpec(stream_id=s, kind=pb.POINT_CLOUD) for s in streams]
    return pb.EdgeMessage(hello=pb.Hello(device_id=device, streams=specs, **kw))


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
    finally:  # closed on every path, and awaited: no writer left to the garbage collector
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def wait_until(predicate: Any, timeout: float = 10.0, step: float = 0.01) -> bool:  # noqa: ASYNC109
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(step)
    return True


class RawGrpcEdge:
    """A bare Ingest.Connect call driven message by message (for bad-input tests)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
            ],
        )
        method = self.channel.stream_stream(
            "/bridge.v1.Ingest/Connect",
            request_serializer=None,
            response_deserializer=pb.BridgeMessage.FromString,
        )
        self.call = method()

    async def send(self, raw: bytes) -> None:
        await self.call.write(raw)

    async def recv(self, timeout: float = 5.0) -> pb.BridgeMessage | None:  # noqa: ASYNC109
        msg = await asyncio.wait_for(self.call.read(), timeout)
        return None if msg is grpc.aio.EOF else msg

    async def status(self) -> grpc.StatusCode:
        """Read whatever the bridge still sends, then the call's final status."""
        try:
            while await asyncio.wait_for(self.call.read(), 5.0) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError:
            pass
        return await asyncio.wait_for(self.call.code(), 5.0)

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


class BridgeProcess:
    """``simbridge serve`` as a real child process (for SIGTERM / SIGKILL lifecycle tests); the
    launching, waiting and killing are :class:`loadgen.launch.ChildProcess`'s."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.proc = child.proc
        self.ws, self.grpc, self.http = child.port("ws"), child.port("grpc"), child.port("http")

    @classmethod
    async def start(
        cls, *args: str, env: dict[str, str] | None = None, cgroup: Path | None = None
    ) -> BridgeProcess:
        """Start ``simbridge serve``; with ``cgroup`` (a v1/v2 group directory) the process
        enters that group before exec, so it finds it through /proc/self/cgroup at startup."""
        cmd = serve_command(*args)
        if cgroup is not None:
            cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$0" "$@"', *cmd]
        env = {"BRIDGE_ADAPT": "false", **(env or {})}
        return cls(await ChildProcess.start(cmd, env=env, cwd=ROOT, timeout=30))

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws}/v1/ingest"

    def signal(self, sig: signal.Signals) -> None:
        self.child.signal(sig)

    async def wait(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        return await self.child.wait(timeout)

    def logs(self) -> str:
        return self.child.logs(tail=1 << 30)

    def kill(self) -> None:
        """Kill if still running and release the pipe and the log file (idempotent)."""
        self.child.kill()


@asynccontextmanager
async def serve_process(*args: str) -> AsyncIterator[BridgeProcess]:
    """``simbridge serve`` as a child process on free ports, killed on exit."""
    proc = await BridgeProcess.start("--ws-port=0", "--grpc-port=0", "--http-port=0", *args)
    try:
        yield proc
    finally:
        proc.kill()


def rss(pid: int) -> int:
    """A process's resident bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scraped(text: str, name: str, **labels: str) -> list[float]:
    """The values of sample ``name`` whose labels include ``labels`` in a /metrics body."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
