"""docs/protocol.md's byte-level examples are exactly what the encoder produces."""

from __future__ import annotations

import re

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
