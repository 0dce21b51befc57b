"""Who may read what on an ops port: the one rule the single bridge's ops server
(``bridge.server.http_impl``) and the pod's (``bridge.pod.ops_http``) both apply, so the two
ports can never disagree. With a token set, ``/debug/*`` always needs it and ``/metrics`` does
unless ``metrics_auth: open``; the probes never do."""

from __future__ import annotations

import hmac


def needs_token(path: str, token: str, metrics_open: bool) -> bool:
    if not token:
        return False
    if path == "/metrics":
        return not metrics_open
    return path.startswith("/debug/")


def bearer_matches(head: bytes, token: str) -> bool:
    """The request head carries ``Authorization: Bearer <token>`` (compared in constant time)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            scheme, _, offered = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                return hmac.compare_digest(offered.strip(), token.encode())
    return False
