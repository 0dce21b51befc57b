"""Structured logging setup: human text by default, one JSON object per line with ``json``.

In a pod (several ingest processes, docs/pod-worker.md) every line names its process: ``proc=<i>``
in text, ``"proc": i`` in JSON, from the environment the supervisor starts each process with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: Set by the pod's supervisor for each ingest process (bridge.protocol.podcontrol names them;
#: this module imports nothing of the bridge, so the names are spelled here too).
POD_CONTROL_ENV = "SIMBRIDGE_POD_CONTROL"
POD_INDEX_ENV = "SIMBRIDGE_POD_INDEX"


def pod_process_index() -> int | None:
    """This process's index in its pod; None outside one (a single process, or the supervisor)."""
    if not os.environ.get(POD_CONTROL_ENV):
        return None
    try:
        return int(os.environ.get(POD_INDEX_ENV, "0"))
    except ValueError:
        return None


class JsonFormatter(logging.Formatter):
    def __init__(self, proc: int | None = None) -> None:
        super().__init__()
        self.proc = proc

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.proc is not None:
            entry["proc"] = self.proc
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(fmt: str = "text", level: str = "INFO", proc: int | None = None) -> None:
    """``proc``: the process's index in its pod (default: :func:`pod_process_index`)."""
    proc = pod_process_index() if proc is None else proc
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(proc))
    else:
        tag = "" if proc is None else f"proc={proc} "
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class RateLimitedLog:
    """Logs the first event of each kind at once, then at most one line per ``interval_seconds``
    with how many were suppressed (why: refused input is counted in metrics; the log only needs
    to show that it happens, not every instance)."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_seconds: float,
        level: int = logging.INFO,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval_seconds
        self.level = level
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` tagged with ``kind`` unless one was logged recently; True if so."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._last[kind] = now
        skipped = self._suppressed.pop(kind, 0)
        suffix = f" ({kind}; {skipped} more since the last line)" if skipped else f" ({kind})"
        self.logger.log(self.level, msg + suffix, *args)
        return True


def log_task_failure(logger: logging.Logger, what: str) -> Callable[[asyncio.Task[Any]], None]:
    """A done-callback for a connection's background task: its end is retrieved (asyncio does
    not warn); cancelled or a closed connection is a normal end, anything else is logged as
    ``what`` failing."""

    def done(task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, ConnectionError):
            logger.error("%s failed: %r", what, exc)

    return done
