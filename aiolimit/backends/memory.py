"""The in-process backend: the Lua scripts' algorithm, step for step, in Python."""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any

from .._types import Algorithm, Rate, RateLimiterConfig, RateType, clock_micros
from ..errors import BackendError, InvalidArgumentError, NotConfiguredError
from ._protocol import MAX_EXACT as _MAX_EXACT
from ._protocol import RECLAIM_STEPS as _RECLAIM_STEPS
from ._protocol import WALK_STEPS as _WALK_STEPS
from ._protocol import format_member, parse_member, state_in_config
from .base import Backend, Grant, Refusal, SetMode

__all__ = ["MemoryBackend"]

_FOREVER = float("inf")
_SWEEP = 8  # heap entries the sweep pops per operation, at most
_HIGH = "\U0010ffff"  # sorts after every member


@dataclass
class _Config:
    config: RateLimiterConfig
    expires_at: float = _FOREVER
    deadline: int | None = None  # set by expire(): no state may outlive it
    clock: int | None = None  # the latest time acted on (see limiter_now in lib.lua)
    blocked_until: int | None = None  # set by block(): no grant starts before it
    # An OVERALL token bucket's or fixed windows' state: the config hash's field 'state' (it
    # has no TTL of its own and goes with the config; see lib.lua, "groups").
    state: _Budget | None = None


@dataclass
class _Budget:
    """The value key and permits ZSET of one budget (both share one TTL); see lib.lua. (An
    OVERALL token bucket's or fixed windows' state is a field of the config: ``_Config.state``,
    whose ``expires_at`` means nothing.)"""

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
    expires_at: float = _FOREVER
    # TOKEN_BUCKET and FIXED_WINDOW keep only numbers (see lib.lua, "groups"): the latest
    # grant's start, and per rate a bucket's full time, or a window and its count.
    last: int | None = None
    n: list[int] = field(default_factory=list)

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
        return bisect.bisect_right(self.grants, (score, _HIGH, 0), lo=self.head)

    def moved(self, score: int, permits: int) -> None:
        """Keeps the cursor right when ``permits`` are added (negative: removed) at ``score``."""
        if self.cs is not None and score <= self.cs:
            self.cp += permits
            if score == self.cs:
                self.cg += permits


@dataclass
class _Limiter:
    config: _Config | None = None
    budgets: dict[str | None, _Budget] = field(default_factory=dict)  # None: OVERALL
    # A sliding window's other rates: (client or None, rate number from 2) -> its log.
    extra: dict[tuple[str | None, int], _Budget] = field(default_factory=dict)
    registry: dict[str, int] = field(default_factory=dict)  # PER_CLIENT client -> last grant
    registry_expires_at: float = _FOREVER


@dataclass(eq=False)
class _Shared:
    """The store that ``with_client`` views share: the limiters, and the sweep that frees
    what has expired without waiting for the limiter to be touched again.

    ``heap`` holds ``(time, name)``: look at the limiter again at that time (when a part of
    it expires). ``due[name]`` is the time of the name's live entry; an entry at another time
    (superseded, or its limiter dropped) is skipped. A limiter gets a new entry only when its
    next expiry comes before its live one (a grant that slides an expiry forward pushes
    nothing): the sweep looks at it then and pushes its next expiry, if it still lives. Names
    in ``due`` are in ``limiters``, and the heap never holds more than twice as many entries
    as ``due`` (plus a few), so the schedule is bounded by the live limiters.
    """

    limiters: dict[str, _Limiter] = field(default_factory=dict)
    heap: list[tuple[float, str]] = field(default_factory=list)
    due: dict[str, float] = field(default_factory=dict)
    # The last operation's limiter: the next operation schedules its new expiry (operations
    # are synchronous, and only operations sweep, so nothing is due in between).
    touched_name: str | None = None
    touched: _Limiter | None = None


def _purge(limiter: _Limiter, now: int) -> bool:
    """Removes the limiter's keys that have expired at ``now``; True: nothing is left."""
    if limiter.config is not None and limiter.config.expires_at <= now:
        limiter.config = None
    budgets = limiter.budgets
    if budgets:
        for client in [c for c, b in budgets.items() if b.expires_at <= now]:
            del budgets[client]
    if limiter.extra:
        for key in [k for k, b in limiter.extra.items() if b.expires_at <= now]:
            del limiter.extra[key]
    if limiter.registry_expires_at <= now:
        limiter.registry.clear()
        limiter.registry_expires_at = _FOREVER
    return limiter.config is None and not budgets and not limiter.registry and not limiter.extra


def _next_expiry(limiter: _Limiter) -> float:
    """When the first of the limiter's keys expires (``_FOREVER``: none does)."""
    at = _FOREVER if limiter.config is None else limiter.config.expires_at
    if limiter.registry and limiter.registry_expires_at < at:
        at = limiter.registry_expires_at
    for budget in limiter.budgets.values():
        if budget.expires_at < at:
            at = budget.expires_at
    for budget in limiter.extra.values():
        if budget.expires_at < at:
            at = budget.expires_at
    return at


def _loop_clock() -> float:
    return asyncio.get_running_loop().time()


class MemoryBackend(Backend):
    """Limiter state in this process's memory, with the same semantics as ``RedisBackend``.

    >>> backend = MemoryBackend()
    >>> limiter = RateLimiter("emails", backend)

    ``clock`` returns seconds; by default the running event loop's clock, so grants and
    local timeouts share one monotonic clock (and tests can control it).
    """

    __slots__ = ("_clock", "_shared")

    def __init__(
        self, *, client_id: str | None = None, clock: Callable[[], float] = _loop_clock
    ) -> None:
        super().__init__(client_id)
        if not callable(clock):
            raise InvalidArgumentError(f"clock must be a callable returning seconds, not {clock!r}")
        self._clock = clock
        self._shared = _Shared()

    def with_client(self, client_id: str) -> MemoryBackend:
        other = MemoryBackend(client_id=client_id, clock=self._clock)
        other._shared = self._shared
        return other

    @property
    def _limiters(self) -> dict[str, _Limiter]:
        return self._shared.limiters

    # -- keys and TTLs ----------------------------------------------------------------------

    def _now(self) -> int:
        return clock_micros(self._clock())  # NaN, inf or a non-number: InvalidArgumentError

    def _limiter(self, name: str, now: int) -> _Limiter | None:
        """The limiter's keys as they stand at ``now``: expired ones are gone; None when
        nothing is left. Every operation calls this (or ``_create``) once, first: it sweeps."""
        shared = self._shared
        self._sweep(shared, name, now)
        limiter = shared.limiters.get(name)
        if limiter is None:
            return None
        if _purge(limiter, now):
            self._drop(shared, name)
            return None
        shared.touched_name, shared.touched = name, limiter
        return limiter

    def _create(self, name: str) -> _Limiter:
        """A new, empty limiter (only writes create one)."""
        shared = self._shared
        limiter = shared.limiters[name] = _Limiter()
        shared.touched_name, shared.touched = name, limiter
        return limiter

    @staticmethod
    def _drop(shared: _Shared, name: str) -> None:
        del shared.limiters[name]
        if not shared.limiters:
            shared.limiters = {}  # a dict never shrinks: give its table back
        if name in shared.due:
            MemoryBackend._undue(shared, name)

    @staticmethod
    def _undue(shared: _Shared, name: str) -> None:
        del shared.due[name]
        if not shared.due:
            shared.due = {}
            shared.heap = []  # every entry left is superseded

    def _sweep(self, shared: _Shared, name: str, now: int) -> None:
        """Schedules the last operation's limiter, then frees what has expired among at most
        ``_SWEEP`` heap entries that are due: a bounded amount of work per operation."""
        touched, shared.touched = shared.touched, None
        if touched is not None and shared.touched_name != name:
            touched_name = shared.touched_name
            assert touched_name is not None
            if shared.limiters.get(touched_name) is touched:
                self._check(shared, touched_name, touched, now)
        for _ in range(_SWEEP):
            heap = shared.heap
            if not heap or heap[0][0] > now:
                break
            at, due_name = heappop(heap)
            if shared.due.get(due_name) != at:
                continue  # superseded by an earlier entry, or the limiter was dropped
            self._undue(shared, due_name)
            limiter = shared.limiters.get(due_name)
            if limiter is not None:  # always, as _drop forgets the name's entry
                self._check(shared, due_name, limiter, now)

    def _check(self, shared: _Shared, name: str, limiter: _Limiter, now: int) -> None:
        """Frees the limiter's expired keys, drops it when nothing is left, and makes sure
        the sweep comes back when its next key expires."""
        if _purge(limiter, now):
            self._drop(shared, name)
            return
        at = _next_expiry(limiter)
        if at < shared.due.get(name, _FOREVER):
            heappush(shared.heap, (at, name))
            shared.due[name] = at
            if len(shared.heap) > 2 * len(shared.due) + 64:
                # Superseded entries piled up (limiters deleted, or expiries that kept moving
                # earlier): keep the live ones. O(heap), but at least half the heap goes, so
                # amortised over the pushes that made it O(1) each.
                live = [(t, n) for t, n in shared.heap if shared.due.get(n) == t]
                heapify(live)
                shared.heap = live

    def _budget_key(self, config: RateLimiterConfig) -> str | None:
        return self.client_id if config.rate_type is RateType.PER_CLIENT else None

    # -- the algorithm (mirrors lua/lib.lua step for step) -------------------------------------

    @staticmethod
    def _reclaim(budget: _Budget | None, window_start: int, write: bool) -> int:
        """Permits used once grants that left the window are reclaimed (at most
        ``_RECLAIM_STEPS`` of them); with ``write`` they are removed from the budget."""
        if budget is None:
            return 0
        grants, head = budget.grants, budget.head
        count = min(budget.rank_after(window_start) - head, _RECLAIM_STEPS)
        if count == 0:
            return budget.used
        if count == _RECLAIM_STEPS and grants[-1][0] <= window_start:
            if write:  # the whole log has expired
                budget.used = budget.seq = 0
                budget.clear()
            return 0
        used = budget.used - sum(p for _, _, p in grants[head : head + count])
        if write:
            last = grants[head + count - 1][0]
            budget.drop_front(count)
            if budget.cs is not None and budget.cs <= last:
                budget.cs = None
            elif budget.cs is not None:
                budget.cp -= budget.used - used
            budget.used = used
            if used == 0:
                budget.seq = 0  # an empty log starts over, as a budget whose keys expired does
        return used

    @staticmethod
    def _walk_forward(budget: _Budget, need: int) -> int | None:
        grants = budget.grants
        rank, prefix = budget.head, 0
        if budget.cs is not None:
            rank, prefix = budget.rank_after(budget.cs), budget.cp
        found: int | None = None
        group_score: int | None = None
        group = steps = 0
        size = 16
        while steps < _WALK_STEPS:
            entries = grants[rank : rank + size]
            for score, _, permits in entries:
                if found is not None and score != found:
                    budget.cs, budget.cp, budget.cg = found, prefix, group
                    return found
                if score == group_score:
                    group += permits
                else:
                    group_score, group = score, permits
                prefix += permits
                rank, steps = rank + 1, steps + 1
                if found is None and prefix >= need:
                    found = score
            if len(entries) < size:  # the end of the log
                if found is not None:
                    budget.cs, budget.cp, budget.cg = found, prefix, group
                return found
            size = min(size * 4, _WALK_STEPS - steps + 1)
        if found is not None:
            return found
        # Out of steps: with at least one permit per entry, `need` is reached at most this far.
        return grants[min(rank - 1 + need - prefix, len(grants) - 1)][0]

    @staticmethod
    def _walk_back(budget: _Budget, need: int) -> int:
        assert budget.cs is not None
        answer = budget.cs
        below = budget.cp - budget.cg
        if below < need:
            return answer
        top = bisect.bisect_left(budget.grants, (budget.cs, "", 0), lo=budget.head)
        older = budget.grants[budget.head : top][::-1]  # newest first
        group_score: int | None = None
        group = offset = steps = 0
        size = 16
        while steps < _WALK_STEPS:
            entries = older[offset : offset + size]
            for score, _, permits in entries:
                if group_score is not None and score != group_score:
                    answer = group_score
                    budget.cs, budget.cp, budget.cg = group_score, below, group
                    below -= group
                    if below < need:
                        return answer
                    group = 0
                group_score = score
                group += permits
                steps += 1
            if len(entries) < size:  # the start of the log
                if group_score is not None:
                    budget.cs, budget.cp, budget.cg = group_score, below, group
                    return group_score
                return answer
            offset += size
            size = min(size * 4, _WALK_STEPS - steps + 1)
        return answer if group_score is None else group_score

    @staticmethod
    def _wait_for(budget: _Budget, need: int, interval: int, now: int) -> int:
        if budget.cs is not None and budget.cp >= need:
            at: int | None = MemoryBackend._walk_back(budget, need)
        else:
            at = MemoryBackend._walk_forward(budget, need)
        if at is None:
            return interval
        return max(at + interval - now, 1)

    @staticmethod
    def _store(budget: _Budget, interval: int, now: int, deadline: int | None = None) -> bool:
        """Gives the budget a TTL that outlives its newest grant (but not the limiter's
        ``deadline``); False: no grant is left and the budget is gone."""
        if len(budget.grants) == budget.head:
            return False
        ttl = max(_ms(budget.grants[-1][0] + interval - now), 1000)
        if deadline is not None:
            ttl = max(min(ttl, _ms(deadline - now)), 1000)
        budget.expires_at = now + ttl
        return True

    def _save(
        self, limiter: _Limiter, key: str | None, budget: _Budget, interval: int, now: int
    ) -> None:
        """save_budget: a TTL for the budget, or no budget when its log is empty."""
        assert limiter.config is not None
        if not self._store(budget, interval, now, limiter.config.deadline):
            del limiter.budgets[key]

    @staticmethod
    def _extend_registry(limiter: _Limiter, until: float, deadline: int | None) -> None:
        """The registry lives at least ``until``, never past ``deadline``."""
        if deadline is not None:
            until = min(until, deadline)
        if limiter.registry_expires_at == _FOREVER or limiter.registry_expires_at < until:
            limiter.registry_expires_at = until

    @staticmethod
    def _refresh_group(limiter: _Limiter, key: str | None, now: int) -> int:
        """refresh_group: one budget's keys get the TTLs the config gives them; the longest,
        in us (0: no state, or state kept in the config, which lives as long)."""
        assert limiter.config is not None
        if state_in_config(limiter.config.config):
            return 0
        group = _Group(limiter, limiter.config.config, key, True)
        if group.fresh:
            return 0
        if group.budgets is not None:
            group.touched = list(group.stored)
        return group.save(limiter, now)

    def _refresh_clients(self, limiter: _Limiter, stored: _Config, now: int) -> None:
        """refresh.lua over every client of the registry: TTLs as the config gives them."""
        longest = stored.config.longest_us
        for client in list(limiter.registry):
            ttl = self._refresh_group(limiter, client, now)
            if ttl:
                self._extend_registry(limiter, now + ttl + _ms(longest), stored.deadline)

    # -- operations (one per script) -----------------------------------------------------------

    def _configured(
        self, name: str, now: int, record: bool = True, permits: int = 0
    ) -> tuple[_Limiter, RateLimiterConfig, int]:
        """The limiter, its config, and the time to act at: a clock reading older than one
        the limiter already acted on is moved up to it, and (with ``record``) a newer one is
        remembered, as ``limiter_now`` in lib.lua does with a client's time. As there, a
        request for more permits than the rate is refused first, remembering nothing."""
        limiter = self._limiter(name, now)
        if limiter is None or limiter.config is None:
            raise NotConfiguredError(name)
        stored = limiter.config
        if permits > stored.config.max_permits:
            rate = stored.config.max_permits
            raise InvalidArgumentError(f"permits ({permits}) exceed the rate ({rate})")
        if stored.clock is not None and now < stored.clock:
            now = stored.clock
        elif record:
            stored.clock = now
        return limiter, stored.config, now

    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        now = self._now()
        limiter = self._limiter(name, now)
        old = None if limiter is None else limiter.config
        if (mode == "try" and old is not None) or (mode == "update" and old is None):
            return False
        if limiter is None:
            limiter = self._create(name)
        clock = None if old is None else old.clock
        stored = limiter.config = _Config(
            config, now + _ms(config.keep_alive_us) if config.keep_alive_us else _FOREVER
        )
        # A new rate type, or a config where none was, clears the state (see set_rate.lua).
        if (
            keep_state
            and old is not None
            and old.config.rate_type is config.rate_type
            and old.config.algorithm is config.algorithm
        ):
            if clock is not None and now < clock:
                now = clock
            clock = now
            if state_in_config(config):
                stored.state = old.state  # the new config carries the field over
            group = _Group(limiter, config, None, True)
            group.reclaim(now, True)
            if group.budgets is not None:
                group.touched = [
                    t or kept for t, kept in zip(group.touched, group.stored, strict=True)
                ]
            if not group.fresh:
                group.dirty = True
                group.save(limiter, now)
            # Clients follow the new rate at their next grant; a longer interval lengthens
            # their TTLs now (refresh.lua, in chunks on Redis).
            if config.longest_us > old.config.longest_us and limiter.registry:
                self._refresh_clients(limiter, stored, now)
        else:
            limiter.budgets.clear()
            limiter.extra.clear()
            limiter.registry.clear()
            limiter.registry_expires_at = _FOREVER  # the registry key is gone with them
        stored.clock = clock
        return True

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        limiter = self._limiter(name, self._now())
        if limiter is None or limiter.config is None:
            return None
        return limiter.config.config

    async def try_acquire(
        self, name: str, permits: int, max_wait_us: int | None = 0
    ) -> Grant | Refusal:
        limiter, config, now = self._configured(name, self._now(), permits=permits)
        key = self._budget_key(config)
        group = _Group(limiter, config, key, True)
        group.reclaim(now, True)
        start = group.earliest(permits, now)
        if start is None:
            raise BackendError(
                f"limiter {name!r} cannot queue {permits} more permits: its log would hold "
                "more than 2**53, which the scripts cannot count exactly"
            )
        delay = start - now
        if delay > 0 and max_wait_us is not None and delay > max_wait_us:
            if group.budgets is not None:
                group.save(limiter, now)  # what the reclaim changed is written back, nothing else
            return Refusal(delay, now, group.left(now))
        member = group.commit(permits, start)
        ttl = group.save(limiter, now)
        stored = limiter.config
        assert stored is not None
        longest = config.longest_us
        if key is not None:
            limiter.registry[key] = max(start, limiter.registry.get(key, start))
            for client in [c for c, t in limiter.registry.items() if t <= now - 2 * longest]:
                del limiter.registry[client]
            self._extend_registry(limiter, now + ttl + _ms(longest), stored.deadline)
        if config.keep_alive_us and stored.deadline is None:
            stored.expires_at = now + max(_ms(config.keep_alive_us), ttl)
        return Grant(delay, start, group.left(now), member, stored.blocked_until)

    async def wait_time(self, name: str, permits: int) -> int:
        limiter, config, now = self._configured(name, self._now(), False, permits)
        group = _Group(limiter, config, self._budget_key(config), False)
        # As wait.lua: the walk counts the expired grants still logged, so it needs what the
        # unreclaimed log says; and its cursor is not kept (a read writes nothing).
        logged = [budget.used for budget in group.budgets or ()]
        used = group.reclaim(now, False)
        cursors = [(b.cs, b.cp, b.cg) for b in group.budgets or ()]
        try:
            start = group.earliest(permits, now, used, logged)
        finally:
            for budget, (cs, cp, cg) in zip(group.budgets or (), cursors, strict=True):
                budget.cs, budget.cp, budget.cg = cs, cp, cg
        return 0 if start is None else start - now

    async def available_permits(self, name: str) -> int:
        limiter, config, now = self._configured(name, self._now(), record=False)
        group = _Group(limiter, config, self._budget_key(config), False)
        used = group.reclaim(now, False)
        left = group.left(now, used if group.budgets is not None else None)
        if config.min_spacing_us > 0 or group.blocked_until is not None:
            start = group.earliest(1, now, used, [b.used for b in group.budgets or ()])
            if start is not None and start > now:
                left = min(left, 0)  # the spacing or a block holds the next grant back
        return max(left, 0)

    @staticmethod
    def _release_log(budget: _Budget, permits: int, member: str | None, now: int) -> int:
        """Removes ``member`` from one log, or ``permits`` from its newest started grants."""
        grants, released = budget.grants, 0
        if member is not None:
            # Newest first: a handed-back grant is a recent one (ZSCORE finds it in Redis).
            for i in range(len(grants) - 1, budget.head - 1, -1):
                time, logged, entry_permits = grants[i]
                if logged == member:
                    del grants[i]
                    budget.moved(time, -entry_permits)
                    released = entry_permits
                    break
            return released
        # Reservations (grants starting in the future) belong to waiting callers.
        started = budget.rank_after(now)
        for index in range(started - 1, max(started - _WALK_STEPS, budget.head) - 1, -1):
            if released >= permits:
                break
            time, logged, entry_permits = grants.pop(index)
            take = min(entry_permits, permits - released)
            budget.moved(time, -take)
            released += take
            if take < entry_permits:
                rest = entry_permits - take
                budget.add((time, format_member(rest, parse_member(logged)[1]), rest))
        return released

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        limiter, config, now = self._configured(name, self._now())
        group = _Group(limiter, config, self._budget_key(config), True)
        group.reclaim(now, True)
        released = group.release(permits, member, now)
        if group.budgets is not None or group.dirty:
            group.save(limiter, now)
        return released

    async def block(self, name: str, duration_us: int | None) -> int:
        limiter, _, now = self._configured(name, self._now(), record=duration_us is not None)
        stored = limiter.config
        assert stored is not None
        until = now if stored.blocked_until is None else stored.blocked_until
        if duration_us is not None:
            until = stored.blocked_until = max(until, now + duration_us)
        return max(until - now, 0)

    async def delete(self, name: str) -> bool:
        if self._limiter(name, self._now()) is None:
            return False
        self._drop(self._shared, name)
        return True

    async def expire(self, name: str, ttl_us: int) -> bool:
        now = self._now()
        limiter = self._limiter(name, now)
        if limiter is None or limiter.config is None:
            return False
        at = now + _ms(ttl_us)
        limiter.config.expires_at = at
        limiter.config.deadline = at
        # The state's TTL as the new end gives it (refresh_group): an earlier end shortens
        # it, a later one gives back what an earlier expire() took.
        self._refresh_group(limiter, None, now)
        if limiter.registry:
            limiter.registry_expires_at = min(limiter.registry_expires_at, at)
        self._refresh_clients(limiter, limiter.config, now)
        return True

    async def clear_expire(self, name: str) -> bool:
        now = self._now()
        limiter = self._limiter(name, now)
        if limiter is None or limiter.config is None:
            return False
        stored = limiter.config
        had_ttl = stored.expires_at != _FOREVER
        stored.expires_at = _FOREVER
        stored.deadline = None
        self._refresh_group(limiter, None, now)
        self._refresh_clients(limiter, stored, now)
        return had_ttl


# -- groups: every rate of one budget (lib.lua, "groups") ---------------------------------------


def _cost(rate: Rate, permits: int) -> tuple[int, int]:
    """cost() in lib.lua: the refill ``permits`` tokens cost, in whole microseconds and the
    rest in 1/permits of one (computed in doubles, as Lua does)."""
    interval, count = rate.interval_us, rate.permits
    q = math.floor(interval / count)
    rest = float(permits) * float(interval - q * count)
    if rest >= _MAX_EXACT:
        return permits * q + math.ceil(rest / count), 0
    whole = math.floor(rest / count)
    return permits * q + whole, int(rest - whole * count)


def _window_of(n: list[int], i: int, interval: int) -> int:
    """window_of() in lib.lua: the number of rate i's latest window holding grants, from its
    end (-1: none yet)."""
    return (n[2 * i] - 1) // interval


def _refilled(rate: Rate, us: int, frac: int, start: int, permits: int) -> tuple[int, int]:
    """refilled() in lib.lua: a bucket's full time moved on by ``permits`` tokens, from no
    earlier than ``start``."""
    if us < start or (us == start and frac == 0):
        us, frac = start, 0
    whole, rest = _cost(rate, permits)
    frac += rest
    if frac >= rate.permits:
        us, frac = us + 1, frac - rate.permits
    return us + whole, frac


class _Group:
    """One budget's state under every rate of its config, loaded for one operation: the
    sliding window's logs (``budgets``, one per rate; ``stored`` says which exist), or the
    counters of a token bucket or fixed windows (``state``)."""

    __slots__ = (
        "blocked_until",
        "budgets",
        "config",
        "dirty",
        "fresh",
        "key",
        "latest",
        "state",
        "stored",
        "touched",
    )

    def __init__(self, limiter: _Limiter, config: RateLimiterConfig, key: str | None, write: bool):
        self.config, self.key = config, key
        assert limiter.config is not None
        self.blocked_until = limiter.config.blocked_until
        self.dirty = False
        self.latest: int | None = None
        self.budgets: list[_Budget] | None = None
        if config.algorithm is Algorithm.SLIDING_WINDOW:
            self.budgets, self.stored = [], []
            for i in range(1, len(config.rates) + 1):
                budget = limiter.budgets.get(key) if i == 1 else limiter.extra.get((key, i))
                self.stored.append(budget is not None)
                self.budgets.append(_Budget() if budget is None else budget)
            self.touched = [False] * len(self.budgets)
            self.fresh = not any(self.stored)
            return
        per = 2
        state = limiter.config.state if state_in_config(config) else limiter.budgets.get(key)
        if state is not None:
            # set_rate with keep_state may have changed the rates: each keeps its own state
            # by position, a rate added starts afresh; a token bucket's remainder of another
            # rate is rounded up. As load_group reads the value, that is a copy, stored only
            # if saved. (Otherwise the state is used as it is: only commit and release change
            # it, and both save it.)
            size = per * len(config.rates)
            bucket = config.algorithm is Algorithm.TOKEN_BUCKET
            if len(state.n) != size or (
                bucket and any(state.n[2 * i + 1] >= r.permits for i, r in enumerate(config.rates))
            ):
                n = [state.n[i] if i < len(state.n) else 0 for i in range(size)]
                state = _Budget(expires_at=state.expires_at, last=state.last, n=n)
                if bucket:
                    for i, rate in enumerate(config.rates):
                        if n[2 * i + 1] >= rate.permits:
                            n[2 * i] += 1
                            n[2 * i + 1] = 0
            self.state, self.fresh = state, False
            return
        self.fresh = True
        self.state = _Budget(n=[0] * (per * len(config.rates)))  # full buckets; no window yet

    def reclaim(self, now: int, write: bool) -> list[int]:
        """Reclaims every log (a sliding window's); returns the permits each holds after it.
        Without ``write`` no budget changes."""
        used = []
        for i, (budget, rate) in enumerate(
            zip(self.budgets or (), self.config.rates, strict=False)
        ):
            before = budget.used
            after = MemoryBackend._reclaim(budget, now - rate.interval_us, write)
            if write and after != before:
                self.touched[i] = True  # what the reclaim changed is written back
            used.append(after)
        return used

    def left(self, now: int, used: list[int] | None = None) -> int:
        """group_left: permits a request could take at ``now``."""
        config = self.config
        if self.budgets is not None:
            counts = used if used is not None else [b.used for b in self.budgets]
            return min(r.permits - u for r, u in zip(config.rates, counts, strict=True))
        n, lefts = self.state.n, []
        for i, rate in enumerate(config.rates):
            interval, count = rate.interval_us, rate.permits
            if config.algorithm is Algorithm.TOKEN_BUCKET:
                tat, frac = n[2 * i], n[2 * i + 1]
                if tat < now or (tat == now and frac == 0):
                    lefts.append(count)
                else:
                    tokens = (float(interval - (tat - now)) * count - frac) / interval
                    lefts.append(math.floor(tokens))
            else:
                window, held = _window_of(n, i, interval), n[2 * i + 1]
                current = now // interval
                lefts.append(
                    count if window < current else count - held if window == current else 0
                )
        return min(lefts)

    def last(self) -> int | None:
        """newest_start (sliding window), or the latest start kept."""
        if self.budgets is None:
            return self.state.last
        newest = [
            b.grants[-1][0]
            for b, kept in zip(self.budgets, self.stored, strict=True)
            if kept and len(b.grants) > b.head
        ]
        return max(newest) if newest else None

    def earliest(
        self, permits: int, now: int, used: list[int] | None = None, logged: list[int] | None = None
    ) -> int | None:
        config, start = self.config, now
        last = None
        if self.budgets is not None:
            for i, (budget, rate) in enumerate(zip(self.budgets, config.rates, strict=True)):
                held = budget.used if used is None else used[i]
                if held + permits > _MAX_EXACT:
                    return None
                left = rate.permits - held
                if left < permits and self.stored[i]:
                    before = held if logged is None else logged[i]
                    need = permits - (rate.permits - before)
                    start = max(
                        start, now + MemoryBackend._wait_for(budget, need, rate.interval_us, now)
                    )
            if len(self.budgets) > 1 or config.min_spacing_us > 0:
                last = self.last()
        else:
            n = self.state.n
            for i, rate in enumerate(config.rates):
                interval = rate.interval_us
                if config.algorithm is Algorithm.TOKEN_BUCKET:
                    tat, frac = _refilled(rate, n[2 * i], n[2 * i + 1], now, permits)
                    start = max(start, tat - interval + (1 if frac > 0 else 0))
                else:
                    window, held = _window_of(n, i, interval), n[2 * i + 1]
                    if window >= now // interval:
                        if held + permits <= rate.permits:
                            start = max(start, window * interval)
                        else:
                            start = max(start, (window + 1) * interval)
            last = self.state.last
        if last is not None:
            start = max(start, last + config.min_spacing_us)
        if self.blocked_until is not None:
            start = max(start, self.blocked_until)
        return start

    def commit(self, permits: int, start: int) -> str:
        config = self.config
        self.fresh = False
        if self.budgets is not None:
            seq = max(b.seq for b in self.budgets) + 1
            member = format_member(permits, seq)
            for i, budget in enumerate(self.budgets):
                budget.add((start, member, permits))
                budget.seq = seq
                budget.used += permits
                budget.moved(start, permits)
                self.touched[i] = True
            self.latest = start if self.latest is None else max(self.latest, start)
            return member
        state = self.state
        state.last = start if state.last is None else max(state.last, start)
        n = state.n
        for i, rate in enumerate(config.rates):
            if config.algorithm is Algorithm.TOKEN_BUCKET:
                n[2 * i], n[2 * i + 1] = _refilled(rate, n[2 * i], n[2 * i + 1], start, permits)
            else:
                window = start // rate.interval_us
                if window == _window_of(n, i, rate.interval_us):
                    n[2 * i + 1] += permits
                else:
                    n[2 * i + 1] = permits
                n[2 * i] = (window + 1) * rate.interval_us
        self.dirty = True
        self.latest = start if self.latest is None else max(self.latest, start)
        return format_member(permits, start)

    def save(self, limiter: _Limiter, now: int) -> int:
        """save_group: writes back what changed; the longest TTL given, in us (0: gone)."""
        stored = limiter.config
        assert stored is not None
        deadline = stored.deadline
        config, key = self.config, self.key
        if self.budgets is not None:
            longest = 0
            for i, (budget, rate) in enumerate(zip(self.budgets, config.rates, strict=True)):
                if not self.touched[i]:
                    continue
                where: dict[Any, _Budget] = limiter.budgets if i == 0 else limiter.extra
                slot = key if i == 0 else (key, i + 1)
                if MemoryBackend._store(budget, rate.interval_us, now, deadline):
                    where[slot] = budget
                    self.stored[i] = True
                    longest = max(longest, int(budget.expires_at) - now)
                else:
                    where.pop(slot, None)
                    self.stored[i] = False
            return longest
        state, n = self.state, self.state.n
        until = state.last + config.min_spacing_us if state.last is not None else 0
        for i, rate in enumerate(config.rates):
            if config.algorithm is Algorithm.TOKEN_BUCKET:
                until = max(until, n[2 * i] + (1 if n[2 * i + 1] > 0 else 0))
            else:
                until = max(until, (_window_of(n, i, rate.interval_us) + 1) * rate.interval_us)
        if until <= now:
            if state_in_config(config):
                stored.state = None
            else:
                limiter.budgets.pop(key, None)
            return 0
        ttl = _ms(until - now)
        if deadline is not None:
            ttl = max(min(ttl, _ms(deadline - now)), 1000)
        if len(config.rates) == 1 and not config.min_spacing_us:
            state.last = None  # kept only where a later request needs it (lib.lua, save_group)
        if state_in_config(config):
            stored.state = state  # no TTL of its own: it goes with the config
        else:
            state.expires_at = now + ttl
            limiter.budgets[key] = state
        return ttl

    def release(self, wanted: int, member: str | None, now: int) -> int:
        config, released = self.config, 0
        if self.budgets is not None:
            for i, budget in enumerate(self.budgets):
                if not self.stored[i]:
                    continue
                count = MemoryBackend._release_log(budget, wanted, member, now)
                if count:
                    budget.used -= count
                    self.touched[i] = True
                released = max(released, count)
            return released
        start = None
        if member is not None:
            wanted, start = parse_member(member)
        n = self.state.n
        for i, rate in enumerate(config.rates):
            count, interval = 0, rate.interval_us
            if config.algorithm is Algorithm.TOKEN_BUCKET:
                tat, frac = n[2 * i], n[2 * i + 1]
                if tat > now or (tat == now and frac > 0):
                    owed = float(tat - now) * rate.permits + frac
                    count = min(wanted, math.ceil(owed / interval))
                    whole, rest = _cost(rate, wanted)
                    tat, frac = tat - whole, frac - rest
                    if frac < 0:
                        tat, frac = tat - 1, frac + rate.permits
                    if tat < now:
                        tat, frac = now, 0
                    n[2 * i], n[2 * i + 1] = tat, frac
            else:
                window = _window_of(n, i, interval)
                if (start is not None and start // interval == window) or (
                    start is None and window == now // interval
                ):
                    count = min(wanted, n[2 * i + 1])
                    n[2 * i + 1] -= count
            released = max(released, count)
        if released:
            self.dirty = True
        return released


def _ms(us: int) -> int:
    """A duration rounded up to whole milliseconds, as Redis keeps TTLs."""
    return -(-us // 1000) * 1000
