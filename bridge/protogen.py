"""Regenerate the protobuf/gRPC modules in ``bridge/v1`` from ``proto/`` (``make proto``).

The generated files are committed so that a plain ``pip install`` needs no code generator;
``tests/unit/test_protogen.py`` regenerates into a temporary directory and fails when they differ.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED = ("bridge_pb2.py", "bridge_pb2.pyi", "bridge_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) for every .proto under proto/ into ``out_dir``."""
    from grpc_tools import protoc  # dev dependency, imported only when generating

    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def stale_files(target: Path = ROOT) -> list[str]:
    """Names of generated files under ``target/bridge/v1`` that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh_dir = Path(tmp) / "bridge" / "v1"
        stale = []
        for name in GENERATED:
            current = target / "bridge" / "v1" / name
            fresh = (fresh_dir / name).read_bytes()
            if not current.exists() or current.read_bytes() != fresh:
                stale.append(name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: bridge/v1/{name}")
        return 1 if stale else 0
    generate(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
