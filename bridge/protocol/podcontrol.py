"""The pod's control channel: JSON lines between the supervisor and its ingest processes over a
Unix stream socket (docs/scaling.md "Processes in a pod"). Sans-I/O: encoding, decoding and
the bounds; the sockets live in ``bridge.pod.supervisor`` and ``bridge.server.podlink``.

Why JSON lines: a handful of small messages per Hello and per resize, between trusted processes
of one pod; a text format is readable in a debugger and costs nothing measurable at that rate.
Still bounded: a line longer than :data:`MAX_LINE_BYTES` is a protocol error (the peer is
closed), and every field is checked on decode.

Messages (``t`` names the kind):

worker -> supervisor
    ``up``        index, pid, ops (host:port of its internal ops HTTP), grpc_internal (host:port
                  of its private gRPC listener), ws, grpc (the public ports it listens on)
    ``claim``     id, device, token (the Hello's resume token), proven (the transport proved
                  the device's identity)
    ``forget``    device (its session left this process: the table forgets it there)
    ``released``  id, ok, reason, delivered ({stream_id: delivered_seq} when ok)

supervisor -> worker
    ``claimed``   id, granted, reason, delivered ({stream_id: delivered_seq} from the previous
                  owner: what it delivered, to start above), epoch
    ``release``   id, device, token, proven (another process has a Hello for this device)
    ``share``     memory_limit_bytes (None: no limit), cpu_cores (None: no quota), workers,
                  processes, index, siblings ([{index, grpc_internal}] of the others)
    ``retire``    reconnect_after_ms: the plan has no room for this process; drain and exit,
                  telling the edges to come back after this long (the other processes are up)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LINE_BYTES = 64 * 1024  # a share with hundreds of siblings fits; nothing larger is sent
MAX_DEVICE_ID_BYTES = 1024  # the edge protocol's own bound is smaller; a guard, not a limit
MAX_STREAMS = 4096  # delivered maps: max_streams_per_session is far below

ENV_CONTROL = "SIMBRIDGE_POD_CONTROL"  # the control socket's path
ENV_INDEX = "SIMBRIDGE_POD_INDEX"  # this process's slot, 0..N-1 (stable across restarts)
ENV_SECRET = "SIMBRIDGE_POD_SECRET"  # the pod-internal credential (internal gRPC, ops)

KINDS_TO_SUPERVISOR = frozenset({"up", "claim", "forget", "released"})
KINDS_TO_WORKER = frozenset({"claimed", "release", "share", "retire"})


class ControlError(ValueError):
    """A line that is not a valid control message: the channel is closed."""


@dataclass(frozen=True, slots=True)
class Message:
    kind: str
    fields: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def encode(kind: str, **fields: Any) -> bytes:
    """One message as one line (newline included)."""
    if kind not in KINDS_TO_SUPERVISOR and kind not in KINDS_TO_WORKER:
        raise ControlError(f"unknown control message kind {kind!r}")
    line = json.dumps({"t": kind, **fields}, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE_BYTES:
        raise ControlError(f"control message of {len(line)} bytes > {MAX_LINE_BYTES}")
    return line


_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "up": {"index": int, "pid": int, "ops": str, "grpc_internal": str},
    "claim": {"id": int, "device": str, "token": str, "proven": bool},
    "forget": {"device": str},
    "released": {"id": int, "ok": bool, "reason": str, "delivered": dict},
    "claimed": {"id": int, "granted": bool, "reason": str, "delivered": dict, "epoch": int},
    "release": {"id": int, "device": str, "token": str, "proven": bool},
    "retire": {"reconnect_after_ms": int},
    "share": {
        "memory_limit_bytes": (int, type(None)),
        "cpu_cores": (int, float, type(None)),
        "workers": int,
        "processes": int,
        "index": int,
        "siblings": list,
    },
}


def decode(line: bytes, *, expect: frozenset[str]) -> Message:
    """Parse one line sent to this side (``expect``: the kinds it may receive)."""
    if len(line) > MAX_LINE_BYTES:
        raise ControlError(f"control line of {len(line)} bytes > {MAX_LINE_BYTES}")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlError(f"control line is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ControlError("control line is not a JSON object")
    kind = data.pop("t", None)
    if not isinstance(kind, str) or kind not in expect:
        raise ControlError(f"unexpected control message kind {kind!r}")
    for name, types in _REQUIRED[kind].items():
        value = data.get(name)
        ok = isinstance(value, types) and not (
            isinstance(value, bool) and types in (int, (int, type(None)))
        )
        if not ok:
            raise ControlError(f"{kind}: field {name!r} missing or of the wrong type")
    device = data.get("device")
    if isinstance(device, str) and len(device.encode()) > MAX_DEVICE_ID_BYTES:
        raise ControlError(f"{kind}: device id over {MAX_DEVICE_ID_BYTES} bytes")
    delivered = data.get("delivered")
    if isinstance(delivered, dict) and not _seq_map(delivered):
        raise ControlError(f"{kind}: delivered must map at most {MAX_STREAMS} stream ids to seqs")
    return Message(kind, data)


def _seq_map(value: dict[Any, Any]) -> bool:
    return len(value) <= MAX_STREAMS and all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    )
