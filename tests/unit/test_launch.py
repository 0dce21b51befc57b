"""loadgen.launch with real child processes: the ready line, its deadline, clean stop, kill."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from loadgen.launch import ChildProcess, parse_ready, serve_command


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_parse_ready() -> None:
    assert parse_ready("SIMBRIDGE_READY ws=1 grpc=2 http=3\n") == {"ws": 1, "grpc": 2, "http": 3}
    assert parse_ready("RELAY_READY port=9", "RELAY_READY") == {"port": 9}
    assert parse_ready("SIMBRIDGE_READYX ws=1") is None
    assert parse_ready("") is None
    json_line = '{"ts": "t", "msg": "SIMBRIDGE_READY", "ws": 1, "grpc": 2, "http": 3}'
    assert parse_ready(json_line) == {"ws": 1, "grpc": 2, "http": 3}
    assert parse_ready('{"msg": "something else", "ws": 1}') is None
    assert parse_ready("{not json") is None


async def test_serve_with_json_logs_is_ready_too() -> None:
    child = await ChildProcess.start(
        serve_command("--no-adapt", "--log-format", "json"), timeout=60
    )
    assert set(child.ports) == {"ws", "grpc", "http"}
    assert await child.stop() == 0


async def test_serve_starts_reports_ports_and_drains_on_stop() -> None:
    child = await ChildProcess.start(serve_command("--no-adapt"), timeout=60)
    assert set(child.ports) >= {"ws", "grpc", "http"}
    assert all(p > 0 for p in child.ports.values())
    assert await child.stop() == 0
    assert child.log.closed


async def test_no_ready_line_before_the_deadline_kills_the_child() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"sleeper did not start.*no ready line within 0.5 s"):
        await ChildProcess.start(
            py("import sys, time; print('warming up', file=sys.stderr); time.sleep(60)"),
            name="sleeper",
            timeout=0.5,
        )
    assert time.monotonic() - t0 < 10


async def test_wrong_line_error_names_it_and_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    code = "import sys; print('boom on stderr', file=sys.stderr, flush=True); print('Traceback')"
    with pytest.raises(RuntimeError) as err:
        await ChildProcess.start(py(code), log_path=log, timeout=20)
    assert "'Traceback'" in str(err.value) and "boom on stderr" in str(err.value)
    assert str(log) in str(err.value)


async def test_sigterm_ignored_is_killed_after_the_timeout() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('RELAY_READY port=7', flush=True); time.sleep(60)"
    )
    child = await ChildProcess.start(py(code), ready="RELAY_READY", timeout=20)
    assert child.port("port") == 7
    with pytest.raises(KeyError, match="no ws="):
        child.port("ws")
    assert await child.stop(timeout=0.5) == -signal.SIGKILL
    assert gone(child.pid)
    child.kill()  # idempotent


async def test_env_and_logs_of_a_running_child() -> None:
    code = (
        "import os, sys, time; print('value', os.environ['LAUNCH_T'], file=sys.stderr,"
        " flush=True); print('SIMBRIDGE_READY http=5', flush=True); time.sleep(60)"
    )
    child = await ChildProcess.start(py(code), env={"LAUNCH_T": "x42"}, timeout=20)
    try:
        for _ in range(200):
            if "x42" in child.logs():
                break
            await asyncio.sleep(0.01)
        assert "value x42" in child.logs()
        assert child.cpu_seconds() >= 0
    finally:
        assert await child.stop(timeout=5) == -signal.SIGTERM
