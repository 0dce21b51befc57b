"""Generated protobuf code must match proto/ (run `make proto` after editing a .proto)."""

from __future__ import annotations

import pytest

from bridge import protogen


def test_generated_code_is_fresh() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    assert protogen.stale_files() == [], "generated code is stale: run `make proto`"


def test_staleness_is_detected(tmp_path: object) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) generates the code")
    from pathlib import Path

    target = Path(str(tmp_path))
    (target / "bridge" / "v1").mkdir(parents=True)
    protogen.generate(target)
    pb2 = target / "bridge" / "v1" / "bridge_pb2.py"
    pb2.write_text(pb2.read_text() + "\n# edited by hand\n")
    assert protogen.stale_files(target) == ["bridge_pb2.py"]
