"""This process's resident size, read from ``/proc/self/statm`` (one small read): the baseline a
plan subtracts, the usage a pod's share is judged by, and what ``/debug/resources`` reports."""

from __future__ import annotations

import os


def own_rss_bytes() -> int | None:
    """This process's resident bytes (None where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
