"""The store that a memory backend and its ``with_client`` views share: the limiters, and the
sweep that frees what has expired without waiting for the limiter to be touched again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from ._learn import LearnTable
from ._leases import LeaseTable
from ._state import FOREVER, Limiter

SWEEP = 8  # heap entries the sweep pops per operation, at most


@dataclass(eq=False)
class Store:
    """The limiters by name, and when to look at each again.

    ``heap`` holds ``(time, name)``: look at the limiter again at that time (when a part of
    it expires). ``due[name]`` is the time of the name's live entry; an entry at another time
    (superseded, or its limiter dropped) is skipped. A limiter gets a new entry only when its
    next expiry comes before its live one (a grant that slides an expiry forward pushes
    nothing): the sweep looks at it then and pushes its next expiry, if it still lives. Names
    in ``due`` are in ``limiters``, and the heap never holds more than twice as many entries
    as ``due`` (plus a few), so the schedule is bounded by the live limiters.
    """

    limiters: dict[str, Limiter] = field(default_factory=dict)
    heap: list[tuple[float, str]] = field(default_factory=list)
    due: dict[str, float] = field(default_factory=dict)
    # The last operation's limiter: the next operation schedules its new expiry (operations
    # are synchronous, and only operations sweep, so nothing is due in between).
    touched_name: str | None = None
    touched: Limiter | None = None
    # Grants handed back that a second hand-back could still take something from (the
    # receipts ZSET of release.lua): (name, "<member>[ <client>]") -> until when. Like it,
    # they outlive a deleted limiter.
    receipts: dict[tuple[str, str], int] = field(default_factory=dict)
    receipts_kept: int = 0  # how many the last pruning left
    leases: LeaseTable = field(default_factory=LeaseTable)  # the concurrency limiters
    learning: LearnTable = field(default_factory=LearnTable)  # the learned rates
    # Who is told of refunds (watch_refunds), by limiter name: (client id, what to call),
    # the twin of a limiter's refund channel (settle.lua).
    refund_watchers: dict[str, dict[object, tuple[str, Callable[[int], None]]]] = field(
        default_factory=dict
    )

    def watch_refunds(
        self, name: str, client: str, heard: Callable[[int], None]
    ) -> Callable[[], None]:
        """``heard(permits)`` on each refund of ``name`` by a client other than ``client``,
        until the function returned is called."""
        token = object()
        self.refund_watchers.setdefault(name, {})[token] = (client, heard)

        def stop() -> None:
            watchers = self.refund_watchers.get(name, {})
            watchers.pop(token, None)
            if not watchers:
                self.refund_watchers.pop(name, None)

        return stop

    def refunded(self, name: str, client: str, permits: int) -> None:
        """``client`` handed back ``permits`` of ``name``: its watchers elsewhere are told
        (those of ``client`` itself heard it in its reply)."""
        for owner, heard in list(self.refund_watchers.get(name, {}).values()):
            if owner != client:
                heard(permits)

    def remember(self, receipt: tuple[str, str], until: int, now: int) -> None:
        """Keeps a receipt until ``until``; drops the expired ones once the dict has doubled
        since it last did (O(1) amortised, and never more than twice what still counts)."""
        self.receipts[receipt] = until
        if len(self.receipts) > 2 * self.receipts_kept + 16:
            self.receipts = {r: t for r, t in self.receipts.items() if t > now}
            self.receipts_kept = len(self.receipts)

    def limiter(self, name: str, now: int) -> Limiter | None:
        """The limiter's keys as they stand at ``now``: expired ones are gone; None when
        nothing is left. Every operation calls this (or ``create``) once, first: it sweeps."""
        self.sweep(name, now)
        limiter = self.limiters.get(name)
        if limiter is None:
            return None
        if purge(limiter, now):
            self.drop(name)
            return None
        self.touched_name, self.touched = name, limiter
        return limiter

    def create(self, name: str) -> Limiter:
        """A new, empty limiter (only writes create one)."""
        limiter = self.limiters[name] = Limiter()
        self.touched_name, self.touched = name, limiter
        return limiter

    def drop(self, name: str) -> None:
        del self.limiters[name]
        if not self.limiters:
            self.limiters = {}  # a dict never shrinks: give its table back
        if name in self.due:
            self._undue(name)

    def _undue(self, name: str) -> None:
        del self.due[name]
        if not self.due:
            self.due = {}
            self.heap = []  # every entry left is superseded

    def sweep(self, name: str, now: int) -> None:
        """Schedules the last operation's limiter, then frees what has expired among at most
        ``SWEEP`` heap entries that are due: a bounded amount of work per operation."""
        touched, self.touched = self.touched, None
        if touched is not None and self.touched_name != name:
            touched_name = self.touched_name
            assert touched_name is not None
            if self.limiters.get(touched_name) is touched:
                self._check(touched_name, touched, now)
        for _ in range(SWEEP):
            heap = self.heap
            if not heap or heap[0][0] > now:
                break
            at, due_name = heappop(heap)
            if self.due.get(due_name) != at:
                continue  # superseded by an earlier entry, or the limiter was dropped
            self._undue(due_name)
            limiter = self.limiters.get(due_name)
            if limiter is not None:  # always, as drop forgets the name's entry
                self._check(due_name, limiter, now)

    def _check(self, name: str, limiter: Limiter, now: int) -> None:
        """Frees the limiter's expired keys, drops it when nothing is left, and makes sure
        the sweep comes back when its next key expires."""
        if purge(limiter, now):
            self.drop(name)
            return
        at = next_expiry(limiter)
        if at < self.due.get(name, FOREVER):
            heappush(self.heap, (at, name))
            self.due[name] = at
            if len(self.heap) > 2 * len(self.due) + 64:
                # Superseded entries piled up (limiters deleted, or expiries that kept moving
                # earlier): keep the live ones. O(heap), but at least half the heap goes, so
                # amortised over the pushes that made it O(1) each.
                live = [(t, n) for t, n in self.heap if self.due.get(n) == t]
                heapify(live)
                self.heap = live


def purge(limiter: Limiter, now: int) -> bool:
    """Removes the limiter's keys that have expired at ``now`` (budgets: a bounded number,
    see ``Limiter.drop_expired``); True: nothing is left."""
    if limiter.config is not None and limiter.config.expires_at <= now:
        limiter.config = None
    if limiter.expiries:
        limiter.drop_expired(now)
    if limiter.registry_expires_at <= now:
        limiter.registry.clear()
        limiter.registered = []
        limiter.registry_expires_at = FOREVER
    return (
        limiter.config is None
        and not limiter.budgets
        and not limiter.registry
        and not limiter.extra
    )


def next_expiry(limiter: Limiter) -> float:
    """When the first of the limiter's keys expires (``FOREVER``: none does), or a little
    earlier (an entry of ``expiries`` may be out of date): the sweep then looks again."""
    at = FOREVER if limiter.config is None else limiter.config.expires_at
    if limiter.registry and limiter.registry_expires_at < at:
        at = limiter.registry_expires_at
    if limiter.expiries and limiter.expiries[0][0] < at:
        at = limiter.expiries[0][0]
    return at
