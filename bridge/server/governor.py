"""The memory governor (sans-I/O): one data budget that every byte held for data is charged to.

Why one budget: buffers that each follow their own bound (a WebSocket queue in messages, a
subscriber queue in frames, a ring floored at one frame per stream) add up to many times the
memory limit. Here every holder asks one ledger first, so the sum is bounded by construction.

    budget          = memory limit - measured baseline - headroom   (see resources/plan.py)
    admission limit = budget - reserve

Three ways to charge, by what waiting would mean for the caller:

- :meth:`Governor.request`: *admission* (transport receive, which becomes ring data). Waits,
  first come first served, until ``admitted + n <= admission limit`` and the whole budget has
  room. Waiting here is how the bridge stops reading a connection. A request that fits while
  older, larger ones wait may pass them, but each waiter lets at most its own size pass it
  (:meth:`Waiter.may_pass`): one connection waiting for a 188 MiB decode grant no longer holds
  every other edge's 240 KB frames behind it (issue 29: 2.7-3.5 s stalls), and it still waits at
  most as long as if one more request of its own size had arrived first. A request that can
  never fit the limit is refused at once (and waiters that no longer fit after a shrink are
  refused), so nobody blocks the queue forever.
- :meth:`Governor.try_charge`: optional data (subscriber queues). Takes room up to the whole
  budget, reserve included, or returns ``None``; the caller then skips the data (a subscriber
  gets a ``slow_subscriber`` gap). Never waits, never overdraws. With ``pinned=True`` (sessions,
  attached or detached: long-lived) the charge comes out of the admission limit instead, so the
  rings' fair shares and the largest admissible frame shrink as sessions grow.
- :meth:`Governor.force`: forward progress (decimation input/output/scratch, egress pushes in
  flight). Must never wait: the bytes that would free the budget flow through it. It draws on
  the reserve; its callers bound how much can be in flight (workers x depth, one push at a
  time), and going past the whole budget is counted as an overdraft, never hidden.

A :class:`Charge` is a move-only token for its bytes. It is released exactly once: a second
release raises :class:`DoubleRelease` (and is counted). Ownership moves with
:meth:`Charge.transfer`, which returns a new handle and marks the old one moved (any use of a
moved handle raises :class:`MovedCharge`); ``with charge:`` releases it on every path unless it
was transferred (or released) inside the block. Charges carry an ``owner`` tag (an edge
connection, ``None`` for the bridge's own holders); in debug mode (``debug=True`` or
``SIMBRIDGE_CHARGE_DEBUG=1``, on in tests) the governor tracks live charges per owner, and
:meth:`Governor.end_owner` reports those an owner left behind (a leak) at the end of its
connection, as :meth:`Governor.check_all_released` does for the whole ledger when a bridge
closes. :attr:`Governor.live_charges` lets tests prove nothing leaked.
Grant callbacks run synchronously inside the call that freed room: they must only record the
grant (e.g. resolve a future), never call back into the governor.
"""

from __future__ import annotations

import enum
import logging
import os
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from types import TracebackType

log = logging.getLogger("bridge.server.governor")

#: Debug mode's default for new governors: live charges tracked per owner, leaks reported.
DEBUG_ENV = "SIMBRIDGE_CHARGE_DEBUG"
#: Every leak a debug-mode governor reported in this process (tests assert it stays empty).
LEAKS: list[str] = []
_KEEP: object = object()  # transfer(): the new handle keeps the old one's owner


class Component(enum.Enum):
    """Who holds the bytes (the ``component`` label of ``bridge_memory_charged_bytes``)."""

    TRANSPORT = "transport"  # received (or granted to be received), not yet in a ring
    RING = "ring"  # accepted frames and processed results until the sink acknowledges them
    DECIMATION = "decimation"  # worker input copies, output and scratch while processing
    EGRESS = "egress"  # serialized pushes in flight to the sink
    SUBSCRIBERS = "subscribers"  # shared frame buffers queued for viewers
    SESSIONS = "sessions"  # state of attached and detached sessions

    # Members are singletons: hash by identity, in C. Enum's own __hash__ is a Python call,
    # and the governor looks a component up several times per frame.
    __hash__ = object.__hash__


class Tier(enum.Enum):
    ADMISSION = "admission"  # counted against the admission limit
    PINNED = "pinned"  # long-lived, also against the admission limit (try_charge(pinned=True))
    OPTIONAL = "optional"  # try_charge: anywhere in the budget
    PROGRESS = "progress"  # force: may use the reserve, overdraft counted


# Module constants for the per-charge hot path: an Enum member lookup costs ~4x a global's.
_ADMISSION, _PINNED = Tier.ADMISSION, Tier.PINNED


class DoubleRelease(AssertionError):
    """A charge was released twice: an accounting bug, never ignored."""


class MovedCharge(DoubleRelease):
    """A handle was used after :meth:`Charge.transfer` moved its bytes to a new one (releasing
    it would release them twice: counted as a double release)."""


@dataclass(eq=False, slots=True)
class Charge:
    """Bytes held for data, charged to one component until :meth:`release`: a move-only token.

    ``released`` is true once this handle holds nothing (released, merged away or moved);
    ``moved`` says :meth:`transfer` moved it. ``with charge:`` releases a live handle on exit and
    leaves one released or transferred inside the block alone (only there is release
    idempotent); a callee handed a charge inside the block may release or transfer it."""

    governor: Governor
    component: Component
    nbytes: int
    tier: Tier
    released: bool = False
    owner: object = None  # who must release or transfer it (an edge connection; None: bridge)
    moved: bool = False

    def release(self) -> None:
        self.governor._release(self)

    def transfer(self, owner: object = _KEEP, component: Component | None = None) -> Charge:
        """A new handle owning these bytes (for ``owner``, default the same; moved to
        ``component`` if given); this one is moved: any further use of it raises."""
        return self.governor._transfer(self, owner, component)

    def adopt(self, owner: object) -> Charge:
        """These bytes now belong to ``owner`` (a transport hands a message to its connection):
        in debug mode a :meth:`transfer` (the ledger re-tagged, this handle moved); otherwise
        this handle, re-tagged in place (no ledger to update, nothing allocated per message)."""
        if self.governor._owned is not None or self.released:
            return self.governor._transfer(self, owner, None)
        self.owner = owner
        return self

    def __enter__(self) -> Charge:
        if self.released:
            self.governor._spent(self, "with")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.released:
            self.governor._release(self)

    def resize(self, nbytes: int) -> None:
        """The holder now keeps ``nbytes`` (a frame replaced by its smaller processed result).
        Growing never waits: it is forced (callers grow only by small, bounded amounts)."""
        self.governor._resize(self, nbytes)

    def move(self, component: Component) -> None:
        """Hand the same bytes to another holder (a received frame enters its ring)."""
        self.governor._move(self, component)

    def split(self, nbytes: int) -> Charge:
        """Carve ``nbytes`` out of this charge into a new one of the same kind (a connection's
        granted bytes become one message's charge); totals do not change."""
        return self.governor._split(self, nbytes)

    def merge(self, other: Charge) -> None:
        """Take over ``other``'s bytes (same component and tier); ``other`` is spent."""
        self.governor._merge(self, other)


@dataclass(eq=False, slots=True)
class Waiter:
    """A pending admission request; ``on_grant`` gets the charge, or ``None`` when refused."""

    component: Component
    nbytes: int
    on_grant: Callable[[Charge | None], None]
    done: bool = False
    owner: object = None  # the granted charge's
    passed_bytes: int = 0  # granted to younger requests while this one waited

    def may_pass(self, nbytes: int) -> bool:
        """Whether a younger request of ``nbytes`` may be granted before this one: bounded by
        this request's own size, so passing can delay it, never starve it."""
        return self.passed_bytes + nbytes <= self.nbytes


@dataclass(slots=True)
class GovernorStats:
    granted: int = 0  # admission requests granted (at once or after waiting)
    waited: int = 0  # ... of which had to wait
    refused: int = 0  # requests that could never fit (at once or after a shrink)
    optional_refused: int = 0  # try_charge found no room
    double_releases: int = 0
    leaked_charges: int = 0  # reported by end_owner / check_all_released (debug mode)
    overdraft_peak_bytes: int = 0  # highest total - budget seen (forced charges only)
    by_component: dict[Component, int] = field(default_factory=lambda: dict.fromkeys(Component, 0))


class Governor:
    """The ledger. Not thread-safe: call it from the event loop only."""

    def __init__(
        self, budget_bytes: int, reserve_bytes: int = 0, *, debug: bool | None = None
    ) -> None:
        if debug is None:
            debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
        # Debug mode: owner -> its live charges (insertion-ordered set), else None (no cost).
        self._owned: dict[object, dict[Charge, None]] | None = {} if debug else None
        self.leaks: list[str] = []  # what end_owner / check_all_released reported
        self.budget_bytes = 0
        self.reserve_bytes = 0
        self.total_bytes = 0  # every live charge
        self.admitted_bytes = 0  # live charges of the admission and pinned tiers
        self.pinned_bytes = 0  # live charges of the pinned tier
        self.live_charges = 0
        self.stats = GovernorStats()
        self._waiters: deque[Waiter] = deque()
        self.set_budget(budget_bytes, reserve_bytes)

    # -- limits -------------------------------------------------------------------------------
    @property
    def admission_limit(self) -> int:
        return self.budget_bytes - self.reserve_bytes

    @property
    def admissible_bytes(self) -> int:
        """The most one request can ever be granted now: the admission limit less what
        long-lived (pinned) charges hold."""
        return max(0, self.admission_limit - self.pinned_bytes)

    def fair_share(self, streams: int) -> int:
        """Each stream's share of what admission may hold (no floor: a larger frame borrows)."""
        return self.admissible_bytes // max(1, streams)

    def never_fits(self, nbytes: int) -> bool:
        """True when a request of ``nbytes`` cannot be granted at the current budget (asked
        once per frame: :attr:`admissible_bytes` without its two property calls)."""
        room = self.budget_bytes - self.reserve_bytes - self.pinned_bytes
        return nbytes > (room if room > 0 else 0)

    def set_budget(self, budget_bytes: int, reserve_bytes: int = 0) -> None:
        """Change the budget live. A fall takes effect at once for new grants; what is already
        held drains as its holders release it. Waiters that can no longer fit are refused."""
        if budget_bytes < 0 or not 0 <= reserve_bytes <= budget_bytes:
            raise ValueError(f"need 0 <= reserve ({reserve_bytes}) <= budget ({budget_bytes})")
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self._refuse_unfittable()
        self._pump()

    def _refuse_unfittable(self) -> None:
        refused = [w for w in self._waiters if self.never_fits(w.nbytes)]
        for waiter in refused:
            self._waiters.remove(waiter)
            self._finish(waiter, None)
        if refused:
            self._pump()  # a refused head may have been blocking requests that fit

    # -- charging -----------------------------------------------------------------------------
    def request(
        self,
        component: Component,
        nbytes: int,
        on_grant: Callable[[Charge | None], None],
        owner: object = None,
    ) -> Charge | Waiter | None:
        """Admission: a charge now, a :class:`Waiter` (granted later, in arrival order except
        where it may pass older ones: :meth:`Waiter.may_pass`), or ``None`` when
        ``nbytes`` can never fit the admission limit (the caller reports a clear error)."""
        _check_size(nbytes)
        if self.never_fits(nbytes):
            self.stats.refused += 1
            return None
        if self._room_for(nbytes) and all(w.may_pass(nbytes) for w in self._waiters):
            self._passed(len(self._waiters), nbytes)
            self.stats.granted += 1
            return self._new(component, nbytes, Tier.ADMISSION, owner)
        waiter = Waiter(component, nbytes, on_grant, owner=owner)
        self._waiters.append(waiter)
        self.stats.waited += 1
        return waiter

    def cancel(self, waiter: Waiter) -> None:
        """Withdraw a request (its connection closed). A granted one must be released instead."""
        if waiter.done:
            return
        waiter.done = True
        self._waiters.remove(waiter)
        self._pump()  # the head may have been blocking smaller requests behind it

    def try_charge(
        self, component: Component, nbytes: int, *, pinned: bool = False, owner: object = None
    ) -> Charge | None:
        """Optional data: a charge if the whole budget has room, else ``None``. ``pinned``:
        long-lived, charged against the admission limit; refused only when pinned charges
        alone would exceed it (grants that can then never fit are refused)."""
        _check_size(nbytes)
        if pinned:
            # Only pinned charges compete with each other: a new session is welcome (and can be
            # paused) even while frames fill admission; it takes its room from what drains next.
            room = self.pinned_bytes + nbytes <= self.admission_limit
        else:
            room = self.total_bytes + nbytes <= self.budget_bytes
        if not room:
            self.stats.optional_refused += 1
            return None
        charge = self._new(component, nbytes, Tier.PINNED if pinned else Tier.OPTIONAL, owner)
        if pinned:
            self._refuse_unfittable()
        return charge

    def force(self, component: Component, nbytes: int, owner: object = None) -> Charge:
        """Forward progress: always charged; going past the budget is counted as overdraft."""
        _check_size(nbytes)
        return self._new(component, nbytes, Tier.PROGRESS, owner)

    # -- ownership checks (debug mode) --------------------------------------------------------
    @property
    def debug(self) -> bool:
        return self._owned is not None

    def live_of(self, owner: object) -> list[Charge]:
        """``owner``'s live charges (debug mode; always empty otherwise)."""
        owned = self._owned
        return [] if owned is None else list(owned.get(owner, ()))

    def end_owner(self, owner: object, what: str = "connection") -> list[Charge]:
        """``owner`` (a connection) ended: every charge it was given must have been released
        or transferred. Reports (and returns) those it left behind, in debug mode; the
        charges themselves stay as they are (a leak is reported, never hidden)."""
        owned = self._owned
        if owned is None:
            return []
        left = list(owned.get(owner, ()))
        if left:
            self._leaked(f"{what} {owner!r} ended holding {_listed(left)}", len(left))
        return left

    def check_all_released(
        self, what: str = "bridge closed", standing: Collection[Charge | None] = ()
    ) -> bool:
        """The whole ledger is empty (a bridge closed): ``live_charges == 0`` but for the
        ``standing`` charges its owner keeps for the life of the process (the decimation
        kernel's scratch). A leak is reported (debug mode: with what each holder kept) and
        False returned."""
        kept = sum(1 for c in standing if c is not None and not c.released)
        if self.live_charges == kept:
            return True
        held = [c for cs in (self._owned or {}).values() for c in cs if c not in standing]
        live = self.live_charges - kept
        self._leaked(f"{what} with {live} live charges: {_listed(held)}", 0)
        return False

    # -- inspection ---------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def waiting_bytes(self) -> int:
        return sum(w.nbytes for w in self._waiters)

    def charged(self, component: Component) -> int:
        return self.stats.by_component[component]

    @property
    def over_admission(self) -> bool:
        """Admission is paused: what is admitted already reaches the limit (or waiters queue)."""
        return bool(self._waiters) or not self._room_for(1)

    def describe(self) -> dict[str, object]:
        return {
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            "admission_limit_bytes": self.admission_limit,
            "charged_bytes": self.total_bytes,
            "admitted_bytes": self.admitted_bytes,
            "pinned_bytes": self.pinned_bytes,
            "charged_by_component": {c.value: n for c, n in self.stats.by_component.items()},
            "grants_waiting": self.waiting,
            "grants_waiting_bytes": self.waiting_bytes,
            "live_charges": self.live_charges,
            "overdraft_peak_bytes": self.stats.overdraft_peak_bytes,
            "refused": self.stats.refused,
            "double_releases": self.stats.double_releases,
            "leaked_charges": self.stats.leaked_charges,
        }

    # -- internals ----------------------------------------------------------------------------
    def _room_for(self, nbytes: int) -> bool:
        """Admission needs room under its limit *and* in the whole budget (optional and forced
        charges may be using part of the admission share)."""
        return (
            self.admitted_bytes + nbytes <= self.admission_limit
            and self.total_bytes + nbytes <= self.budget_bytes
        )

    def _new(self, component: Component, nbytes: int, tier: Tier, owner: object = None) -> Charge:
        charge = Charge(self, component, nbytes, tier, False, owner)
        self._add(charge, nbytes)
        self.live_charges += 1
        if self._owned is not None:
            self._own(charge)
        return charge

    def _grant(self, waiter: Waiter) -> Charge:
        return self._new(waiter.component, waiter.nbytes, Tier.ADMISSION, waiter.owner)

    def _own(self, charge: Charge) -> None:
        assert self._owned is not None
        self._owned.setdefault(charge.owner, {})[charge] = None

    def _disown(self, charge: Charge) -> None:
        assert self._owned is not None
        mine = self._owned.get(charge.owner)
        if mine is not None:
            mine.pop(charge, None)
            if not mine:
                del self._owned[charge.owner]

    def _spent(self, charge: Charge, use: str) -> None:
        """``charge`` holds nothing: using it raises (a release is counted as a double one)."""
        if use == "release":
            self.stats.double_releases += 1
        what = f"{use} of a {charge.component.value} charge of {charge.nbytes} B"
        if charge.moved:
            raise MovedCharge(f"{what} that was transferred")
        raise DoubleRelease(f"{what} that was released")

    def _leaked(self, message: str, count: int) -> None:
        self.stats.leaked_charges += count
        self.leaks.append(message)
        LEAKS.append(message)
        log.error("charge leak: %s", message)

    def _transfer(self, charge: Charge, owner: object, component: Component | None) -> Charge:
        if charge.released:
            self._spent(charge, "transfer")
        nbytes = charge.nbytes
        if component is None or component is charge.component:
            component = charge.component
        else:  # the same bytes, another holder (a received frame enters its ring)
            by_component = self.stats.by_component
            by_component[charge.component] -= nbytes
            by_component[component] += nbytes
        new = Charge(
            self, component, nbytes, charge.tier, False, charge.owner if owner is _KEEP else owner
        )
        charge.released = charge.moved = True
        if self._owned is not None:
            self._disown(charge)
            self._own(new)
        return new

    def _add(self, charge: Charge, delta: int) -> None:
        self.total_bytes += delta
        self.stats.by_component[charge.component] += delta
        tier = charge.tier
        if tier is _ADMISSION or tier is _PINNED:
            self.admitted_bytes += delta
            if tier is _PINNED:
                self.pinned_bytes += delta
        over = self.total_bytes - self.budget_bytes
        if over > self.stats.overdraft_peak_bytes:
            self.stats.overdraft_peak_bytes = over

    def _release(self, charge: Charge) -> None:
        if charge.released:
            self._spent(charge, "release")
        charge.released = True
        self._add(charge, -charge.nbytes)
        self.live_charges -= 1
        if self._owned is not None:
            self._disown(charge)
        if self._waiters:
            self._pump()

    def _resize(self, charge: Charge, nbytes: int) -> None:
        if nbytes < 0:
            _check_size(nbytes)
        if charge.released:
            self._spent(charge, "resize")
        delta = nbytes - charge.nbytes
        charge.nbytes = nbytes
        self._add(charge, delta)
        if delta < 0 and self._waiters:
            self._pump()

    def _move(self, charge: Charge, component: Component) -> None:
        if charge.released:
            self._spent(charge, "move")
        self.stats.by_component[charge.component] -= charge.nbytes
        self.stats.by_component[component] += charge.nbytes
        charge.component = component

    def _split(self, charge: Charge, nbytes: int) -> Charge:
        if charge.released:
            self._spent(charge, "split")
        if not 0 <= nbytes <= charge.nbytes:
            raise ValueError(f"cannot split {nbytes} B out of a {charge.nbytes} B charge")
        charge.nbytes -= nbytes
        self.live_charges += 1
        part = Charge(self, charge.component, nbytes, charge.tier, False, charge.owner)
        if self._owned is not None:
            self._own(part)
        return part

    def _merge(self, charge: Charge, other: Charge) -> None:
        if charge.released or other.released:
            self._spent(other if other.released else charge, "merge")
        if (charge.component, charge.tier) != (other.component, other.tier):
            raise ValueError("only charges of the same component and tier merge")
        charge.nbytes += other.nbytes
        other.nbytes = 0
        other.released = True
        self.live_charges -= 1
        if self._owned is not None:
            self._disown(other)

    def _pump(self) -> None:
        """Grant waiters in arrival order while the head fits; then younger waiters that fit
        and that every older waiter still lets pass (:meth:`Waiter.may_pass`)."""
        while self._waiters:
            head = self._waiters[0]
            if not self._room_for(head.nbytes):
                break
            self._waiters.popleft()
            self.stats.granted += 1
            self._finish(head, self._grant(head))
        if len(self._waiters) < 2:
            return
        allowance = self._waiters[0].nbytes - self._waiters[0].passed_bytes
        index = 1
        while index < len(self._waiters):
            waiter = self._waiters[index]
            if waiter.nbytes <= allowance and self._room_for(waiter.nbytes):
                del self._waiters[index]
                self._passed(index, waiter.nbytes)
                allowance -= waiter.nbytes
                self.stats.granted += 1
                self._finish(waiter, self._grant(waiter))
                continue
            allowance = min(allowance, waiter.nbytes - waiter.passed_bytes)
            index += 1

    def _passed(self, older: int, nbytes: int) -> None:
        """``nbytes`` were granted past the ``older`` first waiters."""
        for index in range(older):
            self._waiters[index].passed_bytes += nbytes

    def _finish(self, waiter: Waiter, charge: Charge | None) -> None:
        waiter.done = True
        if charge is None:
            self.stats.refused += 1
        waiter.on_grant(charge)


def _check_size(nbytes: int) -> None:
    if nbytes < 0:
        raise ValueError(f"a charge cannot be negative ({nbytes})")


def _listed(charges: list[Charge]) -> str:
    shown = ", ".join(f"{c.component.value} {c.nbytes} B" for c in charges[:8])
    more = f" and {len(charges) - 8} more" if len(charges) > 8 else ""
    return f"{len(charges)} charge(s): {shown}{more}" if charges else "(owners not tracked)"
