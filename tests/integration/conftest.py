"""Fixtures shared by integration tests."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on yet (for peers started later in the test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
