"""The rebalance route's rules (bridge/server/rebalance.py) and the ops server's POST hook
(bridge/server/http_impl.py): bounded parameters, evenly spaced Drains, POST routes only with
the token."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from bridge.server.http_impl import OpsHttpServer
from bridge.server.rebalance import (
    DEFAULT_RECONNECT_MS,
    DEFAULT_SPREAD_SECONDS,
    Rebalancer,
    Request,
    offsets,
    parse_request,
)


def test_parameters_default_and_bounded() -> None:
    assert parse_request("") == Request(DEFAULT_SPREAD_SECONDS, DEFAULT_RECONNECT_MS)
    assert parse_request("spread_seconds=30&reconnect_ms=0") == Request(30.0, 0)
    for bad, why in (
        ("spread_seconds=601", "spread_seconds"),
        ("spread_seconds=-1", "spread_seconds"),
        ("spread_seconds=nan", "spread_seconds"),
        ("spread_seconds=inf", "spread_seconds"),
        ("spread_seconds=x", "not a number"),
        ("reconnect_ms=10001", "reconnect_ms"),
        ("reconnect_ms=1.5", "not a number"),
        ("spread_seconds=1&spread_seconds=2", "once"),
        ("everything=now", "unknown"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_request(bad)
    with pytest.raises(ValueError):  # parse_qs's own bound on the number of fields
        parse_request("&".join(f"a{i}=1" for i in range(10)))


def test_drains_are_evenly_spaced_over_the_spread() -> None:
    assert offsets(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert offsets(1, 10.0) == [0.0]
    assert offsets(0, 10.0) == []
    assert offsets(3, 0.0) == [0.0, 0.0, 0.0]


async def test_one_rebalance_at_a_time_and_none_while_shutting_down() -> None:
    draining = False
    rebalancer = Rebalancer(lambda: [], lambda: draining)
    status, _, body = await rebalancer.handle("spread_seconds=5")
    assert status == 202 and b'"edges": 0' in body
    assert (await rebalancer.handle("spread_seconds=0"))[0] == 409  # its run has not ended
    await asyncio.sleep(0)  # nobody to drain: the run ends at its first turn
    assert not rebalancer.running
    assert (await rebalancer.handle("spread_seconds=0"))[0] == 202
    await rebalancer.close()
    draining = True
    assert (await rebalancer.handle(""))[0] == 503
    assert (await rebalancer.handle("spread_seconds=999"))[0] == 400


def ops(token: str) -> OpsHttpServer:
    server = OpsHttpServer(
        CollectorRegistry(),
        is_live=lambda: True,
        is_ready=lambda: True,
        describe_resources=dict,
        token=token,
    )

    async def route(query: str) -> tuple[int, str, bytes]:
        return 202, "text/plain", query.encode()

    server.post_routes["/admin/rebalance"] = route
    return server


def head(method: str, target: str, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return f"{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()


def test_post_routes_need_the_token_and_are_refused_without_one() -> None:
    guarded, open_ = ops("s3cret"), ops("")
    target = "/admin/rebalance?spread_seconds=3"
    assert guarded.answer_now(head("POST", target, "s3cret")) == (b"", target)
    assert guarded.answer_now(head("POST", target))[0].startswith(b"HTTP/1.1 401")
    assert guarded.answer_now(head("POST", target, "wrong"))[0].startswith(b"HTTP/1.1 401")
    assert open_.answer_now(head("POST", target, "anything"))[0].startswith(b"HTTP/1.1 403")
    # Other methods and paths are as before: POST elsewhere 405, GET of the route not a POST.
    assert guarded.answer_now(head("POST", "/metrics", "s3cret"))[0].startswith(b"HTTP/1.1 405")
    assert guarded.answer_now(head("GET", target, "s3cret")) == (b"", "/admin/rebalance")
