"""The WebSocket adapter uses only ``websockets``' public sans-I/O API (issue 30).

The adapter used to fork the library's asyncio I/O layer through undocumented attributes
(``protocol.reader.buffer``, ``recv_messages.put``, ``protocol.current_size``...), which the pin
``websockets>=15,<18`` let change under it across three majors. This reads every module of
``bridge/`` that imports ``websockets`` and fails on an imported name with a leading underscore,
an attribute of the library's protocol object that is not in its documented API, and the known
internals by name; and, in the adapter's own modules (``bridge/server/ws_*.py``,
``bridge/server/wsmeter.py``), on any import outside the public sans-I/O surface (the asyncio
implementation included: the SDK and the viewer may use its public client and server, the
ingest adapter is its own protocol).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BRIDGE = ROOT / "bridge"

# Public modules of the sans-I/O layer and its data types.
PUBLIC_MODULES = {
    "websockets",
    "websockets.datastructures",
    "websockets.exceptions",
    "websockets.extensions",
    "websockets.frames",
    "websockets.http11",
    "websockets.protocol",
    "websockets.server",
    "websockets.speedups",  # apply_mask, the C build of websockets.utils.apply_mask
    "websockets.typing",
    "websockets.utils",
}
# The documented API of websockets.protocol.Protocol / websockets.server.ServerProtocol.
PROTOCOL_API = {
    "receive_data",
    "receive_eof",
    "events_received",
    "data_to_send",
    "send_continuation",
    "send_text",
    "send_binary",
    "send_close",
    "send_ping",
    "send_pong",
    "fail",
    "close_expected",
    "accept",
    "reject",
    "send_response",
    "state",
    "close_code",
    "close_reason",
    "close_exc",
    "close_rcvd",
    "close_sent",
    "close_rcvd_then_sent",
    "handshake_exc",
    "id",
    "logger",
    "debug",
    "side",
}
KNOWN_INTERNALS = re.compile(
    r"\.reader\b|recv_messages|current_size|max_message_size|\.parser\b|\.expect_continuation"
    r"|\bAssembler\b|\bStreamReader\b"
)


def _modules_using_websockets() -> list[Path]:
    return sorted(p for p in BRIDGE.rglob("*.py") if "websockets" in p.read_text())


def _is_adapter(path: Path) -> bool:
    return path.parent == BRIDGE / "server" and (
        path.name.startswith("ws_") or path.name == "wsmeter.py"
    )


def _problems(path: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    rel = path.relative_to(ROOT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("websockets"):
            if _is_adapter(path) and node.module not in PUBLIC_MODULES:
                found.append(f"{rel}:{node.lineno}: imports {node.module}")
            found += [
                f"{rel}:{node.lineno}: imports private {alias.name} from {node.module}"
                for alias in node.names
                if alias.name.startswith("_")
            ]
        elif isinstance(node, ast.Import):
            found += [
                f"{rel}:{node.lineno}: imports {alias.name}"
                for alias in node.names
                if alias.name.startswith("websockets")
                and _is_adapter(path)
                and alias.name not in PUBLIC_MODULES
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "protocol"
            and node.attr not in PROTOCOL_API
        ):
            found.append(f"{rel}:{node.lineno}: .protocol.{node.attr} is not public API")
    for lineno, line in enumerate(source.splitlines(), 1):
        match = KNOWN_INTERNALS.search(line.split("#", 1)[0])
        if match and not line.lstrip().startswith(('"', "'")):
            found.append(f"{rel}:{lineno}: {match.group(0)} (a websockets internal)")
    return found


def test_the_adapter_is_found() -> None:
    names = {p.name for p in _modules_using_websockets() if _is_adapter(p)}
    assert {"ws_conn.py", "ws_impl.py"} <= names, names


def test_no_private_websockets_api_in_bridge() -> None:
    problems = [p for path in _modules_using_websockets() for p in _problems(path)]
    assert not problems, "\n".join(problems)
