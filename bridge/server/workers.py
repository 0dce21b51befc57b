"""A thread pool whose size can change live (``resize``), for CPU-heavy work off the event loop.

``concurrent.futures.ThreadPoolExecutor`` can only grow; the adaptation loop must also shrink the
pool when the CPU quota drops. Decimation kernels release the GIL, so threads run in parallel.
A shrink never interrupts a task: surplus workers exit after their current one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("bridge.server.workers")

Task = Callable[[], None]
_STOP = object()


class WorkerPool:
    def __init__(self, workers: int, *, name: str = "bridge-worker") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._name = name
        self._tasks: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._target = 0
        self._serial = 0
        self._closed = False
        self.resize(workers)

    @property
    def size(self) -> int:
        """The target number of workers (threads still finishing a task may linger)."""
        return self._target

    def resize(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        with self._lock:
            if self._closed:
                return
            delta = workers - self._target
            self._target = workers
            for _ in range(max(0, delta)):
                self._serial += 1
                t = threading.Thread(
                    target=self._run, name=f"{self._name}-{self._serial}", daemon=True
                )
                self._threads.add(t)
                t.start()
            for _ in range(max(0, -delta)):
                self._tasks.put(_STOP)

    def submit(self, task: Task) -> None:
        if self._closed:
            raise RuntimeError("worker pool is closed")
        self._tasks.put(task)

    def _run(self) -> None:
        try:
            while True:
                task = self._tasks.get()
                if task is _STOP:
                    return
                try:
                    task()  # type: ignore[operator]
                except Exception:  # a task must report its own errors; never kill the worker
                    log.exception("worker task raised")
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def close(self, timeout: float = 5.0) -> None:
        """Stop all workers after the tasks already queued."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
            for _ in threads:
                self._tasks.put(_STOP)
        for t in threads:
            t.join(timeout)

    @property
    def alive(self) -> int:
        with self._lock:
            return len(self._threads)
