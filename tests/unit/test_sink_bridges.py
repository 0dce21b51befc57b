"""The sink's per-bridge state (bridge/protocol/sinkbridges.py) and the name a bridge gives its
push streams (push_impl.bridge_identity): with replicas, one sink serves several bridges and
each numbers its frames (``bridge_seq``) on its own (issue 32)."""

from __future__ import annotations

import os
import socket

import pytest

from bridge.config import settings as settings_mod
from bridge.protocol.errors import ConfigError
from bridge.protocol.sinkbridges import (
    BRIDGE_HEADER,
    MAX_NAME_CHARS,
    BridgeTable,
    bridge_named,
)
from bridge.server.push_impl import bridge_identity


def by_name(table: BridgeTable, now: float = 0.0) -> dict[str, dict[str, object]]:
    return {str(b["bridge_id"]): b for b in table.report(now)}


def test_two_bridges_keep_their_bridge_seq_apart() -> None:
    """Bridge a acked up to 900, bridge b up to 12: each reports its own, not the max."""
    table = BridgeTable()
    a, b = table.opened("a", 0.0), table.opened("b", 0.0)
    table.received(a, 900, 1.0)
    table.acked(a, 900, 1.0)
    table.received(b, 12, 1.0)
    table.acked(b, 12, 1.0)
    got = by_name(table, 2.0)
    assert got["a"]["acked_bridge_seq"] == 900 and got["a"]["frames_received"] == 900
    assert got["b"]["acked_bridge_seq"] == 12 and got["b"]["frames_received"] == 12
    assert got["a"]["connected"] is got["b"]["connected"] is True
    assert got["b"]["seconds_since_seen"] == 1.0
    table.closed(b, 3.0)
    assert by_name(table)["b"]["connected"] is False


def test_a_restarted_bridge_reports_its_new_stream_not_the_old_max() -> None:
    """The same name after a restart counts from 1 again: the newest stream's ack is shown, and
    a late ack of the old stream does not overwrite it."""
    table = BridgeTable()
    old = table.opened("r1", 0.0)
    table.acked(old, 5000, 1.0)
    new = table.opened("r1", 2.0)
    table.acked(new, 3, 2.5)
    table.acked(old, 5001, 2.6)  # the old stream's last ack, arriving late
    got = by_name(table)["r1"]
    assert got["acked_bridge_seq"] == 3
    assert got["push_streams"] == 2 and got["active_push_streams"] == 2


def test_watermark_queries_are_counted_apart_from_push_streams() -> None:
    table = BridgeTable()
    push = table.opened("r1", 0.0)
    table.acked(push, 7, 0.0)
    query = table.opened("r1", 1.0, query=True)
    table.acked(query, 1, 1.0)  # a query carries no frames; nothing it does moves the ack
    table.closed(query, 1.1)
    got = by_name(table)["r1"]
    assert got["marks_queries"] == 1 and got["push_streams"] == 1
    assert got["acked_bridge_seq"] == 7 and got["connected"] is True


def test_bounded_the_oldest_idle_bridge_is_evicted() -> None:
    table = BridgeTable(cap=2)
    a = table.opened("a", 0.0)
    table.closed(a, 1.0)  # idle since 1.0
    b = table.opened("b", 2.0)
    table.closed(b, 3.0)  # idle since 3.0
    table.opened("c", 4.0)
    assert sorted(by_name(table)) == ["b", "c"]  # a was idle longest


def test_bounded_when_every_tracked_bridge_is_busy_the_new_one_is_not_tracked() -> None:
    table = BridgeTable(cap=2)
    table.opened("a", 0.0)
    table.opened("b", 0.0)
    c = table.opened("c", 1.0)
    table.acked(c, 10, 1.0)
    table.received(c, 10, 1.0)
    table.closed(c, 2.0)
    assert sorted(by_name(table)) == ["a", "b"]
    assert table.untracked_streams == 1


def test_the_header_names_the_bridge_bounded() -> None:
    assert bridge_named([("x-simbridge-device", "d1"), (BRIDGE_HEADER, "r2")]) == "r2"
    assert bridge_named([(BRIDGE_HEADER, b"r3")]) == "r3"
    assert bridge_named([(BRIDGE_HEADER, "x" * 1000)]) == "x" * MAX_NAME_CHARS
    assert bridge_named(None) == bridge_named([]) == ""  # an older bridge: the unnamed entry


def test_bridge_identity_setting_then_pod_then_host_and_pid() -> None:
    base = settings_mod.Settings()
    assert bridge_identity(base) == f"{socket.gethostname()}-{os.getpid()}"
    assert bridge_identity(base.replace(pod_name="simbridge-7f9c")) == "simbridge-7f9c"
    named = base.replace(pod_name="simbridge-7f9c", bridge_id="simbridge-7f9c.2")
    assert bridge_identity(named) == "simbridge-7f9c.2"


def test_bridge_id_from_the_environment_and_checked() -> None:
    """The pod's supervisor names each process through BRIDGE_BRIDGE_ID."""
    loaded = settings_mod.load({}, {"BRIDGE_BRIDGE_ID": "pod-a.1"})
    assert loaded.bridge_id == "pod-a.1"
    with pytest.raises(ConfigError, match="bridge_id"):
        settings_mod.load({}, {"BRIDGE_BRIDGE_ID": "has space"})
