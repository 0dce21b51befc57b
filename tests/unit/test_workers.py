"""WorkerPool with real threads: parallel work, live grow and shrink that never interrupts a
task, a raising task that does not kill its worker, and close."""

from __future__ import annotations

import threading
import time

import pytest

from bridge.server.workers import WorkerPool


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_tasks_run_in_parallel_up_to_the_pool_size() -> None:
    pool = WorkerPool(3)
    gate = threading.Event()
    running: list[str] = []
    lock = threading.Lock()

    def task() -> None:
        with lock:
            running.append(threading.current_thread().name)
        gate.wait(5)

    try:
        for _ in range(5):
            pool.submit(task)
        assert wait_for(lambda: len(running) == 3)
        time.sleep(0.05)
        assert len(running) == 3, "a fourth task started with three workers busy"
        assert len(set(running)) == 3
        gate.set()
        assert wait_for(lambda: len(running) == 5)
    finally:
        gate.set()
        pool.close()


def test_shrink_lets_running_tasks_finish_and_grow_adds_workers() -> None:
    pool = WorkerPool(2)
    gate = threading.Event()
    done: list[int] = []

    def task(i: int) -> None:
        gate.wait(5)
        done.append(i)

    try:
        pool.submit(lambda: task(1))
        pool.submit(lambda: task(2))
        assert wait_for(lambda: pool.alive == 2)
        pool.resize(1)
        assert pool.size == 1
        gate.set()
        assert wait_for(lambda: sorted(done) == [1, 2]), "a shrink interrupted a task"
        assert wait_for(lambda: pool.alive == 1)
        pool.resize(4)
        assert wait_for(lambda: pool.alive == 4)
        for i in range(3, 11):
            pool.submit(lambda i=i: task(i))  # type: ignore[misc]
        assert wait_for(lambda: len(done) == 10)
    finally:
        gate.set()
        pool.close()


def test_a_raising_task_does_not_kill_its_worker() -> None:
    pool = WorkerPool(1)
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("task bug")

    try:
        pool.submit(boom)
        pool.submit(ran.set)
        assert ran.wait(5)
        assert pool.alive == 1
    finally:
        pool.close()


def test_close_runs_what_is_queued_then_refuses_work() -> None:
    pool = WorkerPool(1)
    done: list[int] = []
    for i in range(5):
        pool.submit(lambda i=i: done.append(i))  # type: ignore[misc]
    pool.close()
    assert done == [0, 1, 2, 3, 4]
    assert pool.alive == 0
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    pool.resize(3)  # after close: ignored, no threads start
    assert pool.alive == 0
    with pytest.raises(ValueError):
        WorkerPool(0)
