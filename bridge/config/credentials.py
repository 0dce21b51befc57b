"""Per-device credentials: a token file binding device ids to tokens (sans-I/O parsing and
checking; :class:`DeviceTokenFile` re-reads the file when it changes, at most one ``stat`` per
``device_tokens_check_seconds``).

Why: with one shared ``auth_token`` any edge may speak for any device id. With a token file,
a device proves its id, so its Hello may also take over its own live session (a restarted
device whose old connection is still half-open) without the session's resume token.

File format, one device per line (``#`` comments and blank lines ignored)::

    robot-1  sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

The digest is SHA-256 of the token's UTF-8 bytes (``printf %s TOKEN | sha256sum``), so the file
never holds a usable secret. Digests are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("bridge.config.credentials")

# ~50,000 devices at ~85 bytes a line; parsing one this size takes ~0.25 s of loop CPU (AMD
# EPYC), paid once per change of the file. A larger file is refused (the last good one stays).
MAX_TOKEN_FILE_BYTES = 4 * 1024 * 1024


class CredentialFileError(ValueError):
    """The token file cannot be used; the message names the line."""


def token_digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def parse_device_tokens(text: str, source: str = "device tokens") -> dict[str, str]:
    """device id -> ``sha256:<hex>`` digest; every problem raises with its line number."""
    entries: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise CredentialFileError(f"{source}:{number}: expected 'DEVICE_ID sha256:HEX'")
        device, digest = parts
        hex_part = digest.removeprefix("sha256:")
        if not digest.startswith("sha256:") or len(hex_part) != 64:
            raise CredentialFileError(f"{source}:{number}: digest must be sha256:<64 hex digits>")
        try:
            int(hex_part, 16)
        except ValueError:
            raise CredentialFileError(f"{source}:{number}: digest is not hexadecimal") from None
        if device in entries:
            raise CredentialFileError(f"{source}:{number}: {device!r} is listed twice")
        entries[device] = "sha256:" + hex_part.lower()
    return entries


def read_device_tokens(path: str, max_bytes: int = MAX_TOKEN_FILE_BYTES) -> dict[str, str]:
    """Read and parse the token file, reading at most ``max_bytes`` + 1 bytes of it; an
    oversize or non-UTF-8 file raises :class:`CredentialFileError` naming the problem."""
    with open(path, "rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise CredentialFileError(f"{path}: larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise CredentialFileError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from None
    return parse_device_tokens(text, path)


@dataclass(frozen=True)
class DeviceTokens:
    entries: Mapping[str, str]

    def verify(self, device_id: str, token: str) -> bool:
        """True when ``token`` is the one registered for ``device_id`` (constant-time compare;
        an unknown device costs the same as a wrong token)."""
        expected = self.entries.get(device_id, "sha256:" + "0" * 64)
        ok = hmac.compare_digest(token_digest(token), expected)
        return ok and device_id in self.entries


class DeviceTokenFile:
    """The token file, looked at no more than once per ``check_seconds`` (one ``stat``) and
    read and parsed again only when its identity, size or times changed.

    Why: the check runs on the event loop inside every Hello. A file that turns unreadable,
    oversize, not UTF-8 or invalid keeps the last good entries and is logged once; the same
    bad version is never read twice, so a huge broken file costs one parse, not one per Hello.
    A bad file at startup raises (the constructor reads it), which is a clear startup error.
    """

    def __init__(
        self,
        path: str,
        *,
        check_seconds: float = 1.0,
        max_bytes: int = MAX_TOKEN_FILE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.check_seconds = check_seconds
        self.max_bytes = max_bytes
        self._clock = clock
        self._stamp: tuple[int, ...] | None = _stamp(os.stat(path))
        self._tokens = DeviceTokens(read_device_tokens(path, max_bytes))
        self._stat_problem = ""  # the last stat failure logged, so each is logged once
        self._next_check = clock() + check_seconds
        log.info("device tokens: %d devices from %s", len(self._tokens.entries), path)

    def current(self) -> DeviceTokens:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self.check_seconds
            self._check()
        return self._tokens

    def _check(self) -> None:
        try:
            stamp = _stamp(os.stat(self.path))
        except OSError as exc:
            self._stamp = None  # whatever appears at the path next is read
            if str(exc) != self._stat_problem:
                self._stat_problem = str(exc)
                log.error("device tokens: keeping the last good file: %s", exc)
            return
        self._stat_problem = ""
        if stamp == self._stamp:
            return
        self._stamp = stamp  # good or bad, this version is not read again
        try:
            entries = read_device_tokens(self.path, self.max_bytes)
        except (OSError, ValueError) as exc:  # CredentialFileError is a ValueError
            log.error(
                "device tokens: keeping the last good file (%d devices): %s",
                len(self._tokens.entries),
                exc,
            )
            return
        self._tokens = DeviceTokens(entries)
        log.info("device tokens: %d devices from %s", len(entries), self.path)


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What changes when the file is rewritten in place or replaced (rename, new inode)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
