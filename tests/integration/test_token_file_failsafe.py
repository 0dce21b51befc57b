"""A device token file that turns bad (issue 29): a real ``simbridge serve`` keeps the last good
entries, so devices with good tokens still get Welcome over both transports (before: every Hello
failed with a traceback, WebSocket close 1011 / gRPC UNKNOWN), and the bad version is read once,
not once per Hello."""

from __future__ import annotations

import asyncio
from pathlib import Path

from websockets.asyncio.client import connect

from bridge.config.credentials import token_digest
from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import BridgeProcess, RawGrpcEdge, hello, serve_process

CHECK_SECONDS = 0.05


async def ws_hello(b: BridgeProcess, device: str, token: str) -> pb.BridgeMessage:
    async with connect(b.ws_url, compression=None) as ws:
        await ws.send(hello(device, "lidar", auth_token=token).SerializeToString())
        return pb.BridgeMessage.FromString(await asyncio.wait_for(ws.recv(), 5))


async def grpc_hello(b: BridgeProcess, device: str, token: str) -> pb.BridgeMessage | None:
    edge = RawGrpcEdge(f"127.0.0.1:{b.grpc}")
    try:
        await edge.send(hello(device, "lidar", auth_token=token).SerializeToString())
        return await edge.recv()
    finally:
        await edge.close()


async def test_a_token_file_overwritten_with_invalid_utf8_keeps_the_last_good(
    tmp_path: Path,
) -> None:
    tokens = tmp_path / "devices"
    tokens.write_text(f"robot-1 {token_digest('r1-secret')}\n")
    async with serve_process(
        f"--device-tokens-file={tokens}", f"--device-tokens-check-seconds={CHECK_SECONDS}"
    ) as b:
        assert (await ws_hello(b, "robot-1", "r1-secret")).WhichOneof("kind") == "welcome"
        # 400k lines (3.6 MB, under the size bound), the first one not UTF-8
        tokens.write_bytes(b"robot-2 sha256:\xff\n" + b"# filler\n" * 400_000)
        for _ in range(10):  # each Hello after a check interval: the file is looked at each time
            await asyncio.sleep(2 * CHECK_SECONDS)
            reply = await ws_hello(b, "robot-1", "r1-secret")
            assert reply.WhichOneof("kind") == "welcome", reply
            reply = await grpc_hello(b, "robot-1", "r1-secret")
            assert reply is not None and reply.WhichOneof("kind") == "welcome", reply
        # the last good entries still refuse what they refused before
        assert (await ws_hello(b, "robot-1", "wrong")).error.code == pb.UNAUTHENTICATED
        logs = b.logs()
        # read once: one error for this version of the file, however many Hellos looked
        assert logs.count("not UTF-8 text") == 1, logs[-2000:]
        assert "Traceback" not in logs, logs[-2000:]
