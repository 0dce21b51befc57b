"""The MCAP record: rotating files, durable before the bridge gets an ack, resumable.

Why the record comes before the ack: the sink is the source of truth for delivery, so a frame
the bridge was told is delivered must be on disk. Each batch is written as one chunk, flushed
and fsynced (:meth:`McapRecorder.write`); only then does the servicer acknowledge it.

Files: ``simbridge-<UTC time>-<n>.mcap`` in the directory, a new one when the current one passes
``max_bytes`` or ``max_seconds`` (checked on every write and by :meth:`McapRecorder.roll_if_due`,
which the view calls every second, so a file whose streams went quiet is still finished on time).

Live reading: after every batch the file being written ends with a provisional tail, a ``DataEnd``
and a ``Footer`` with ``summary_start = 0`` (the MCAP spec's "no summary section") and the magic,
which the next batch overwrites. So between batches the live file is a complete, if unindexed,
MCAP: ``mcap.reader.make_reader`` (the seeking reader) finds the footer, sees no summary and reads
the messages linearly, and so does any reader that accepts unindexed files. Every finished file
(rotated, or closed when the view stops) has the full summary and indexes. A reader that opens
the live file in the instant a batch is being written may find a torn end: open it again.

A finished file ends with a ``simbridge.watermarks`` metadata record (what the view held when it
closed). On start, :meth:`McapRecorder.recover` reads those back; a file left unfinished by a crash
(no footer, or only the provisional one) is repaired (its complete records rewritten into a
finished file) and its ``/simbridge/frames`` records scanned, so a restarted view tells the
bridge exactly what it holds and nothing is recorded twice.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from mcap.data_stream import RecordBuilder
from mcap.reader import make_reader
from mcap.records import Channel, DataEnd, Footer, Message, Schema
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType, Writer

from bridge.view.convert import FRAME, FRAMES_TOPIC, SCHEMAS, OutMessage

log = logging.getLogger("bridge.view.mcap")

WATERMARKS = "simbridge.watermarks"
_MAGIC = b"\x89MCAP0\r\n"
_NAME = re.compile(r"^simbridge-\d{8}T\d{6}Z-(\d+)\.mcap$")
COMPRESSIONS = {
    "none": CompressionType.NONE,
    "zstd": CompressionType.ZSTD,
    "lz4": CompressionType.LZ4,
}

Watermarks = list[tuple[str, str, int]]


def _live_tail() -> bytes:
    """DataEnd (no CRC) + Footer without a summary + magic: ends a live file between batches."""
    b = RecordBuilder()
    DataEnd(0).write(b)
    Footer(0, 0, 0).write(b)
    return bytes(b.end()) + _MAGIC  # type: ignore[no-untyped-call]


_TAIL = _live_tail()
_FOOTER_SIZE = 1 + 8 + 8 + 8 + 4  # opcode, length, summary_start, summary_offset_start, crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode_marks(marks: Iterable[tuple[str, str, int]]) -> dict[str, str]:
    return {"watermarks": json.dumps([[d, s, w] for d, s, w in marks])}


def _merge(into: dict[tuple[str, str], int], marks: Iterable[tuple[str, str, int]]) -> None:
    for d, s, w in marks:
        into[(d, s)] = max(w, into.get((d, s), 0))


class _File:
    """One open MCAP file with its schema and channel ids."""

    def __init__(self, path: Path, compression: CompressionType) -> None:
        self.path = path
        self.stream: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed by finish()
        self.writer = Writer(self.stream, compression=compression)
        self.writer.start(profile="", library="simbridge-view")
        self.schemas: dict[str, int] = {}
        self.channels: dict[str, int] = {}
        self.opened = time.monotonic()
        self.messages = 0

    def channel(self, msg: OutMessage) -> int:
        cid = self.channels.get(msg.topic)
        if cid is None:
            sid = self.schemas.get(msg.kind)
            if sid is None:
                s = SCHEMAS[msg.kind]
                sid = self.schemas[msg.kind] = self.writer.register_schema(
                    s.name, s.encoding, s.data
                )
            meta = {} if msg.kind == FRAME else {"device": msg.device, "stream": msg.stream}
            cid = self.channels[msg.topic] = self.writer.register_channel(
                msg.topic, SCHEMAS[msg.kind].message_encoding, sid, meta
            )
        return cid

    def end_batch(self, fsync: bool) -> None:
        """Write the batch, then the provisional tail (readable as is), and stand before it."""
        self.writer.flush()  # type: ignore[no-untyped-call]
        end = self.stream.tell()
        self.stream.write(_TAIL)
        self.stream.flush()
        if fsync:
            os.fsync(self.stream.fileno())
        self.stream.seek(end)

    def finish(self, marks: Watermarks, fsync: bool) -> None:
        self.writer.add_metadata(WATERMARKS, _encode_marks(marks))
        self.writer.finish()  # type: ignore[no-untyped-call]
        self.stream.truncate()  # in case the summary is shorter than a provisional tail
        self.stream.flush()
        if fsync:
            os.fsync(self.stream.fileno())
        self.stream.close()


class McapRecorder:
    """Writes deliveries to rotating MCAP files in ``directory`` (blocking: call from a thread)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 512 * 1024 * 1024,
        max_seconds: float = 600.0,
        compression: str = "none",
        fsync: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_bytes < 1 or max_seconds <= 0:
            raise ValueError("MCAP rotation limits must be > 0")
        if compression not in COMPRESSIONS:
            raise ValueError(f"MCAP compression must be one of {sorted(COMPRESSIONS)}")
        module = {"zstd": "zstandard", "lz4": "lz4"}.get(compression)
        if module is not None and importlib.util.find_spec(module) is None:
            raise ValueError(f"MCAP compression {compression} needs `pip install {module}`")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.compression = COMPRESSIONS[compression]
        self.fsync = fsync
        self._clock = clock
        self._file: _File | None = None
        self._counter = 0
        self.files_written = 0
        self.messages_written = 0
        self.repaired: list[str] = []

    @property
    def current(self) -> str:
        return str(self._file.path) if self._file is not None else ""

    def files(self) -> list[Path]:
        found = [p for p in self.directory.glob("simbridge-*.mcap") if _NAME.match(p.name)]
        return sorted(found, key=lambda p: (int(_NAME.match(p.name).group(1)), p.name))  # type: ignore[union-attr]

    # -- resume ---------------------------------------------------------------------------

    def recover(self) -> Watermarks:
        """Watermarks held by the files already in the directory (repairing a crashed one)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        marks: dict[tuple[str, str], int] = {}
        for path in self.files():
            self._counter = max(self._counter, int(_NAME.match(path.name).group(1)))  # type: ignore[union-attr]
            if _finished(path):
                _merge(marks, _file_marks(path))
            else:
                _merge(marks, self._repair(path))
        return [(d, s, w) for (d, s), w in sorted(marks.items())]

    def _repair(self, path: Path) -> Watermarks:
        """Rewrite the complete records of an unfinished file into a finished one."""
        tmp = path.with_suffix(".repair")
        schemas: dict[int, Schema] = {}
        channels: dict[int, Channel] = {}
        out_ids: dict[int, int] = {}
        out_schemas: dict[int, int] = {}
        marks: dict[tuple[str, str], int] = {}
        count = 0
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            writer = Writer(dst, compression=self.compression)
            writer.start(profile="", library="simbridge-view")
            try:
                for rec in StreamReader(src, skip_magic=False).records:
                    if isinstance(rec, Schema):
                        schemas[rec.id] = rec
                    elif isinstance(rec, Channel):
                        channels[rec.id] = rec
                    elif isinstance(rec, Message) and rec.channel_id in channels:
                        ch = channels[rec.channel_id]
                        if ch.id not in out_ids:
                            sch = schemas[ch.schema_id]
                            if sch.id not in out_schemas:
                                out_schemas[sch.id] = writer.register_schema(
                                    sch.name, sch.encoding, sch.data
                                )
                            out_ids[ch.id] = writer.register_channel(
                                ch.topic, ch.message_encoding, out_schemas[sch.id], ch.metadata
                            )
                        writer.add_message(
                            out_ids[ch.id], rec.log_time, rec.data, rec.publish_time, rec.sequence
                        )
                        count += 1
                        if ch.topic == FRAMES_TOPIC:
                            _merge(marks, [_frame_mark(rec.data)])
            except Exception as exc:  # the reader raises several types for a torn tail
                # The tail of a crashed file is an incomplete record: everything before it was
                # flushed (and acknowledged); the tail never was.
                log.info("%s: stopped at an incomplete record (%s)", path.name, type(exc).__name__)
            writer.add_metadata(
                WATERMARKS, _encode_marks(sorted((d, s, w) for (d, s), w in marks.items()))
            )
            writer.finish()  # type: ignore[no-untyped-call]
            dst.flush()
            if self.fsync:
                os.fsync(dst.fileno())
        os.replace(tmp, path)
        if self.fsync:
            _fsync_dir(self.directory)
        self.repaired.append(path.name)
        log.warning("repaired unfinished MCAP %s (%d messages kept)", path.name, count)
        return [(d, s, w) for (d, s), w in marks.items()]

    # -- writing --------------------------------------------------------------------------

    def write(self, messages: list[OutMessage], marks: Callable[[], Watermarks]) -> None:
        """Append one batch as one chunk, flush and (by default) fsync. ``marks`` gives the
        watermarks held so far, recorded when a file is finished by rotation."""
        if not messages:
            return
        self.roll_if_due(marks)
        f = self._file
        if f is None:
            f = self._open()
        for msg in messages:
            f.writer.add_message(f.channel(msg), msg.log_time, msg.data, msg.publish_time)
        f.end_batch(self.fsync)
        f.messages += len(messages)
        self.messages_written += len(messages)

    def roll_if_due(self, marks: Callable[[], Watermarks]) -> bool:
        """Finish the current file if it passed ``max_bytes`` or ``max_seconds``."""
        f = self._file
        if f is None or (
            f.stream.tell() < self.max_bytes and time.monotonic() - f.opened < self.max_seconds
        ):
            return False
        self._finish(marks())
        return True

    def _open(self) -> _File:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._counter += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        f = self._file = _File(
            self.directory / f"simbridge-{stamp}-{self._counter:04d}.mcap", self.compression
        )
        if self.fsync:
            _fsync_dir(self.directory)
        self.files_written += 1
        log.info("recording to %s", f.path)
        return f

    def _finish(self, marks: Watermarks) -> None:
        if self._file is not None:
            self._file.finish(marks, self.fsync)
            self._file = None

    def close(self, marks: Watermarks) -> None:
        """Finish the current file (summary, indexes, watermarks): it opens fast everywhere."""
        self._finish(marks)

    def status(self) -> dict[str, Any]:
        f = self._file
        return {
            "directory": str(self.directory),
            "current": self.current,
            "current_bytes": f.stream.tell() if f is not None else 0,
            "files_written": self.files_written,
            "messages_written": self.messages_written,
            "repaired": list(self.repaired),
        }


def _finished(path: Path) -> bool:
    """Ends with a footer that points at a summary (a live file's provisional tail does not)."""
    size = path.stat().st_size
    if size < 2 * len(_MAGIC) + _FOOTER_SIZE:
        return False
    with open(path, "rb") as f:
        f.seek(size - len(_MAGIC) - _FOOTER_SIZE)
        footer = f.read()
    if footer[-len(_MAGIC) :] != _MAGIC or footer[0] != 0x02:
        return False
    summary_start = int.from_bytes(footer[9:17], "little")
    return summary_start != 0


def _frame_mark(data: bytes) -> tuple[str, str, int]:
    body = json.loads(data)
    return (str(body["device"]), str(body["stream"]), int(body["seq"]))


def _file_marks(path: Path) -> Watermarks:
    """Watermarks of a finished file: its metadata record, else a scan of its frame records."""
    with open(path, "rb") as f:
        reader = make_reader(f)
        for meta in reader.iter_metadata():
            if meta.name == WATERMARKS:
                return [(d, s, int(w)) for d, s, w in json.loads(meta.metadata["watermarks"])]
        marks: dict[tuple[str, str], int] = {}
        for _schema, _channel, message in reader.iter_messages(topics=[FRAMES_TOPIC]):
            _merge(marks, [_frame_mark(message.data)])
        return [(d, s, w) for (d, s), w in marks.items()]
