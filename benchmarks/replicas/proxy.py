"""The switchable TCP forwarder (a stand-in load balancer) lives in ``tests/support/`` with the
other test stand-ins; re-exported here for benchmarks that move a device between replicas."""

from __future__ import annotations

from tests.support.switchproxy import SwitchProxy

__all__ = ["SwitchProxy"]
