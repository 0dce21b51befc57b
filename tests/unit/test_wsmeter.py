"""FrameMeter against websockets' own frame serializer: whatever the frame sizes, masking and
read boundaries, it announces each data frame's payload exactly once and skips control frames."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from bridge.server.wsmeter import FrameMeter, Unread

OP_BINARY, OP_TEXT, OP_CONT = Opcode.BINARY, Opcode.TEXT, Opcode.CONT
OP_PING, OP_PONG = Opcode.PING, Opcode.PONG

DATA_OPS = (OP_BINARY, OP_TEXT, OP_CONT)


def wire(frames: list[Frame], mask: bool) -> bytes:
    return b"".join(f.serialize(mask=mask, extensions=[]) for f in frames)


frame_st = st.one_of(
    st.builds(
        lambda op, n: Frame(op, b"\x00" * n),
        st.sampled_from(DATA_OPS),
        st.sampled_from([0, 1, 125, 126, 127, 65535, 65536, 70_000]),
    ),
    st.builds(
        lambda op, n: Frame(op, b"p" * n), st.sampled_from([OP_PING, OP_PONG]), st.integers(0, 125)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(frame_st, max_size=8), mask=st.booleans(), cuts=st.lists(st.integers(1, 9000))
)
def test_announces_each_data_payload_once_across_any_read_boundaries(
    frames: list[Frame], mask: bool, cuts: list[int]
) -> None:
    data = wire(frames, mask)
    meter = FrameMeter()
    announced, pos = 0, 0
    for cut in [*cuts, len(data)]:
        chunk = data[pos : pos + cut]
        pos += len(chunk)
        while chunk:  # the adapter feeds the rest of a read after each announcement
            used, owed = meter.feed(chunk)
            assert used > 0
            announced += owed
            chunk = chunk[used:]
        if pos >= len(data):
            break
    data_frames = [f for f in frames if f.opcode in DATA_OPS and f.data]
    assert announced == sum(len(f.data) for f in data_frames) == meter.metered_bytes
    assert meter.frames == len(data_frames)


def test_the_payload_is_announced_when_the_header_arrives_before_any_payload() -> None:
    data = wire([Frame(OP_BINARY, b"\x01" * 16_000_000)], mask=True)
    meter = FrameMeter()
    assert meter.feed(data[:5]) == (5, 0)  # 2 + 8-byte length: not yet complete
    # the header completes (with the mask): announced, and nothing after it is consumed
    assert meter.feed(data[5:100]) == (9, 16_000_000)
    assert meter.feed(data[14:]) == (len(data) - 14, 0)


def test_feeding_stops_right_after_each_announcing_header() -> None:
    a = wire([Frame(OP_BINARY, b"a" * 300)], mask=True)
    b = wire([Frame(OP_PING, b"p"), Frame(OP_BINARY, b"b" * 70_000)], mask=True)
    meter = FrameMeter()
    assert meter.feed(a + b) == (8, 300)  # 2 + 2-byte length + 4-byte mask
    rest = (a + b)[8:]
    used, owed = meter.feed(rest)
    assert owed == 70_000 and used == 300 + len(b) - 70_000


def test_an_announcing_header_says_where_it_began_its_first_byte_and_mask() -> None:
    """What the adapter needs to take a whole small message itself (``_direct``)."""
    ping, data = wire([Frame(OP_PING, b"p")], mask=True), wire([Frame(OP_BINARY, b"d" * 300)], True)
    meter = FrameMeter()
    used, owed = meter.feed(ping + data)
    assert (owed, meter.head_at, meter.first_byte) == (300, len(ping), 0x82)
    assert meter.mask == data[4:8] and used == len(ping) + 8
    meter.skip_payload(300)  # taken by the caller: the next header starts right away
    split = wire([Frame(OP_BINARY, b"e" * 10, fin=False)], mask=False)
    assert meter.feed(split[:1]) == (1, 0)
    assert meter.feed(split[1:]) == (1, 10)
    assert (meter.head_at, meter.first_byte, meter.mask) == (-1, 0x02, b"")  # began earlier


def test_unread_bytes_are_taken_from_the_front_without_copying_the_rest() -> None:
    unread = Unread()
    read = bytes(range(200)) * 10
    unread.add(read)
    assert unread.take(5) == read[:5] and len(unread) == len(read) - 5
    unread.skip(10)
    assert bytes(unread.view()) == read[15:]
    unread.add(b"next read")  # the rest of the first read once, then the new one
    assert bytes(unread.view()) == read[15:] + b"next read"
    rest = unread.take(len(unread))
    assert rest == read[15:] + b"next read" and not unread
    whole = b"x" * 1000
    unread.add(whole)
    assert unread.take(1000) is whole  # a read passed on whole is not copied
    unread.add(b"abc")
    unread.skip(99)  # past the end: nothing left, and nothing kept alive
    assert len(unread) == 0 and bytes(unread.view()) == b""
