"""Per-device token file: parsing, constant-time checks, reload on change."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bridge.config import credentials
from bridge.config.credentials import (
    CredentialFileError,
    DeviceTokenFile,
    parse_device_tokens,
    token_digest,
)
from bridge.config.settings import Settings, validate


class FakeClock:
    """The monotonic clock DeviceTokenFile rate-limits its checks by, advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_parse_and_verify() -> None:
    tokens = parse_device_tokens(
        f"# fleet\nrobot-1 {token_digest('a')}\n\nrobot-2 {token_digest('b')}"
    )
    assert set(tokens) == {"robot-1", "robot-2"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("robot-1", ":1: expected"),
        ("robot-1 md5:abc", ":1: digest must be"),
        ("robot-1 sha256:" + "g" * 64, ":1: digest is not hexadecimal"),
        (f"r {token_digest('a')}\nr {token_digest('b')}", ":2: 'r' is listed twice"),
    ],
)
def test_bad_files_name_the_line(text: str, problem: str) -> None:
    with pytest.raises(CredentialFileError, match=problem):
        parse_device_tokens(text, "f")


def test_file_is_reloaded_when_it_changes_and_keeps_the_last_good(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"robot-1 {token_digest('one')}\n")
    file = DeviceTokenFile(str(path), clock=clock)
    assert file.current().verify("robot-1", "one")
    assert not file.current().verify("robot-1", "two")
    assert not file.current().verify("robot-9", "one")  # unknown device
    path.write_text(f"robot-1 {token_digest('two')}\nrobot-9 {token_digest('nine')}\n")
    os.utime(path, ns=(1, 10**18))  # a different mtime even within one clock tick
    clock.now += 1.0  # past the check interval
    assert file.current().verify("robot-1", "two")
    assert file.current().verify("robot-9", "nine")
    path.write_text("garbage line here\n")
    os.utime(path, ns=(1, 2 * 10**18))
    clock.now += 1.0
    assert file.current().verify("robot-9", "nine")  # the last good entries stay


# -- a bad or huge file costs one read per change, never one per Hello -----------------------


@pytest.fixture
def file_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the ``stat`` and ``open`` calls bridge.config.credentials makes (the module's own
    names are wrapped, so the count does not depend on how the class is written)."""
    calls: Counter[str] = Counter()
    real_stat, real_open = os.stat, open

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        calls["stat"] += 1
        return real_stat(path, *args, **kwargs)

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        calls["open"] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(credentials.os, "stat", counting_stat)
    monkeypatch.setattr(credentials, "open", counting_open, raising=False)
    return calls


def good_file(path: Path, clock: FakeClock) -> DeviceTokenFile:
    path.write_text(f"robot-1 {token_digest('one')}\n")
    return DeviceTokenFile(str(path), check_seconds=1.0, clock=clock)


def test_invalid_utf8_keeps_the_last_good_entries(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    file = good_file(path, clock)
    path.write_bytes(b"robot-1 \xff\xfe not text\n")
    clock.now += 1.0
    with caplog.at_level(logging.ERROR, "bridge.config.credentials"):
        assert file.current().verify("robot-1", "one")
    assert "tokens:1: not UTF-8 text" in caplog.text


def test_same_bad_file_is_read_once_however_many_hellos(
    tmp_path: Path, clock: FakeClock, file_calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    """400k lines of which one is not UTF-8: before, each Hello re-read and decoded it."""
    path = tmp_path / "tokens"
    file = good_file(path, clock)
    path.write_bytes(b"robot-2 sha256:\xff\n" + b"# filler\n" * 400_000)
    file_calls.clear()
    with caplog.at_level(logging.ERROR, "bridge.config.credentials"):
        for _ in range(200):
            clock.now += 1.0  # every Hello a check interval apart: each may stat
            assert file.current().verify("robot-1", "one")
    assert file_calls["open"] == 1  # read once, when it changed
    assert file_calls["stat"] == 200
    assert caplog.text.count("keeping the last good file") == 1  # logged once per change


def test_stat_is_rate_limited_by_the_check_interval(
    tmp_path: Path, clock: FakeClock, file_calls: Counter[str]
) -> None:
    path = tmp_path / "tokens"
    file = good_file(path, clock)
    path.write_text(f"robot-1 {token_digest('two')}\n")
    file_calls.clear()
    for _ in range(200):
        clock.now += 0.004  # 200 Hellos in 0.8 s
        assert file.current().verify("robot-1", "one")  # not looked at yet
    assert file_calls == Counter()
    clock.now += 0.2
    assert file.current().verify("robot-1", "two")
    assert file_calls == Counter(stat=1, open=1)


def test_a_fixed_file_and_a_restored_file_are_read_again(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    file = good_file(path, clock)
    path.unlink()
    with caplog.at_level(logging.ERROR, "bridge.config.credentials"):
        for _ in range(5):
            clock.now += 1.0
            assert file.current().verify("robot-1", "one")
    assert caplog.text.count("No such file") == 1
    path.write_text(f"robot-1 {token_digest('three')}\n")
    clock.now += 1.0
    assert file.current().verify("robot-1", "three")
    path.write_text("robot-1 not-a-digest\n")
    clock.now += 1.0
    assert file.current().verify("robot-1", "three")
    path.write_text(f"robot-1 {token_digest('four')}\n")  # same size as the good one before
    clock.now += 1.0
    assert file.current().verify("robot-1", "four")


def test_oversize_file_is_refused_and_keeps_the_last_good(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"robot-1 {token_digest('one')}\n")
    file = DeviceTokenFile(str(path), max_bytes=1000, clock=clock)
    path.write_text("".join(f"robot-{i} {token_digest(str(i))}\n" for i in range(20)))
    clock.now += 1.0
    assert file.current().verify("robot-1", "one")
    assert not file.current().verify("robot-2", "2")
    with pytest.raises(CredentialFileError, match="larger than 1000 bytes"):
        DeviceTokenFile(str(path), max_bytes=1000)


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"robot-1 \xff\n", "tokens:1: not UTF-8"), (b"robot-1\n", "tokens:1: expected")],
)
def test_a_bad_file_at_startup_is_a_clear_error(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(content)
    with pytest.raises(CredentialFileError, match=problem):
        DeviceTokenFile(str(path))
    problems = validate(Settings(device_tokens_file=str(path)))
    assert any(p.startswith("device_tokens_file: ") and problem in p for p in problems)
