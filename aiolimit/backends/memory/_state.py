"""What the memory backend keeps: the Redis keys of lua/, as Python objects with the same
contents and TTLs (``expires_at``, on the backend's clock, in microseconds)."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any

from ..._types import Rate, RateLimiterConfig
from ..._values import millis_up

FOREVER = float("inf")
HIGH = "\U0010ffff"  # sorts after every member
DROPS = 64  # expired entries one operation frees from a limiter, at most

Slot = str | None | tuple[str | None, int]
"""Where a budget is kept: ``Limiter.budgets[client]`` or ``Limiter.extra[(client, i)]``."""

_order = itertools.count()  # tells apart heap entries of one time (slots do not compare)


def ms(us: int) -> int:
    """A duration rounded up to whole milliseconds, as Redis keeps TTLs."""
    return millis_up(us) * 1000


@dataclass
class Config:
    """The config hash."""

    config: RateLimiterConfig
    life: str  # the life of its state, which each grant's member names (the 'gen' field)
    expires_at: float = FOREVER
    deadline: int | None = None  # set by expire(): no state may outlive it
    clock: int | None = None  # the latest time acted on (see limiter_now in lib.lua)
    blocked_until: int | None = None  # set by block(): no grant starts before it
    # The fleet's measured margin (backends/_margin.py; the fields 'margin' and 'margin_at'):
    # `config` is then `exact` with every interval widened by it; get_config answers `exact`.
    margin: int | None = None
    margin_at: int = 0
    exact: RateLimiterConfig | None = None
    # An OVERALL token bucket's or fixed windows' state: the config hash's field 'state' (it
    # has no TTL of its own and goes with the config; see counters.lua).
    state: Budget | None = None
    # A PER_CLIENT token bucket's rates epoch, and the earlier ones' (epoch, end, rates),
    # newest first: the gen ".<epoch>" and the field 'epochs' (see token_bucket.lua).
    epoch: int = 0
    epochs: list[tuple[int, int, tuple[Rate, ...]]] = field(default_factory=list)


@dataclass
class Budget:
    """The value key and permits ZSET of one budget (both share one TTL); see
    sliding_window.lua. A token bucket or fixed windows keep only numbers in it (see
    counters.lua): ``last`` and ``n``."""

    used: int = 0  # permits the log holds
    seq: int = 0  # sequence number of the last grant
    # The walk cursor: a score, the permits logged at or before it, and exactly at it.
    cs: int | None = None
    cp: int = 0
    cg: int = 0
    # (time, member, permits), ordered as a ZSET orders them: by score, then by member.
    # Entries before `head` are gone: the front is dropped lazily, so reclaiming costs O(1)
    # per grant however long the log.
    grants: list[tuple[int, str, int]] = field(default_factory=list)
    head: int = 0
    # What it keeps of the grants reclaimed from the log: [permits, latest start] (held.lua).
    held: list[list[int]] = field(default_factory=list)
    # The latest start of a grant handed back, while a later grant may take it: the log keeps
    # its sequence numbers meanwhile (sliding_log.lua).
    handed: int | None = None
    expires_at: float = FOREVER
    # TOKEN_BUCKET and FIXED_WINDOW: the latest grant's start, and per rate two numbers.
    last: int | None = None
    n: list[int] = field(default_factory=list)
    epoch: int = 0  # a PER_CLIENT token bucket's: the rates epoch that wrote it
    handbacks: int = 0  # TOKEN_BUCKET and FIXED_WINDOW: grants handed back (counters.lua)
    # FIXED_WINDOW: a sync's floor past a window's end, [rate, count, until, since] each
    # (carries.lua).
    carried: list[list[int]] = field(default_factory=list)
    # SLIDING_WINDOW: how much longer a provider's count holds the window, until when,
    # [lag, until] each (sliding_floors.lua).
    lags: list[list[int]] = field(default_factory=list)
    # SLIDING_WINDOW: the entry of a provider's last count, [permits, seq, start] (None:
    # none), which the next count replaces (sliding_floors.lua).
    excess: list[int] | None = None

    def live(self) -> list[tuple[int, str, int]]:
        return self.grants[self.head :]

    def add(self, entry: tuple[int, str, int]) -> None:
        grants = self.grants
        if len(grants) == self.head or entry >= grants[-1]:
            grants.append(entry)  # the common case: a grant after every other
        else:
            bisect.insort(grants, entry, lo=self.head)

    def drop_front(self, count: int) -> None:
        self.head += count
        if self.head * 2 > len(self.grants):
            del self.grants[: self.head]
            self.head = 0

    def clear(self) -> None:
        self.grants, self.head, self.cs = [], 0, None

    def rank_after(self, score: int) -> int:
        """The index of the first entry scored after ``score`` (ZCOUNT -inf score)."""
        return bisect.bisect_right(self.grants, (score, HIGH, 0), lo=self.head)

    def moved(self, score: int, permits: int) -> None:
        """Keeps the cursor right when ``permits`` are added (negative: removed) at ``score``."""
        if self.cs is not None and score <= self.cs:
            self.cp += permits
            if score == self.cs:
                self.cg += permits


@dataclass
class Limiter:
    """Every key of one limiter."""

    config: Config | None = None
    budgets: dict[str | None, Budget] = field(default_factory=dict)  # None: OVERALL
    # A sliding window's other rates: (client or None, rate number from 2) -> its log.
    extra: dict[tuple[str | None, int], Budget] = field(default_factory=dict)
    registry: dict[str, int] = field(default_factory=dict)  # PER_CLIENT client -> last grant
    registry_expires_at: float = FOREVER
    # When each budget expires (time, n, slot), and each registry entry's latest grant (time,
    # n, client): heaps read lazily (an entry whose budget or client has since moved on, or
    # gone, is skipped), so freeing what has expired costs O(log n) per write and at most
    # DROPS entries per operation, whatever the number of clients. Each holds at most twice
    # its live entries, plus a few.
    expiries: list[tuple[float, int, Slot]] = field(default_factory=list)
    registered: list[tuple[int, int, str]] = field(default_factory=list)

    def store(self, slot: Slot, budget: Budget) -> None:
        """Keeps ``budget`` at ``slot`` until its ``expires_at``."""
        if isinstance(slot, tuple):
            self.extra[slot] = budget
        else:
            self.budgets[slot] = budget
        heappush(self.expiries, (budget.expires_at, next(_order), slot))
        if len(self.expiries) > 2 * (len(self.budgets) + len(self.extra)) + 64:
            live: list[tuple[float, int, Slot]] = [
                (b.expires_at, next(_order), s) for s, b in self.budgets.items()
            ]
            live += [(b.expires_at, next(_order), s) for s, b in self.extra.items()]
            heapify(live)
            self.expiries = live

    def unstore(self, slot: Slot) -> None:
        (self.extra if isinstance(slot, tuple) else self.budgets).pop(slot, None)  # type: ignore[arg-type]

    def live(self, slot: Slot, now: int) -> Budget | None:
        """The budget at ``slot`` unless it has expired at ``now`` (then it is dropped)."""
        where: dict[Any, Budget] = self.extra if isinstance(slot, tuple) else self.budgets
        budget = where.get(slot)
        if budget is not None and budget.expires_at <= now:
            del where[slot]
            return None
        return budget

    def drop_expired(self, now: int) -> None:
        """Frees at most DROPS budgets that have expired at ``now`` (the others are dropped
        by later operations, or when looked up: ``live``)."""
        heap = self.expiries
        for _ in range(DROPS):
            if not heap or heap[0][0] > now:
                break
            self.live(heappop(heap)[2], now)
        if not heap and (self.budgets or self.extra):
            self.expiries = []  # (a heap never shrinks its list: give it back)

    def register(self, client: str, start: int) -> None:
        """The client's latest grant starts at ``start`` (if later than the one noted)."""
        if self.registry.get(client, start - 1) < start:
            self.registry[client] = start
            heappush(self.registered, (start, next(_order), client))
            if len(self.registered) > 2 * len(self.registry) + 64:
                clients = [(t, next(_order), c) for c, t in self.registry.items()]
                heapify(clients)
                self.registered = clients

    def unregister_before(self, time: int) -> None:
        """Forgets at most DROPS clients whose latest grant started at ``time`` or before."""
        heap = self.registered
        for _ in range(DROPS):
            if not heap or heap[0][0] > time:
                break
            start, _, client = heappop(heap)
            if self.registry.get(client) == start:
                del self.registry[client]

    def forget_clients(self) -> None:
        self.budgets.clear()
        self.extra.clear()
        self.registry.clear()
        self.expiries, self.registered = [], []
        self.registry_expires_at = FOREVER  # the registry key is gone with them
