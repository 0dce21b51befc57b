"""Which ingest process owns which device: the supervisor's table, sans-I/O (no sockets, no
clock: ``now`` is passed in, and every decision comes back as actions for the caller to send).

Why a table: the kernel hands a reconnecting device to any process sharing the ports, but a
device's session, rings, seqs and acks must live in one process at a time, or two processes
admit the same seqs and the sink sees them interleaved. So a Hello first *claims* its device:

- no owner, the claimer already owns it, or the owner is gone: granted at once;
- another process owns it: that owner is asked to *release* it (it challenges or supersedes a
  live connection, delivers what it buffered within its release timeout, and answers with its
  delivered seqs, which the claimer starts above); a refusal refuses the claim;
- the owner does not answer within ``release_timeout``: granted anyway. The owner is hung; if
  it wakes it still pushes only frames it accepted, and the sink's per-stream dedupe keeps
  exactly-once.

One claim per device is in progress at a time; others wait in a bounded queue (beyond it:
refused as busy). Every grant takes a new epoch, so stale answers are recognised and dropped.
The table is bounded by what the processes hold: an entry leaves when its owner forgets the
device (its session ended there) or dies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_WAITING_CLAIMS = 4  # per device, behind the one in progress


@dataclass(frozen=True, slots=True)
class Grant:
    to: int  # the claiming process
    claim_id: int
    delivered: dict[str, int]
    epoch: int
    why: str  # unowned | own | owner-gone | released | owner-timeout


@dataclass(frozen=True, slots=True)
class Refuse:
    to: int
    claim_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class AskRelease:
    owner: int
    release_id: int
    device: str
    token: str
    proven: bool


Action = Grant | Refuse | AskRelease


@dataclass(slots=True)
class _Claim:
    by: int
    claim_id: int
    token: str
    proven: bool


@dataclass(slots=True)
class _Device:
    owner: int | None = None
    epoch: int = 0
    asking: _Claim | None = None  # the claim whose release is in flight
    release_id: int = 0
    deadline: float = 0.0
    waiting: deque[_Claim] = field(default_factory=deque)


class Ownership:
    def __init__(self, release_timeout: float) -> None:
        self.release_timeout = release_timeout
        self._devices: dict[str, _Device] = {}
        self._by_release: dict[int, str] = {}
        self._epoch = 0
        self._next_release = 0

    def __len__(self) -> int:
        return len(self._devices)

    def owner(self, device: str) -> int | None:
        entry = self._devices.get(device)
        return entry.owner if entry is not None else None

    def owned_by(self, index: int) -> int:
        return sum(1 for d in self._devices.values() if d.owner == index)

    def claim(
        self,
        device: str,
        by: int,
        claim_id: int,
        now: float,
        *,
        token: str = "",
        proven: bool = False,
        alive: frozenset[int] | set[int] = frozenset(),
    ) -> list[Action]:
        """A Hello for ``device`` at process ``by``. ``alive``: the processes that can answer
        (an owner not in it is gone)."""
        entry = self._devices.setdefault(device, _Device())
        request = _Claim(by, claim_id, token, proven)
        if entry.asking is not None:
            if len(entry.waiting) >= MAX_WAITING_CLAIMS:
                return [Refuse(by, claim_id, "busy: other Hellos for this device are waiting")]
            entry.waiting.append(request)
            return []
        return self._decide(device, entry, request, now, alive)

    def released(
        self, release_id: int, ok: bool, reason: str, delivered: dict[str, int], now: float
    ) -> list[Action]:
        """The owner's answer to :class:`AskRelease`."""
        device = self._by_release.pop(release_id, None)
        entry = self._devices.get(device) if device is not None else None
        if entry is None or entry.asking is None or entry.release_id != release_id:
            return []  # answered after its timeout: already decided
        claim, entry.asking = entry.asking, None
        if ok:
            actions: list[Action] = [self._grant(entry, claim, dict(delivered), "released")]
        else:
            actions = [Refuse(claim.by, claim.claim_id, reason or "taken")]
        return actions + self._next(device or "", entry, now)

    def forget(self, device: str, index: int) -> None:
        """Process ``index`` no longer holds a session for ``device``."""
        entry = self._devices.get(device)
        if entry is not None and entry.owner == index and entry.asking is None:
            del self._devices[device]

    def process_gone(
        self, index: int, now: float, alive: frozenset[int] | set[int]
    ) -> list[Action]:
        """Process ``index`` died (or retired): its devices are unowned; a release it was asked
        for is granted; claims it made are dropped (nobody waits for their answer)."""
        actions: list[Action] = []
        for device, entry in list(self._devices.items()):
            entry.waiting = deque(c for c in entry.waiting if c.by != index)
            if entry.asking is not None and entry.asking.by == index:
                self._by_release.pop(entry.release_id, None)
                entry.asking = None
                actions += self._next(device, entry, now, alive)
            elif entry.asking is not None and entry.owner == index:
                self._by_release.pop(entry.release_id, None)
                claim, entry.asking = entry.asking, None
                actions.append(self._grant(entry, claim, {}, "owner-gone"))
                actions += self._next(device, entry, now, alive)
            elif entry.owner == index:
                entry.owner = None
            if entry.owner is None and entry.asking is None and not entry.waiting:
                del self._devices[device]
        return actions

    def expire(self, now: float) -> list[Action]:
        """Releases not answered within ``release_timeout``: granted (module docstring)."""
        actions: list[Action] = []
        for device, entry in list(self._devices.items()):
            if entry.asking is not None and now >= entry.deadline:
                self._by_release.pop(entry.release_id, None)
                claim, entry.asking = entry.asking, None
                actions.append(self._grant(entry, claim, {}, "owner-timeout"))
                actions += self._next(device, entry, now)
        return actions

    def next_deadline(self) -> float | None:
        deadlines = [e.deadline for e in self._devices.values() if e.asking is not None]
        return min(deadlines) if deadlines else None

    # -- inside ------------------------------------------------------------------------------
    def _decide(
        self,
        device: str,
        entry: _Device,
        claim: _Claim,
        now: float,
        alive: frozenset[int] | set[int] | None = None,
    ) -> list[Action]:
        if entry.owner is None:
            return [self._grant(entry, claim, {}, "unowned")]
        if entry.owner == claim.by:
            return [self._grant(entry, claim, {}, "own")]
        if alive is not None and entry.owner not in alive:
            return [self._grant(entry, claim, {}, "owner-gone")]
        self._next_release += 1
        entry.asking = claim
        entry.release_id = self._next_release
        entry.deadline = now + self.release_timeout
        self._by_release[entry.release_id] = device
        return [AskRelease(entry.owner, entry.release_id, device, claim.token, claim.proven)]

    def _next(
        self,
        device: str,
        entry: _Device,
        now: float,
        alive: frozenset[int] | set[int] | None = None,
    ) -> list[Action]:
        actions: list[Action] = []
        while entry.waiting and entry.asking is None:
            actions += self._decide(device, entry, entry.waiting.popleft(), now, alive)
        return actions

    def _grant(self, entry: _Device, claim: _Claim, delivered: dict[str, int], why: str) -> Grant:
        self._epoch += 1
        entry.owner = claim.by
        entry.epoch = self._epoch
        return Grant(claim.by, claim.claim_id, delivered, self._epoch, why)
