"""Messages of Foxglove channels that nobody is subscribed to yet, kept for the first subscriber
(sans-I/O).

Why: a Foxglove client learns of a channel from the server's ``advertise`` and can subscribe only
after that, one round trip later. A channel is advertised when its first message is logged, so
without this hold the first message of every new channel (a new stream, its first gap marker)
reached nobody. Here a message logged while its channel has no subscriber is kept instead; the
first subscriber gets the kept messages at once, in order, then the live ones (like a latched
topic: a client that opens a channel later also sees its newest message first).

Bounds: at most ``max_messages`` per channel and ``max_bytes`` in all; past them the oldest kept
message goes. Such a loss is a viewer drop only when someone could have missed it: the channel
never had a subscriber yet and a client was watching (subscribed to something) when it went.
Those are reported by :meth:`ChannelHold.take` so the outlet counts them and announces the gap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from bridge.view.convert import GAP, OutMessage

#: Default bounds of the hold (``simbridge view --foxglove-hold-*``).
HOLD_MESSAGES = 64
HOLD_BYTES = 64 * 1024 * 1024


@dataclass
class Taken:
    """What a new subscriber of a channel gets: the kept messages, oldest first, and how many
    data messages of each (device, stream) it missed because the hold was full."""

    messages: list[OutMessage] = field(default_factory=list)
    missed: dict[tuple[str, str], int] = field(default_factory=dict)


class ChannelHold:
    def __init__(self, max_messages: int = HOLD_MESSAGES, max_bytes: int = HOLD_BYTES) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("the Foxglove hold needs max_messages >= 1 and max_bytes >= 1")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._kept: dict[str, deque[tuple[int, OutMessage]]] = {}
        self._missed: dict[str, dict[tuple[str, str], int]] = {}
        self._subscribed_once: set[str] = set()
        self._order = 0
        self.bytes = 0
        self.evicted = 0  # every message the bounds pushed out
        self.missed = 0  # of those, the ones counted as viewer drops

    def __len__(self) -> int:
        return sum(len(q) for q in self._kept.values())

    def holds(self, topic: str) -> bool:
        return topic in self._kept

    def put(self, msg: OutMessage, watching: bool) -> None:
        """Keep ``msg`` (its channel has no subscriber); ``watching``: a client is subscribed to
        some channel, so a loss now is a loss to someone."""
        if len(msg.data) > self.max_bytes:
            self._evict(msg, watching)
            return
        self._order += 1
        q = self._kept.setdefault(msg.topic, deque())
        q.append((self._order, msg))
        self.bytes += len(msg.data)
        if len(q) > self.max_messages:
            self._drop_head(msg.topic, watching)
        while self.bytes > self.max_bytes:
            oldest = min(self._kept, key=lambda t: self._kept[t][0][0])
            self._drop_head(oldest, watching)

    def take(self, topic: str) -> Taken:
        """The channel got a subscriber: hand over what was kept and what was missed."""
        out = Taken()
        q = self._kept.pop(topic, None)
        if q is not None:
            out.messages = [m for _, m in q]
            self.bytes -= sum(len(m.data) for m in out.messages)
        out.missed = self._missed.pop(topic, {})
        self._subscribed_once.add(topic)
        return out

    def _drop_head(self, topic: str, watching: bool) -> None:
        q = self._kept[topic]
        _, msg = q.popleft()
        if not q:
            del self._kept[topic]
        self.bytes -= len(msg.data)
        self._evict(msg, watching)

    def _evict(self, msg: OutMessage, watching: bool) -> None:
        self.evicted += 1
        if watching and msg.kind != GAP and msg.topic not in self._subscribed_once:
            per = self._missed.setdefault(msg.topic, {})
            key = (msg.device, msg.stream)
            per[key] = per.get(key, 0) + 1
            self.missed += 1

    def status(self) -> dict[str, int]:
        return {
            "held_messages": len(self),
            "held_bytes": self.bytes,
            "held_evicted": self.evicted,
            "missed_before_subscribe": self.missed,
        }
