"""What a connection does to a message before the core sees a frame: chunks and codecs.

Why a module of its own: the ingest connection stays one loop of "receive, admit"; this adapter
turns ``FrameChunk`` pieces into whole frames (:mod:`bridge.chunks`) and encoded clouds into raw
records (:mod:`bridge.compress`), so the core, the rings and decimation never learn either
exists. Sans-I/O: messages, charges and times in; frames, charges and refusals out.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from bridge import codec, compress
from bridge.chunks import Reassembler, check_frame
from bridge.errors import ProtocolError
from bridge.governor import Charge
from bridge.v1 import bridge_pb2 as pb

#: Encoded clouds at least this large are decoded in a worker thread (~1 ms of CPU and more):
#: the event loop keeps serving other streams meanwhile. Smaller ones are decoded inline.
OFFLOAD_BYTES = 64 * 1024


@dataclass(slots=True)
class Ready:
    """A whole frame for the core (``None`` while pieces are missing), its size in bytes as the
    ring holds it (decoded), the charge for those bytes, and refusals to report."""

    frame: pb.Frame | None = None
    size: int = 0
    charge: Charge | None = None
    errors: list[ProtocolError] = field(default_factory=list)
    points: memoryview | None = None  # a large cloud's points, still in the wire bytes
    #: The cloud is still encoded: large enough to be decoded off the event loop
    #: (:meth:`Uplink.decode_data` in a thread, then :meth:`Uplink.settle`); ``size`` is the
    #: encoded size until then.
    encoded: bool = False


class Uplink:
    """Per connection: the codecs its Hello declared and its incomplete chunked frames."""

    def __init__(self, hello: pb.Hello, streams: Container[str], limits: codec.Limits) -> None:
        self.codecs = {
            s.stream_id: spec
            for s in hello.streams
            if (spec := compress.spec_of(s)).codec != compress.NONE
        }
        self.limits = limits
        self.chunks = Reassembler(streams, limits.max_frame_bytes)

    @staticmethod
    def check_hello(hello: pb.Hello) -> None:
        """Refuse a Hello that declares a codec this bridge cannot decode (``CodecError``)."""
        for spec in hello.streams:
            compress.spec_of(spec)

    def take(self, msg: pb.EdgeMessage, size: int, charge: Charge, now: float) -> Ready:
        """One parsed message and its charge (taken over: released here or handed on)."""
        ready = Ready()
        if msg.WhichOneof("kind") == "chunk":
            fed = self.chunks.feed(msg.chunk, charge, now)
            ready.errors = fed.errors
            if fed.data is None or fed.charge is None or fed.header is None:
                return ready
            charge = fed.charge
            try:
                whole = codec.decode_edge(fed.data, self.limits)
                size = len(fed.data)
                del fed
                check_frame(whole.frame, msg.chunk.stream_id, msg.chunk.seq)
            except ProtocolError as exc:
                charge.release()
                if exc.frame is None:
                    exc.frame = pb.Frame(stream_id=msg.chunk.stream_id, seq=msg.chunk.seq)
                ready.errors.append(exc)
                return ready
            frame = whole.frame
        else:
            frame = msg.frame
            abandoned = self.chunks.frame_arrived(frame.stream_id)
            if abandoned is not None:
                ready.errors.append(abandoned)
        return self._decoded(ready, frame, size, charge)

    def take_split(
        self, frame: pb.Frame, points: memoryview | None, size: int, charge: Charge
    ) -> Ready:
        """A whole large cloud whose points were left in the wire bytes (``codec.split_cloud_
        frame``): they stay there unless the stream's codec must decode them."""
        ready = Ready()
        abandoned = self.chunks.frame_arrived(frame.stream_id)
        if abandoned is not None:
            ready.errors.append(abandoned)
        if frame.stream_id in self.codecs and points is not None:
            frame.point_cloud.data = bytes(points)  # the encoded bytes: a fraction of the cloud
            points = None
        return self._decoded(ready, frame, size, charge, points)

    def _decoded(
        self,
        ready: Ready,
        frame: pb.Frame,
        size: int,
        charge: Charge,
        points: memoryview | None = None,
    ) -> Ready:
        """``ready`` with ``frame`` decoded by its stream's codec, or with the refusal (and
        ``charge`` released); a large encoded cloud is left for the caller to decode."""
        if self.offload(frame):
            ready.frame, ready.size, ready.charge, ready.encoded = frame, size, charge, True
            return ready
        try:
            size = self.decode(frame, size, charge)
        except ProtocolError as exc:
            charge.release()
            ready.errors.append(exc)
            return ready
        ready.frame, ready.size, ready.charge, ready.points = frame, size, charge, points
        return ready

    def offload(self, frame: pb.Frame) -> bool:
        """Whether ``frame`` holds an encoded cloud worth decoding off the event loop."""
        return (
            frame.stream_id in self.codecs
            and frame.WhichOneof("payload") == "point_cloud"
            and len(frame.point_cloud.data) >= OFFLOAD_BYTES
        )

    def decode(self, frame: pb.Frame, size: int, charge: Charge) -> int:
        """Decode ``frame``'s cloud in place when its stream has a codec; return the bytes it
        now holds, which ``charge`` is resized to. A refusal (``ProtocolError`` naming the
        frame) leaves ``charge`` to the caller."""
        return self.settle(size, *self.decode_data(frame), charge)

    def decode_data(self, frame: pb.Frame) -> tuple[int, int]:
        """Decode ``frame``'s cloud in place; (encoded, decoded) bytes of its data. Touches
        nothing but ``frame``: safe in a worker thread (zstd and numpy release the GIL)."""
        spec = self.codecs.get(frame.stream_id)
        if spec is None or frame.WhichOneof("payload") != "point_cloud":
            return 0, 0
        try:
            return compress.decode_cloud(
                frame.point_cloud, spec, self.limits.max_points, self.limits.max_frame_bytes
            )
        except ProtocolError as exc:
            exc.frame = pb.Frame(stream_id=frame.stream_id, seq=frame.seq)
            raise

    @staticmethod
    def settle(size: int, encoded: int, decoded: int, charge: Charge) -> int:
        """The frame's size once decoded; ``charge`` grows to it (by one decoded frame, at most
        ``max_frame_bytes``, per connection at a time, like decimation's own)."""
        size = size - encoded + decoded
        charge.resize(max(charge.nbytes, size))
        return size

    def close(self) -> None:
        self.chunks.close()
