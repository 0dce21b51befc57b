"""The view's sans-I/O parts: ledger, Foxglove conversion, browser frames, dropping queues, MCAP
rotation and crash repair (on a temp directory)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mcap.reader import make_reader

from bridge.v1 import bridge_pb2 as pb
from bridge.view import convert, webframe
from bridge.view.fanout import DroppingQueue
from bridge.view.ledger import Ledger
from bridge.view.mcap_out import WATERMARKS, McapRecorder


def _frame(seq: int, *, device: str = "d", stream: str = "s", bridge_seq: int = 0,
           n: int = 4, rgb: bool = False) -> pb.ProcessedFrame:  # fmt: skip
    rec = np.zeros(n, dtype=[("xyz", "<f4", 3), ("extra", "<u4")])
    rec["xyz"] = np.arange(n * 3, dtype="<f4").reshape(n, 3) + seq
    fields = [pb.PackedField(name=a, offset=4 * i, type=pb.FLOAT32) for i, a in enumerate("xyz")]
    if rgb:
        rec["extra"] = 0x00FF8001  # r=255, g=128, b=1
        fields.append(pb.PackedField(name="rgb", offset=12, type=pb.UINT32))
    else:
        rec["extra"] = np.arange(n, dtype="<f4").view("<u4")
        fields.append(pb.PackedField(name="intensity", offset=12, type=pb.FLOAT32))
    return pb.ProcessedFrame(
        device_id=device,
        stream_id=stream,
        seq=seq,
        bridge_seq=bridge_seq or seq,
        capture_time_ns=1_700_000_000_123_456_789 + seq,
        point_cloud=pb.PointCloud(point_stride=16, fields=fields, data=rec.tobytes()),
    )


def _foxglove_class(schema: convert.Schema) -> type:
    fds = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))


# -- ledger ------------------------------------------------------------------------------------


def test_ledger_filters_duplicates_within_and_across_batches_and_commits_only_on_request() -> None:
    ledger = Ledger([("d", "s", 2)])
    adm = ledger.admit([_frame(2), _frame(3), _frame(3), _frame(4, bridge_seq=9)])
    assert [f.seq for f in adm.new] == [3, 4]
    assert adm.duplicates == 2 and adm.high_bridge_seq == 9
    assert ledger.watermark("d", "s") == 2  # nothing durable yet
    ledger.commit(adm)
    assert ledger.snapshot() == [("d", "s", 4)] and ledger.duplicates == 2
    # a write that failed is never committed: the same frames are admitted again
    adm2 = ledger.admit([_frame(5), _frame(6, stream="t")])
    assert ledger.admit([_frame(5)]).new[0].seq == 5
    ledger.commit(adm2)
    assert ledger.snapshot() == [("d", "s", 5), ("d", "t", 6)]


# -- conversion --------------------------------------------------------------------------------


def test_point_cloud_passes_bytes_and_layout_with_foxglove_type_codes() -> None:
    frame = _frame(7, rgb=True)
    frame.point_cloud.fields.append(pb.PackedField(name="ring", offset=15, type=pb.UINT8))
    frame.point_cloud.fields[3].type = pb.INT16  # any type: only the code mapping matters here
    frame.point_cloud.frame_id = "from_edge"
    frame.gap.CopyFrom(pb.Gap(first_seq=5, last_seq=6, count=2, reason="drop_oldest"))
    ids = convert.FrameIds(["s=lidar_link"], default="world")
    msgs = convert.to_messages(frame, received_ns=1, frame_ids=ids)
    assert [(m.topic, m.kind) for m in msgs] == [("/d/s/gaps", "gap"), ("/d/s", "point_cloud")]
    gap = json.loads(msgs[0].data)
    assert (gap["first_seq"], gap["last_seq"], gap["count"], gap["reason"]) == (
        5,
        6,
        2,
        "drop_oldest",
    )
    cls = _foxglove_class(convert.SCHEMAS["point_cloud"])
    pc = cls.FromString(msgs[1].data)
    assert pc.data == frame.point_cloud.data and pc.point_stride == 16
    assert pc.frame_id == "lidar_link"
    assert pc.timestamp.seconds * 10**9 + pc.timestamp.nanos == frame.capture_time_ns
    assert msgs[1].log_time == frame.capture_time_ns
    # Foxglove: UINT8=1 INT8=2 UINT16=3 INT16=4 UINT32=5 INT32=6 FLOAT32=7 FLOAT64=8
    assert [(f.name, f.offset, f.type) for f in pc.fields] == [
        ("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 4), ("ring", 15, 1)
    ]  # fmt: skip
    assert pc.pose.orientation.w == 1.0  # no pose on the wire: identity


def test_frame_id_precedence_and_bad_spec() -> None:
    ids = convert.FrameIds(["r1/lidar=a", "lidar=b"], default="world")
    assert ids.resolve("r1", "lidar", "own") == "a"
    assert ids.resolve("r2", "lidar", "own") == "b"
    assert ids.resolve("r2", "cam", "own") == "own"
    assert ids.resolve("r2", "cam") == "world"
    with pytest.raises(ValueError, match="STREAM=FRAME_ID"):
        convert.FrameIds(["nope"])


def test_telemetry_is_json_with_values_and_blob() -> None:
    frame = pb.ProcessedFrame(device_id="d", stream_id="imu", seq=3, capture_time_ns=5 * 10**9 + 7)
    frame.telemetry.values["ax"] = 1.5
    frame.telemetry.blob = b"\x00\xff"
    [msg] = convert.to_messages(frame, 0, convert.FrameIds())
    body = json.loads(msg.data)
    assert msg.kind == "telemetry" and msg.topic == "/d/imu"
    assert body == {"timestamp": {"sec": 5, "nsec": 7}, "seq": 3, "values": {"ax": 1.5},
                    "blob_base64": "AP8="}  # fmt: skip


# -- browser frames ----------------------------------------------------------------------------


def test_webframe_round_trip_with_rgb_and_thinning() -> None:
    frame = _frame(1, n=10, rgb=True)
    header, xyz, inten, rgba = webframe.decode(webframe.encode(frame, max_points=4) or b"")
    assert header["total"] == 10 and header["n"] == 4 and inten is None
    full = np.frombuffer(frame.point_cloud.data, dtype="<f4").reshape(10, 4)[:, :3]
    assert np.array_equal(xyz, full[::3])
    assert rgba is not None and rgba.tolist()[0] == [255, 128, 1, 255]


def test_webframe_intensity_and_telemetry() -> None:
    header, _, inten, rgba = webframe.decode(webframe.encode(_frame(1, n=5), 0) or b"")
    assert inten is not None and inten.tolist() == [0, 1, 2, 3, 4] and rgba is None
    assert (header["imin"], header["imax"]) == (0.0, 4.0)
    assert webframe.encode(pb.ProcessedFrame(telemetry=pb.Telemetry()), 10) is None


# -- dropping queue ----------------------------------------------------------------------------


async def test_dropping_queue_drops_oldest_and_counts() -> None:
    dropped: list[int] = []
    q: DroppingQueue[int] = DroppingQueue(2, dropped.append)
    for i in range(5):
        q.put(i)
    assert dropped == [0, 1, 2] and q.dropped == 3
    assert [await q.get(), await q.get()] == [3, 4]
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.put(9)
    assert await asyncio.wait_for(getter, 1) == 9


# -- MCAP --------------------------------------------------------------------------------------


def _write(rec: McapRecorder, frames: list[pb.ProcessedFrame], ledger: Ledger) -> None:
    adm = ledger.admit(frames)
    msgs = []
    for f in adm.new:
        msgs += [*convert.to_messages(f, 1, convert.FrameIds()), convert.frame_record(f, 1)]
    rec.write(msgs, ledger.snapshot)
    ledger.commit(adm)


def _topics(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(path, "rb") as f:
        for _s, ch, _m in make_reader(f).iter_messages():
            counts[ch.topic] = counts.get(ch.topic, 0) + 1
    return counts


def test_mcap_rotates_by_size_and_resumes_from_watermarks(tmp_path: Path) -> None:
    rec = McapRecorder(tmp_path, max_bytes=2000, fsync=False)
    ledger = Ledger(rec.recover())
    for seq in range(1, 7):
        _write(rec, [_frame(seq, n=50)], ledger)
    rec.close(ledger.snapshot())
    files = rec.files()
    assert len(files) >= 3  # each 50-point frame is ~1 KB: the 2 KB limit rotates
    assert sum(_topics(p).get("/d/s", 0) for p in files) == 6
    with open(files[0], "rb") as f:
        meta = {m.name: m.metadata for m in make_reader(f).iter_metadata()}
    assert WATERMARKS in meta
    again = McapRecorder(tmp_path, fsync=False)
    assert again.recover() == [("d", "s", 6)]
    assert again.repaired == []


def test_mcap_crashed_file_is_repaired_up_to_the_last_flushed_batch(tmp_path: Path) -> None:
    rec = McapRecorder(tmp_path, fsync=False)
    ledger = Ledger()
    _write(rec, [_frame(1), _frame(2)], ledger)
    _write(rec, [_frame(3)], ledger)
    path = Path(rec.current)
    assert rec._file is not None
    rec._file.stream.close()  # the process dies: no summary, no footer
    # A crash mid-write: the file has no summary and ends inside a record.
    with open(path, "ab") as f:
        f.write(b"\x06" + (1000).to_bytes(8, "little") + b"torn")
    again = McapRecorder(tmp_path, fsync=False)
    assert again.recover() == [("d", "s", 3)]
    assert again.repaired == [path.name]
    assert _topics(path) == {"/d/s": 3, "/simbridge/frames": 3}  # now a finished, indexed file
