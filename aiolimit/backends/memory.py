"""The in-process backend: the Lua scripts' algorithm, step for step, in Python."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from .._types import RateLimiterConfig, RateType
from ..errors import InvalidArgumentError, NotConfiguredError
from .base import Attempt, Backend, SetMode

__all__ = ["MemoryBackend"]

_FOREVER = float("inf")


@dataclass
class _Config:
    config: RateLimiterConfig
    expires_at: float = _FOREVER
    deadline: int | None = None  # set by expire(): no state may outlive it
    clock: int | None = None  # the latest time acted on (see limiter_now in lib.lua)


@dataclass
class _Budget:
    """The value key and permits ZSET of one budget (both share one TTL)."""

    left: int
    # (time, member, permits), ordered as a ZSET orders them: by score, then by member
    grants: list[tuple[int, str, int]] = field(default_factory=list)
    expires_at: float = _FOREVER


@dataclass
class _Limiter:
    config: _Config | None = None
    budgets: dict[str | None, _Budget] = field(default_factory=dict)  # None: OVERALL
    registry: dict[str, int] = field(default_factory=dict)  # PER_CLIENT client -> last grant
    registry_expires_at: float = _FOREVER


def _loop_clock() -> float:
    return asyncio.get_running_loop().time()


class MemoryBackend(Backend):
    """Limiter state in this process's memory, with the same semantics as ``RedisBackend``.

    >>> backend = MemoryBackend()
    >>> limiter = RateLimiter("emails", backend)

    ``clock`` returns seconds; by default the running event loop's clock, so grants and
    local timeouts share one monotonic clock (and tests can control it).
    """

    __slots__ = ("_clock", "_limiters")

    def __init__(
        self, *, client_id: str | None = None, clock: Callable[[], float] = _loop_clock
    ) -> None:
        super().__init__(client_id)
        self._clock = clock
        self._limiters: dict[str, _Limiter] = {}

    def with_client(self, client_id: str) -> MemoryBackend:
        other = MemoryBackend(client_id=client_id, clock=self._clock)
        other._limiters = self._limiters
        return other

    # -- keys and TTLs ----------------------------------------------------------------------

    def _now(self) -> int:
        return round(self._clock() * 1_000_000)

    def _limiter(self, name: str, now: int) -> _Limiter:
        """The limiter's keys as they stand at ``now``: expired ones are gone."""
        limiter = self._limiters.setdefault(name, _Limiter())
        if limiter.config is not None and limiter.config.expires_at <= now:
            limiter.config = None
        for client in [c for c, b in limiter.budgets.items() if b.expires_at <= now]:
            del limiter.budgets[client]
        if limiter.registry_expires_at <= now:
            limiter.registry.clear()
            limiter.registry_expires_at = _FOREVER
        return limiter

    def _budget_key(self, config: RateLimiterConfig) -> str | None:
        return self.client_id if config.rate_type is RateType.PER_CLIENT else None

    # -- the algorithm (mirrors lua/lib.lua) ---------------------------------------------------

    @staticmethod
    def _reclaim(budget: _Budget | None, rate: int, window_start: int, write: bool) -> int:
        if budget is None:
            return rate
        expired = bisect.bisect_right(budget.grants, (window_start, "\U0010ffff", 0))
        left = budget.left + sum(p for _, _, p in budget.grants[:expired])
        if write and expired:
            del budget.grants[:expired]
            budget.left = left
        return left

    @staticmethod
    def _wait_for(budget: _Budget, need: int, interval: int, now: int) -> int:
        freed = 0
        for time, _, permits in budget.grants:
            freed += permits
            if freed >= need:
                return max(time + interval - now, 1)
        return interval

    @staticmethod
    def _add_unique(budget: _Budget, time: int, member: str, permits: int) -> str:
        taken = {m for t, m, _ in budget.grants if t == time}
        candidate, n = member, 1
        while candidate in taken:
            candidate, n = f"{member}.{n}", n + 1
        bisect.insort(budget.grants, (time, candidate, permits))
        return candidate

    @staticmethod
    def _log_grant(budget: _Budget, permits: int, start: int) -> str:
        return MemoryBackend._add_unique(budget, start, f"{permits}:{start}", permits)

    @staticmethod
    def _store(
        budget: _Budget, left: int, interval: int, now: int, deadline: int | None = None
    ) -> bool:
        """Sets left and a TTL that outlives the newest grant (but not the limiter's
        ``deadline``); False: the budget is gone."""
        if not budget.grants:
            return False
        budget.left = left
        ttl = _ms(budget.grants[-1][0] + interval - now)
        if deadline is not None:
            ttl = max(min(ttl, _ms(deadline - now)), 1000)
        budget.expires_at = now + ttl
        return True

    @staticmethod
    def _recompute(
        budgets: dict[str | None, _Budget], key: str | None, config: RateLimiterConfig, now: int
    ) -> None:
        budget = budgets.get(key)
        if budget is None:
            return
        interval = config.interval_us
        budget.grants = [g for g in budget.grants if g[0] > now - interval]
        left = config.rate - sum(p for _, _, p in budget.grants)
        if not MemoryBackend._store(budget, left, interval, now):
            del budgets[key]

    # -- operations (one per script) -----------------------------------------------------------

    def _configured(
        self, name: str, now: int, record: bool = True
    ) -> tuple[_Limiter, RateLimiterConfig, int]:
        """The limiter, its config, and the time to act at: a clock reading older than one
        the limiter already acted on is moved up to it (as ``limiter_now`` in lib.lua)."""
        limiter = self._limiter(name, now)
        stored = limiter.config
        if stored is None:
            raise NotConfiguredError(name)
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
        old = limiter.config
        if (mode == "try" and old is not None) or (mode == "update" and old is None):
            return False
        clock = None if old is None else old.clock
        limiter.config = _Config(
            config, now + _ms(config.keep_alive_us) if config.keep_alive_us else _FOREVER
        )
        # A new rate type, or a config where none was, clears the state (see set_rate.lua).
        if keep_state and old is not None and old.config.rate_type is config.rate_type:
            if clock is not None and now < clock:
                now = clock
            clock = now
            for key in list(limiter.budgets):
                self._recompute(limiter.budgets, key, config, now)
            clients = [b.expires_at for k, b in limiter.budgets.items() if k is not None]
            if clients:
                limiter.registry_expires_at = max(clients) + _ms(config.interval_us)
        else:
            limiter.budgets.clear()
            limiter.registry.clear()
        limiter.config.clock = clock
        return True

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        stored = self._limiter(name, self._now()).config
        return None if stored is None else stored.config

    async def try_acquire(self, name: str, permits: int, max_wait: int = 0) -> Attempt:
        limiter, config, now = self._configured(name, self._now())
        if permits > config.rate:
            raise InvalidArgumentError(f"permits ({permits}) exceed the rate ({config.rate})")
        interval = config.interval_us
        key = self._budget_key(config)
        budget = limiter.budgets.get(key)
        left = self._reclaim(budget, config.rate, now - interval, True)
        delay = 0
        if left < permits:
            assert budget is not None
            delay = self._wait_for(budget, permits - left, interval, now)
            if 0 <= max_wait < delay:
                return Attempt(False, delay, left, now)
        if budget is None:
            budget = limiter.budgets[key] = _Budget(left)
        start = now + delay
        grant = self._log_grant(budget, permits, start)
        left -= permits
        stored = limiter.config
        assert stored is not None
        self._store(budget, left, interval, now, stored.deadline)
        if key is not None:
            limiter.registry[key] = start
            for client in [c for c, t in limiter.registry.items() if t <= now - 2 * interval]:
                del limiter.registry[client]
            after = 0 if stored.deadline is not None else _ms(interval)
            limiter.registry_expires_at = budget.expires_at + after
        if config.keep_alive_us and stored.deadline is None:
            stored.expires_at = max(now + _ms(config.keep_alive_us), budget.expires_at)
        return Attempt(True, delay, left, start, grant)

    async def available_permits(self, name: str) -> int:
        limiter, config, now = self._configured(name, self._now(), record=False)
        budget = limiter.budgets.get(self._budget_key(config))
        return max(self._reclaim(budget, config.rate, now - config.interval_us, False), 0)

    async def release(self, name: str, permits: int, grant: str | None = None) -> int:
        limiter, config, now = self._configured(name, self._now())
        budget = limiter.budgets.get(self._budget_key(config))
        left = self._reclaim(budget, config.rate, now - config.interval_us, True)
        if budget is None:
            return 0
        released = 0
        if grant is not None:
            for i, (_, member, entry_permits) in enumerate(budget.grants):
                if member == grant:
                    del budget.grants[i]
                    released = entry_permits
                    break
        else:
            # Reservations (grants starting in the future) belong to waiting callers.
            started = bisect.bisect_right(budget.grants, (now, "\U0010ffff", 0))
            while released < permits and started > 0:
                started -= 1
                time, member, entry_permits = budget.grants.pop(started)
                take = min(entry_permits, permits - released)
                if take < entry_permits:
                    rest = entry_permits - take
                    self._add_unique(budget, time, f"{rest}:{member.partition(':')[2]}", rest)
                released += take
        assert limiter.config is not None
        deadline = limiter.config.deadline
        if released and not self._store(budget, left + released, config.interval_us, now, deadline):
            del limiter.budgets[self._budget_key(config)]
        return released

    async def delete(self, name: str) -> bool:
        limiter = self._limiter(name, self._now())
        existed = limiter.config is not None or bool(limiter.budgets) or bool(limiter.registry)
        del self._limiters[name]
        return existed

    async def expire(self, name: str, ttl_us: int) -> bool:
        now = self._now()
        limiter = self._limiter(name, now)
        if limiter.config is None:
            return False
        at = now + _ms(ttl_us)
        limiter.config.expires_at = at
        limiter.config.deadline = at
        for budget in limiter.budgets.values():
            budget.expires_at = min(budget.expires_at, at)
        if limiter.registry:
            limiter.registry_expires_at = min(limiter.registry_expires_at, at)
        return True

    async def clear_expire(self, name: str) -> bool:
        now = self._now()
        limiter = self._limiter(name, now)
        if limiter.config is None:
            return False
        stored, config = limiter.config, limiter.config.config
        had_ttl = stored.expires_at != _FOREVER
        stored.expires_at = _FOREVER
        stored.deadline = None
        interval = config.interval_us
        clients: float = now
        for key, budget in limiter.budgets.items():
            self._store(budget, budget.left, interval, now)
            if key is not None:
                clients = max(clients, budget.expires_at)
        if clients > now:
            limiter.registry_expires_at = clients + _ms(interval)
        return had_ttl


def _ms(us: int) -> int:
    """A duration rounded up to whole milliseconds, as Redis keeps TTLs."""
    return -(-us // 1000) * 1000
