"""docs/protocol.md's byte-level examples are exactly what the encoder produces."""

from __future__ import annotations

import re

from bridge.config.settings import Settings
from bridge.protocol.errors import WIRE, HelloTimeout, SessionTaken
from bridge.v1 import bridge_pb2 as pb
from tests.integration.harness import ROOT
from tests.unit.protocol_examples import examples, rendered

DOC = ROOT / "docs" / "protocol.md"
BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```text\n(.*?)\n```", re.S)


def test_every_example_in_the_document_matches_the_encoder() -> None:
    found = dict(BLOCK.findall(DOC.read_text()))
    assert set(found) == set(examples())
    for name, text in rendered().items():
        assert found[name] == text, f"docs/protocol.md example {name!r} is stale"


def test_the_hex_column_is_the_serialized_message() -> None:
    """The annotated bytes, read back from the document, decode to the same message."""
    found = dict(BLOCK.findall(DOC.read_text()))
    for name, (msg, grpc) in examples().items():
        raw = bytes.fromhex(" ".join(line[:30] for line in found[name].splitlines()))
        if grpc:
            assert raw[0] == 0 and int.from_bytes(raw[1:5], "big") == len(raw) - 5
            raw = raw[5:]
        assert raw == msg.SerializeToString()
        assert type(msg).FromString(raw) == msg, name


def _section(number: str) -> str:
    """The text of ``## number.`` up to the next ``## `` heading."""
    text = DOC.read_text()
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _error_rows() -> list[list[str]]:
    rows = [line for line in _section("8").splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_every_refusal_reason_has_its_row_in_section_8() -> None:
    """Each WIRE reason (the metric label) has a row saying the code, fatality, close code and
    gRPC status the bridge really uses: a client can tell every refusal from the table."""
    rows = {row[5].strip("`"): row for row in _error_rows() if len(row) == 6 and row[5]}
    missing = sorted(set(WIRE) - set(rows))
    assert not missing, f"docs/protocol.md §8 has no row for reasons {missing}"
    for reason, wire in WIRE.items():
        code, _cause, fatal, ws, status, _ = rows[reason]
        assert code == f"`{pb.ErrorCode.Name(wire.code)}`", reason
        assert fatal == ("yes" if wire.fatal else "no"), reason
        if wire.fatal:
            assert str(wire.ws_close) in ws, reason
            assert f"`{wire.grpc_status}`" in status, reason


def test_the_hello_deadline_and_its_outcome_are_in_section_2() -> None:
    hello = _section("2")
    wire = WIRE[HelloTimeout.reason]
    assert "`hello_timeout_seconds`" in hello
    assert f"{Settings().hello_timeout_seconds:g} s" in hello
    assert f"close {wire.ws_close}" in hello and f"`{wire.grpc_status}`" in hello


def test_section_6_says_who_may_take_over_a_live_session() -> None:
    resume = _section("6")
    assert f"metrics reason `{SessionTaken.reason}`" in resume
    assert "resume_token" in resume and " wins" not in resume


def test_section_11_tells_a_viewer_its_token_filter_and_message_size() -> None:
    subscribe = _section("11")
    assert "authorization: Bearer" in subscribe and "`viewer_token`" in subscribe
    assert "viewer bearer token required" in subscribe  # the bridge's own words
    for field in pb.SubscribeRequest.DESCRIPTOR.fields:
        assert f"`{field.name}`" in subscribe, field.name
    assert "max_frame_bytes" in subscribe and "64 KiB" in subscribe
    assert "across every device" in subscribe


def test_section_4_defines_the_voxel_key() -> None:
    layout = _section("4")
    assert "floor(x / v)" in layout and "anchored at the origin" in layout
    assert "half-open" in layout and "FLOAT32" in layout
