"""Per-device credentials: a token file binding device ids to tokens (sans-I/O parsing and
checking; :class:`DeviceTokenFile` re-reads the file when it changes).

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
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger("bridge.credentials")


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
    """The token file, re-read when its modification time or size changes. A file that turns
    unreadable or invalid keeps the last good entries (logged once per change)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._tokens = DeviceTokens({})
        self.reload()

    def reload(self) -> None:
        stat = os.stat(self.path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        with open(self.path, encoding="utf-8") as f:
            entries = parse_device_tokens(f.read(), self.path)
        self._tokens, self._stamp = DeviceTokens(entries), stamp
        log.info("device tokens: %d devices from %s", len(entries), self.path)

    def current(self) -> DeviceTokens:
        try:
            self.reload()
        except (OSError, CredentialFileError) as exc:
            if self._stamp is not None:
                log.error("device tokens: keeping the last good file: %s", exc)
                self._stamp = None  # log once; the next good change reloads
        return self._tokens
