"""Resuming a stale session (issue 32): the Hello's delivered_seq wins over what the session last
saw, because another replica may have delivered frames since."""

from __future__ import annotations

from bridge.server.ports import Offer
from bridge.v1 import bridge_pb2 as pb
from tests.unit.test_core import attach, cloud_frame, hello, make_core


def resume(seq: int) -> list[pb.ResumeState]:
    return [pb.ResumeState(stream_id="lidar", delivered_seq=seq)]


def test_a_stale_session_resumes_at_the_hellos_delivered_seq_without_a_gap() -> None:
    core, _ = make_core()
    s, _ = attach(core, hello(), "on-a")
    for seq in (1, 2, 3):
        assert core.offer(s, cloud_frame("lidar", seq), 100, 0) is Offer.ACCEPTED
    core.detach(s, "on-a", 0.0)
    # The device went to another replica, which delivered up to 40; back here with its token.
    back, welcome = attach(core, hello(resume_token="other-replica", resume=resume(40)), "c")
    assert back is s and welcome.resumed
    state = welcome.streams[0]
    assert (state.accepted_seq, state.delivered_seq) == (40, 40)
    assert len(s.streams["lidar"].ring) == 0  # 1..3 were delivered elsewhere: not sent again
    assert core.offer(s, cloud_frame("lidar", 40), 100, 0) is Offer.DUPLICATE
    assert core.offer(s, cloud_frame("lidar", 41), 100, 0) is Offer.ACCEPTED
    assert s.streams["lidar"].upstream_gap_frames == 0
    assert list(s.streams["lidar"].ring)[-1].gap is None


def test_held_frames_above_the_hellos_delivered_seq_stay() -> None:
    core, _ = make_core()
    s, _ = attach(core, hello(), "c1")
    for seq in range(1, 6):
        core.offer(s, cloud_frame("lidar", seq), 100, 0)
    core.detach(s, "c1", 0.0)
    _, welcome = attach(core, hello(resume_token=s.session_id, resume=resume(2)), "c2")
    assert (welcome.streams[0].accepted_seq, welcome.streams[0].delivered_seq) == (5, 2)
    assert [e.seq for e in s.streams["lidar"].ring] == [3, 4, 5]


def test_a_hello_behind_the_session_changes_nothing() -> None:
    """The edge missed the last acks: the session knows better, resends are duplicates."""
    core, _ = make_core()
    s, _ = attach(core, hello(), "c1")
    for seq in (1, 2, 3):
        core.offer(s, cloud_frame("lidar", seq), 100, 0)
    core.sink_watermarks([(("dev", "lidar"), 2)])
    core.detach(s, "c1", 0.0)
    _, welcome = attach(core, hello(resume_token=s.session_id, resume=resume(1)), "c2")
    assert (welcome.streams[0].accepted_seq, welcome.streams[0].delivered_seq) == (3, 2)
    assert core.offer(s, cloud_frame("lidar", 2), 100, 0) is Offer.DUPLICATE
