"""Per-device token file: parsing, constant-time checks, reload on change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bridge.credentials import (
    CredentialFileError,
    DeviceTokenFile,
    parse_device_tokens,
    token_digest,
)


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


def test_file_is_reloaded_when_it_changes_and_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"robot-1 {token_digest('one')}\n")
    file = DeviceTokenFile(str(path))
    assert file.current().verify("robot-1", "one")
    assert not file.current().verify("robot-1", "two")
    assert not file.current().verify("robot-9", "one")  # unknown device
    path.write_text(f"robot-1 {token_digest('two')}\nrobot-9 {token_digest('nine')}\n")
    os.utime(path, ns=(1, 10**18))  # a different mtime even within one clock tick
    assert file.current().verify("robot-1", "two")
    assert file.current().verify("robot-9", "nine")
    path.write_text("garbage line here\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert file.current().verify("robot-9", "nine")  # the last good entries stay
