"""``simbridge decimate IN OUT --voxel V``: voxel-downsample a PCD/PLY file offline.

Files are read and written with Open3D's tensor I/O (so every format it knows works), then
packed into the same record layout the data plane sees (x, y, z plus one scalar field per
attribute column) and decimated by the chosen backend — the exact code path a live frame
takes, which makes this command a quick way to preview a voxel size on a recorded cloud.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bridge.decimate._types import BackendUnavailable
from bridge.decimate.backends import get_decimator
from bridge.protocol.cloud import CloudLayout, FieldType, make_layout

_TYPE_CODES = {np.dtype(ft.dtype).newbyteorder("="): ft for ft in FieldType}


class FileError(Exception):
    """A file could not be read, converted or written (reported without a traceback)."""


#: Output formats that keep only some attributes (Open3D's writers); .pcd and .ply keep them all.
LOSSY_FORMATS = {
    ".xyz": ("positions",),
    ".xyzn": ("positions", "normals"),
    ".xyzrgb": ("positions", "colors"),
    ".pts": ("positions", "colors"),
}
WRITABLE = (".pcd", ".ply", *LOSSY_FORMATS)

#: Library argument names as the user knows them (errors from the decimators name the former).
_FLAG_NAMES = {"voxel_size": "--voxel", "max_points": "--max-points", "threads": "--threads"}


def flag_names(message: str) -> str:
    """Rewrite ``voxel_size``/``max_points``/``threads`` in an error message as this command's
    flags, so the user reads what to change on the command line."""
    return re.sub(r"\b(voxel_size|max_points|threads)\b", lambda m: _FLAG_NAMES[m[1]], message)


def _open3d() -> Any:
    try:
        import open3d as o3d
    except ImportError as exc:  # typically the missing libusb-1.0-0 (see the README)
        raise FileError(
            f"Open3D is needed for file I/O and cannot be imported: {exc} "
            "(pip install open3d; apt-get install libusb-1.0-0)"
        ) from None
    # Open3D prints its own coloured warnings (e.g. "[Open3D WARNING] Write PCD failed") next to
    # ours; this command says what went wrong itself.
    o3d.utility.set_verbosity_level(o3d.utility.VerbosityLevel.Error)
    return o3d


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def check_output(output: Path, attributes: list[str], drop_fields: bool) -> None:
    """Refuse an output that cannot be written, or that would silently lose attributes."""
    if not output.parent.is_dir():
        raise FileError(f"{output}: no such directory: {output.parent}")
    suffix = output.suffix.lower()
    if suffix not in WRITABLE:
        raise FileError(
            f"{output}: unknown output format {suffix!r}; use one of {', '.join(WRITABLE)}"
        )
    kept = LOSSY_FORMATS.get(suffix)
    lost = [a for a in attributes if kept is not None and a not in kept]
    if lost and not drop_fields:
        raise FileError(
            f"{output}: {suffix} files store only {', '.join(kept or ())}; the input's "
            f"{', '.join(lost)} would be lost. Write .pcd or .ply to keep them, or pass "
            "--drop-fields to drop them."
        )


def _columns(pcd: Any) -> dict[str, npt.NDArray[Any]]:
    """Attribute name -> (n, k) array, positions first."""
    names = ["positions", *sorted(k for k in pcd.point if k != "positions")]
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in names:
        arr = pcd.point[name].numpy()
        cols[name] = arr.reshape(len(arr), -1)
    return cols


def pack_columns(cols: dict[str, npt.NDArray[Any]]) -> tuple[CloudLayout, bytes, list[str]]:
    """Pack attribute columns into records: x, y, z then ``<attr>_<i>`` per column.

    Returns the layout, the packed bytes and the attribute order for :func:`unpack_columns`.
    """
    pos = cols["positions"]
    if pos.shape[1] != 3 or pos.dtype not in (np.float32, np.float64):
        raise FileError(f"positions must be (n, 3) float32/float64, got {pos.shape} {pos.dtype}")
    triples: list[tuple[str, int, int]] = []
    offset = 0
    order = list(cols)
    for name in order:
        arr = cols[name]
        ftype = _TYPE_CODES.get(arr.dtype.newbyteorder("="))
        if ftype is None:
            raise FileError(f"attribute {name!r} has unsupported dtype {arr.dtype}")
        for i in range(arr.shape[1]):
            field = "xyz"[i] if name == "positions" else f"{name}_{i}"
            triples.append((field, offset, int(ftype)))
            offset += ftype.size
    layout = make_layout(offset, triples)
    rec = np.zeros(len(pos), dtype=layout.structured_dtype)
    k = 0
    for name in order:
        for i in range(cols[name].shape[1]):
            rec[triples[k][0]] = cols[name][:, i]
            k += 1
    return layout, rec.tobytes(), order


def unpack_columns(
    layout: CloudLayout, data: bytes, order: list[str], like: dict[str, npt.NDArray[Any]]
) -> dict[str, npt.NDArray[Any]]:
    rec = np.frombuffer(data, dtype=layout.structured_dtype)
    out: dict[str, npt.NDArray[Any]] = {}
    k = 0
    for name in order:
        width = like[name].shape[1]
        names = [layout.fields[k + i].name for i in range(width)]
        out[name] = np.stack([rec[n] for n in names], axis=1).astype(like[name].dtype)
        k += width
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simbridge decimate",
        description=(
            "Voxel-downsample a point-cloud file (PCD, PLY, anything Open3D reads). Non-finite "
            "points are dropped; each occupied voxel floor(p / VOXEL) becomes the mean of its "
            "points (every attribute averaged; integer attributes such as colours rounded); "
            "output is sorted by voxel key. Same semantics as the live data plane."
        ),
    )
    parser.add_argument("input", metavar="IN", type=Path, help="input point cloud file")
    parser.add_argument(
        "output",
        metavar="OUT",
        type=Path,
        help=f"output file; the suffix picks the format: {', '.join(WRITABLE)}",
    )
    parser.add_argument(
        "--voxel",
        type=_positive_float,
        required=True,
        metavar="V",
        help="voxel edge in the cloud's units (a number > 0)",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "numpy", "c", "cuda"],
        help="decimation backend (default auto: cuda > c > numpy, whichever is available)",
    )
    parser.add_argument(
        "--threads",
        type=_int_at_least(1),
        default=1,
        metavar="N",
        help="C kernel threads, >= 1 (default 1)",
    )
    parser.add_argument(
        "--max-points",
        type=_int_at_least(0),
        default=0,
        metavar="N",
        help="point budget: coarsen the voxel along x1, 1.5, 2, 3, 4, ... until it fits "
        "(0 = none, the default)",
    )
    parser.add_argument(
        "--drop-fields",
        action="store_true",
        help="allow an output format that keeps fewer attributes than the input has (.xyz keeps "
        "only positions, .xyzrgb and .pts positions and colours); without it such a write is "
        "refused",
    )
    parser.add_argument("--ascii", action="store_true", help="write a text file, not binary")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    return parser


def run(args: argparse.Namespace) -> str:
    o3d = _open3d()
    if not args.input.parent.is_dir():
        raise FileError(f"{args.input}: no such directory: {args.input.parent}")
    if not args.input.is_file():
        raise FileError(f"{args.input}: no such file")
    if not args.output.parent.is_dir():  # before reading a big input
        raise FileError(f"{args.output}: no such directory: {args.output.parent}")
    pcd = o3d.t.io.read_point_cloud(str(args.input))
    if "positions" not in pcd.point or len(pcd.point.positions) == 0:
        raise FileError(f"{args.input}: no points read (unknown format or empty file)")
    cols = _columns(pcd)
    check_output(args.output, list(cols), args.drop_fields)
    if args.drop_fields and args.output.suffix.lower() in LOSSY_FORMATS:
        kept = LOSSY_FORMATS[args.output.suffix.lower()]
        cols = {name: arr for name, arr in cols.items() if name in kept}
    layout, data, order = pack_columns(cols)
    decimator = get_decimator(args.backend, threads=args.threads)
    start = time.perf_counter()
    result = decimator.downsample(layout, data, args.voxel, max_points=args.max_points)
    elapsed = time.perf_counter() - start
    out_cols = unpack_columns(layout, result.data, order, cols)
    out = o3d.t.geometry.PointCloud()
    for name, arr in out_cols.items():
        out.point[name] = o3d.core.Tensor(np.ascontiguousarray(arr))
    if not o3d.t.io.write_point_cloud(str(args.output), out, write_ascii=args.ascii):
        raise FileError(f"{args.output}: Open3D could not write this file")
    return (
        f"{args.input}: {len(cols['positions'])} points -> {args.output}: {result.points} points "
        f"(voxel {result.voxel_size:g}, backend {result.backend}, {elapsed * 1e3:.1f} ms)"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``simbridge decimate``; returns the exit status (2 = usage)."""
    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except (FileError, BackendUnavailable, ValueError) as exc:
        print(f"simbridge decimate: error: {flag_names(str(exc))}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
