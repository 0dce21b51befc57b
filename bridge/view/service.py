"""``ViewService``: owns the Push server, the MCAP record and the viewers; starts and stops them
in order (record recovered before the first Push stream; Push stopped before the record closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from bridge.view.convert import FrameIds
from bridge.view.fanout import Fanout
from bridge.view.ledger import Ledger
from bridge.view.servicer import PushSink, grpc_server, server_credentials
from bridge.view.stats import ViewStats

log = logging.getLogger("bridge.view")


@dataclass(frozen=True)
class ViewSettings:
    listen: str = "127.0.0.1:50051"
    # TLS for the Push server (PEM files); a client CA requires the bridge's certificate (mTLS)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # MCAP record
    mcap_dir: str = ""
    mcap_max_bytes: int = 512 * 1024 * 1024
    mcap_max_seconds: float = 600.0
    mcap_compression: str = "none"
    fsync: bool = True
    # Foxglove WebSocket server (None = off)
    foxglove_host: str = "127.0.0.1"
    foxglove_port: int | None = 8765
    frame_ids: tuple[str, ...] = field(default_factory=tuple)
    default_frame_id: str = "world"
    # Browser page (None = off)
    web_host: str = "127.0.0.1"
    web_port: int | None = None
    web_max_points: int = 200_000
    # Limits
    max_message_bytes: int = 64 * 1024 * 1024
    ack_batch_frames: int = 64
    viewer_queue_frames: int = 256
    # Kept for a Foxglove channel's first subscriber (bridge/view/foxglove_hold.py)
    foxglove_hold_messages: int = 64
    foxglove_hold_bytes: int = 64 * 1024 * 1024


@dataclass
class Ports:
    grpc: int = 0
    foxglove: int = 0
    web: int = 0


class ViewService:
    def __init__(self, settings: ViewSettings) -> None:
        self.settings = settings
        self.stats = ViewStats()
        self.fanout = Fanout()
        self.ports = Ports()
        self.recorder: Any = None
        self.foxglove: Any = None
        self.web: Any = None
        self.sink: PushSink | None = None
        self._server: Any = None
        self._roller: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._started = time.monotonic()

    async def start(self) -> Ports:
        s = self.settings
        frame_ids = FrameIds(s.frame_ids, s.default_frame_id)  # bad specs fail before binding
        marks: list[tuple[str, str, int]] = []
        if s.mcap_dir:
            from bridge.view.mcap_out import McapRecorder

            self.recorder = McapRecorder(
                s.mcap_dir,
                max_bytes=s.mcap_max_bytes,
                max_seconds=s.mcap_max_seconds,
                compression=s.mcap_compression,
                fsync=s.fsync,
            )
            marks = await asyncio.to_thread(self.recorder.recover)
            log.info("MCAP %s: resuming with %d stream watermarks", s.mcap_dir, len(marks))
        self.sink = PushSink(
            ledger=Ledger(marks),
            fanout=self.fanout,
            stats=self.stats,
            frame_ids=frame_ids,
            recorder=self.recorder,
            ack_batch_frames=s.ack_batch_frames,
        )
        if s.foxglove_port is not None:
            from bridge.view.foxglove_out import FoxgloveOutlet

            self.foxglove = FoxgloveOutlet(
                self.stats,
                host=s.foxglove_host,
                port=s.foxglove_port,
                queue_frames=s.viewer_queue_frames,
                hold_messages=s.foxglove_hold_messages,
                hold_bytes=s.foxglove_hold_bytes,
            )
            self.ports.foxglove = self.foxglove.start()
            self.fanout.add(self.foxglove)
        if s.web_port is not None:
            from bridge.view.web import WebOutlet

            self.web = WebOutlet(
                self.stats,
                self.status,
                host=s.web_host,
                port=s.web_port,
                max_points=s.web_max_points,
            )
            self.ports.web = await self.web.start()
            self.fanout.add(self.web)
        creds = server_credentials(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
        self._server, self.ports.grpc = grpc_server(
            self.sink, s.listen, max_message_bytes=s.max_message_bytes, credentials=creds
        )
        await self._server.start()
        if self.recorder is not None:
            self._roller = asyncio.create_task(self._roll(), name="view-mcap-roll")
        return self.ports

    async def _roll(self) -> None:
        """Rotate the MCAP file on age even when no frame comes (a quiet file gets finished)."""
        assert self.sink is not None
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
                return
            try:
                await self.sink.roll_if_due()
            except Exception:  # a full disk, say: the next write reports it to the bridge
                log.exception("finishing the MCAP file failed")

    async def stop(self, grace: float = 2.0) -> None:
        """Stop taking frames, then close the record (finished file + watermarks), then viewers."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._roller is not None:  # let a roll in progress finish: it writes the file
            self._stopping.set()
            await self._roller
            self._roller = None
        if self.recorder is not None and self.sink is not None:
            await asyncio.to_thread(self.recorder.close, self.sink.ledger.snapshot())
        if self.foxglove is not None:
            await self.foxglove.stop()
        if self.web is not None:
            await self.web.stop()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "uptime_s": round(now - self._started, 1),
            "bridge": self.sink.status() if self.sink is not None else {},
            "streams": self.stats.snapshot(now),
            "mcap": self.recorder.status() if self.recorder is not None else None,
            "foxglove": self.foxglove.status() if self.foxglove is not None else None,
            "web": self.web.status() if self.web is not None else None,
        }
