"""The in-process backend: the Lua scripts' algorithm, step for step, in Python."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush

from .._types import RateLimiterConfig, RateType, clock_micros
from ..errors import BackendError, InvalidArgumentError, NotConfiguredError
from ._protocol import MAX_EXACT as _MAX_EXACT
from ._protocol import RECLAIM_STEPS as _RECLAIM_STEPS
from ._protocol import WALK_STEPS as _WALK_STEPS
from ._protocol import format_member, parse_member
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


@dataclass
class _Budget:
    """The value key and permits ZSET of one budget (both share one TTL); see lib.lua."""

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
    if limiter.registry_expires_at <= now:
        limiter.registry.clear()
        limiter.registry_expires_at = _FOREVER
    return limiter.config is None and not budgets and not limiter.registry


def _next_expiry(limiter: _Limiter) -> float:
    """When the first of the limiter's keys expires (``_FOREVER``: none does)."""
    at = _FOREVER if limiter.config is None else limiter.config.expires_at
    if limiter.registry and limiter.registry_expires_at < at:
        at = limiter.registry_expires_at
    for budget in limiter.budgets.values():
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

    def _refresh_clients(self, limiter: _Limiter, stored: _Config, now: int) -> None:
        """refresh.lua over every client: TTLs as the config gives them."""
        interval = stored.config.interval_us
        for key, budget in list(limiter.budgets.items()):
            if key is None:
                continue
            if not self._store(budget, interval, now, stored.deadline):
                del limiter.budgets[key]
                continue
            self._extend_registry(limiter, budget.expires_at + _ms(interval), stored.deadline)

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
        if permits > stored.config.rate:
            rate = stored.config.rate
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
        if keep_state and old is not None and old.config.rate_type is config.rate_type:
            if clock is not None and now < clock:
                now = clock
            clock = now
            interval = config.interval_us
            overall = limiter.budgets.get(None)
            if overall is not None:
                self._reclaim(overall, now - interval, True)
                if not self._store(overall, interval, now):
                    del limiter.budgets[None]
            # Clients follow the new rate at their next grant; a longer interval lengthens
            # their TTLs now (refresh.lua, in chunks on Redis).
            if interval > old.config.interval_us and limiter.registry:
                self._refresh_clients(limiter, stored, now)
        else:
            limiter.budgets.clear()
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
        interval = config.interval_us
        key = self._budget_key(config)
        budget = limiter.budgets.get(key)
        reclaimed = False
        if budget is None:
            budget = _Budget()
        else:
            used = budget.used
            reclaimed = self._reclaim(budget, now - interval, True) != used
        if budget.used + permits > _MAX_EXACT:
            raise BackendError(
                f"limiter {name!r} cannot queue {permits} more permits: its log would hold "
                "more than 2**53, which the scripts cannot count exactly"
            )
        left = config.rate - budget.used
        delay = 0
        if left < permits:
            delay = self._wait_for(budget, permits - left, interval, now)
            if max_wait_us is not None and delay > max_wait_us:
                if reclaimed:  # what the reclaim changed is written back, nothing else
                    self._save(limiter, key, budget, interval, now)
                return Refusal(delay, now, left)
        start = now + delay
        budget.seq += 1
        grant = format_member(permits, budget.seq)
        budget.add((start, grant, permits))
        budget.used += permits
        budget.moved(start, permits)
        limiter.budgets[key] = budget
        stored = limiter.config
        assert stored is not None
        self._store(budget, interval, now, stored.deadline)
        if key is not None:
            limiter.registry[key] = max(start, limiter.registry.get(key, start))
            for client in [c for c, t in limiter.registry.items() if t <= now - 2 * interval]:
                del limiter.registry[client]
            self._extend_registry(limiter, budget.expires_at + _ms(interval), stored.deadline)
        if config.keep_alive_us and stored.deadline is None:
            stored.expires_at = max(now + _ms(config.keep_alive_us), budget.expires_at)
        return Grant(delay, start, config.rate - budget.used, grant)

    async def wait_time(self, name: str, permits: int) -> int:
        limiter, config, now = self._configured(name, self._now(), False, permits)
        budget = limiter.budgets.get(self._budget_key(config))
        interval = config.interval_us
        used = self._reclaim(budget, now - interval, False)
        if budget is None or config.rate - used >= permits:
            return 0
        # As wait.lua: the walk counts the expired grants still logged, so it needs what the
        # unreclaimed log says; and its cursor is not kept (a read writes nothing).
        cursor = budget.cs, budget.cp, budget.cg
        try:
            return self._wait_for(budget, permits - (config.rate - budget.used), interval, now)
        finally:
            budget.cs, budget.cp, budget.cg = cursor

    async def available_permits(self, name: str) -> int:
        limiter, config, now = self._configured(name, self._now(), record=False)
        budget = limiter.budgets.get(self._budget_key(config))
        return max(config.rate - self._reclaim(budget, now - config.interval_us, False), 0)

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        limiter, config, now = self._configured(name, self._now())
        key = self._budget_key(config)
        budget = limiter.budgets.get(key)
        if budget is None:
            return 0
        self._reclaim(budget, now - config.interval_us, True)
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
        else:
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
        budget.used -= released
        self._save(limiter, key, budget, config.interval_us, now)
        return released

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
        # The state's TTL as the new end gives it (refresh_budget): an earlier end shortens
        # it, a later one gives back what an earlier expire() took.
        overall = limiter.budgets.get(None)
        if overall is not None and not self._store(
            overall, limiter.config.config.interval_us, now, at
        ):
            del limiter.budgets[None]
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
        overall = limiter.budgets.get(None)
        if overall is not None and not self._store(overall, stored.config.interval_us, now):
            del limiter.budgets[None]
        self._refresh_clients(limiter, stored, now)
        return had_ttl


def _ms(us: int) -> int:
    """A duration rounded up to whole milliseconds, as Redis keeps TTLs."""
    return -(-us // 1000) * 1000
