"""The in-process backend: the Lua scripts' algorithms, step for step, in Python.

The operations here are the scripts' (one method per script); each algorithm is a
:class:`~._algorithm.Group` of its own module, picked from ``GROUPS`` (``_budgets``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

from ..._breaker import BreakerPolicy
from ..._types import RateLimiterConfig, RateType
from ..._values import clock_micros
from ...errors import InvalidArgumentError, NotConfiguredError
from .._context import StoreContext
from .._protocol import (
    check_settle,
    check_sync,
    new_life,
    over_rate_error,
    parse_grant,
    queue_full_error,
    split_life,
    with_life,
)
from ..base import Backend, Grant, InTask, Refusal, SetMode, Settlement, Started
from ._budgets import (
    GROUPS,
    extend_registry,
    group_of,
    keep_promises,
    refresh_clients,
    refresh_group,
    register,
    reservations,
    state_in_config,
)
from ._learn import MemoryLearning
from ._leases import MemoryLeases
from ._margin import MemoryMargin
from ._settle import receipt_until, settle_group, told_of
from ._state import FOREVER, Config, Limiter, ms
from ._store import Store

__all__ = ["GROUPS", "MemoryBackend", "state_in_config"]


def _loop_clock() -> float:
    return asyncio.get_running_loop().time()


class MemoryBackend(MemoryLearning, MemoryMargin, MemoryLeases, Backend):
    """Limiter state in this process's memory, with the same semantics as ``RedisBackend``.

    >>> backend = MemoryBackend()
    >>> limiter = RateLimiter("emails", backend)

    ``clock`` returns seconds; by default the running event loop's clock, so grants and
    local timeouts share one monotonic clock (and tests can control it). ``breaker``: the
    back-offs of its limiters' circuit breakers (:class:`~aiolimit.BreakerPolicy`).
    """

    __slots__ = ("_clock", "_shared")

    _shared: Store

    def __init__(
        self,
        *,
        client_id: str | None = None,
        clock: Callable[[], float] = _loop_clock,
        breaker: BreakerPolicy | None = None,
    ) -> None:
        context = StoreContext(breaker)
        if not callable(clock):
            raise InvalidArgumentError(f"clock must be a callable returning seconds, not {clock!r}")
        self._open(client_id, context, clock, Store())

    def _open(
        self,
        client_id: str | None,
        context: StoreContext,
        clock: Callable[[], float],
        shared: Store,
    ) -> None:
        """Made on the store ``shared`` with its ``context``: a new one, or a view's."""
        super().__init__(client_id, context=context)
        self._clock = clock
        self._shared = shared

    def with_client(self, client_id: str) -> MemoryBackend:
        view = MemoryBackend.__new__(MemoryBackend)
        view._open(client_id, self.context, self._clock, self._shared)
        return view

    def watch_refunds(self, name: str, heard: Callable[[int], None]) -> Callable[[], None]:
        return self._shared.watch_refunds(name, self.client_id, heard)

    @property
    def store_id(self) -> Hashable:
        return id(self._shared)  # one dict of limiters, shared by with_client views

    @property
    def _limiters(self) -> dict[str, Limiter]:
        return self._shared.limiters

    def _now(self) -> int:
        return clock_micros(self._clock())  # NaN, inf or a non-number: InvalidArgumentError

    def _budget_key(self, config: RateLimiterConfig, name: str) -> str | None:
        if config.rate_type is not RateType.PER_CLIENT:
            return None
        if self._random_id:
            self.per_client_used(name)
        return self.client_id

    def _configured(
        self, name: str, now: int, record: bool = True, permits: int = 0
    ) -> tuple[Limiter, RateLimiterConfig, int]:
        """The limiter, its config, and the time to act at: a clock reading older than one
        the limiter already acted on is moved up to it, and (with ``record``) a newer one is
        remembered, as ``limiter_now`` in lib.lua does with a client's time. As there, a
        request for more permits than the rate is refused first, remembering nothing."""
        limiter = self._shared.limiter(name, now)
        if limiter is None or limiter.config is None:
            raise NotConfiguredError(name)
        stored = limiter.config
        if permits > stored.config.max_permits:
            raise over_rate_error(permits, stored.config.max_permits)
        if stored.clock is not None and now < stored.clock:
            now = stored.clock
        elif record:
            stored.clock = now
        return limiter, stored.config, now

    # -- operations (one per script) -----------------------------------------------------------

    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        now = self._now()
        limiter = self._shared.limiter(name, now)
        old = None if limiter is None else limiter.config
        if (mode == "try" and old is not None) or (mode == "update" and old is None):
            return False
        if limiter is None:
            limiter = self._shared.create(name)
        clock = None if old is None else old.clock
        promised = reservations(limiter, now) if old is not None else None
        # A new rate type, or a config where none was, clears the state (see set_rate.lua):
        # its state starts another life.
        keep = (
            keep_state
            and old is not None
            and old.config.rate_type is config.rate_type
            and old.config.algorithm is config.algorithm
        )
        stored = limiter.config = Config(
            config,
            old.life if keep and old is not None else new_life(),
            now + ms(config.keep_alive_us) if config.keep_alive_us else FOREVER,
        )
        if keep and old is not None:
            if clock is not None and now < clock:
                now = clock
            clock = now
            if state_in_config(config):
                stored.state = old.state  # the new config carries the field over
            group = group_of(limiter, config, None, True, now)
            group.reclaim(now)
            longer = group.rates_changed(limiter, old, now)
            group.keep()
            if not group.fresh:
                group.save(limiter, now)
            # Clients follow the new rate at their next grant; a longer interval (or a
            # bucket's slower refill) lengthens their TTLs now (refresh.lua, in chunks on
            # Redis).
            longer = longer or config.longest_us > old.config.longest_us
            if longer and limiter.registry:
                refresh_clients(limiter, stored, now)
        else:
            same_type = old is not None and old.config.rate_type is config.rate_type
            cleared, limiter.registry = limiter.registry, {}
            limiter.forget_clients()
            if same_type and config.rate_type is RateType.PER_CLIENT:
                keep_promises(limiter, cleared, max(now, clock or now))
            if promised is not None and config.rate_type is RateType.OVERALL:
                # A reset forgets what was used, not what was promised (set_rate.lua).
                stored.state = None
                group = group_of(limiter, config, None, True, max(now, clock or now))
                group.commit(min(promised[0], config.max_permits), promised[1])
                group.save(limiter, max(now, clock or now))
        stored.clock = clock
        return True

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        limiter = self._shared.limiter(name, self._now())
        if limiter is None or limiter.config is None:
            return None
        return limiter.config.exact or limiter.config.config

    async def try_acquire(
        self, name: str, permits: int, max_wait_us: int | None = 0
    ) -> Grant | Refusal:
        limiter, config, now = self._configured(name, self._now(), permits=permits)
        key = self._budget_key(config, name)
        group = group_of(limiter, config, key, True, now)
        group.reclaim(now)
        start = group.earliest(permits, now)
        if start is None:
            raise queue_full_error(name, permits)
        delay = start - now
        if delay > 0 and max_wait_us is not None and delay > max_wait_us:
            group.save(limiter, now)  # what the reclaim changed is written back, nothing else
            left, binding = group.left(now)
            return Refusal(delay, now, left, binding)
        grant = group.commit(permits, start)
        ttl = group.save(limiter, now)
        stored = limiter.config
        assert stored is not None
        member = f"{grant}:{stored.life}"  # (with_life, written out: the hot path)
        longest = config.longest_us
        if key is not None:
            limiter.register(key, start)
            limiter.unregister_before(now - 2 * longest)
            extend_registry(limiter, now + ttl + ms(longest), stored.deadline)
        if config.keep_alive_us and stored.deadline is None:
            stored.expires_at = now + max(ms(config.keep_alive_us), ttl)
        left, binding = group.left(now)
        return Grant(delay, start, left, member, stored.blocked_until, binding)

    def start_foresee(self, name: str, permits: int) -> Started:
        # (a task, as start_acquire's: it runs after the attempts started before it)
        return InTask(self, name, asyncio.ensure_future(self._foresee(name, permits)))

    async def _foresee(self, name: str, permits: int) -> Refusal:
        limiter, config, now = self._configured(name, self._now(), permits=permits)
        group = group_of(limiter, config, self._budget_key(config, name), True, now)
        group.reclaim(now)
        start = group.earliest(permits, now)
        if start is None:
            raise queue_full_error(name, permits)
        group.save(limiter, now)  # what the reclaim changed is written back, nothing else
        left, binding = group.left(now)
        return Refusal(start - now, now, left, binding)

    async def wait_time(self, name: str, permits: int) -> int:
        limiter, config, now = self._configured(name, self._now(), False, permits)
        group = group_of(limiter, config, self._budget_key(config, name), False, now)
        group.reclaim(now)
        start = group.earliest(permits, now)
        return 0 if start is None else start - now

    async def available_permits(self, name: str) -> int:
        limiter, config, now = self._configured(name, self._now(), record=False)
        group = group_of(limiter, config, self._budget_key(config, name), False, now)
        group.reclaim(now)
        left = group.left(now)[0]
        if config.min_spacing_us > 0 or group.blocked_until is not None:
            start = group.earliest(1, now)
            if start is not None and start > now:
                left = min(left, 0)  # the spacing or a block holds the next grant back
        return max(left, 0)

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        start = None if member is None else parse_grant(member)[1]
        limiter, config, now = self._configured(name, self._now(), record=False)
        grant = None
        if member is not None:
            grant, life = split_life(member)
            assert limiter.config is not None
            if life != limiter.config.life:
                return 0  # a grant of another life (release.lua)
        key = self._budget_key(config, name)
        group = group_of(limiter, config, key, True, now)
        receipt = None
        if member is not None and not group.idempotent:
            # As release.lua: a grant handed back once comes back once.
            receipt = (name, member if key is None else f"{member} {key}")
            if self._shared.receipts.get(receipt, now) > now:
                return 0
        assert limiter.config is not None
        limiter.config.clock = now
        group.reclaim(now)
        released = group.release(permits, grant, now)
        group.save(limiter, now)
        if released > 0 and key is None:  # (PER_CLIENT budgets tell no one: settle.lua)
            self._shared.refunded(name, self.client_id, released)
        if receipt is not None and start is not None:
            until = start + config.longest_us
            if until > now:
                self._shared.remember(receipt, until, now)
        return released

    async def settle(self, name: str, member: str, permits: int, *, kept: int = 0) -> Settlement:
        return self._settle(name, member, check_settle(member, permits), None, kept)

    async def settle_and_sync(
        self,
        name: str,
        member: str,
        permits: int,
        remaining: int,
        reset_us: int,
        *,
        kept: int = 0,
    ) -> Settlement:
        permits = check_settle(member, permits)
        return self._settle(name, member, permits, check_sync(remaining, reset_us), kept)

    def _settle(
        self, name: str, member: str, permits: int, floor: tuple[int, int] | None, kept: int
    ) -> Settlement:
        """settle.lua: the settle, then with ``floor`` (remaining, reset µs) the sync."""
        limiter, config, now = self._configured(name, self._now(), record=False)
        key = self._budget_key(config, name)
        receipt = (name, member if key is None else f"{member} {key}")
        grant, life = split_life(member)
        assert limiter.config is not None
        unchanged = (
            permits == parse_grant(member)[0]
            or life != limiter.config.life
            or self._shared.receipts.get(receipt, now) > now
        )  # nothing to change, a grant of another life, or sent again (settle.lua)
        if unchanged and floor is None:
            return Settlement(0, 0, member)
        limiter.config.clock = now
        group = group_of(limiter, config, key, True, now)
        group.reclaim(now)
        settled = (
            Settlement(0, 0, grant)
            if unchanged
            else settle_group(group, grant, permits, now, config.debt_limit)
        )
        if floor is not None:
            group.sync(*floor, now)
        register(limiter, key, now, group.save(limiter, now))
        told = told_of(settled.handed_back, kept)
        if told > 0 and key is None:
            self._shared.refunded(name, self.client_id, told)
        if settled.member == grant:
            return settled._replace(member=member)
        self._shared.remember(receipt, receipt_until(member, config.longest_us, now), now)
        return settled._replace(member=with_life(settled.member, limiter.config.life))

    async def sync(self, name: str, remaining: int, reset_us: int) -> None:
        remaining, reset_us = check_sync(remaining, reset_us)  # (settle_and_sync: the same)
        limiter, config, now = self._configured(name, self._now())
        key = self._budget_key(config, name)
        group = group_of(limiter, config, key, True, now)
        group.reclaim(now)
        group.sync(remaining, reset_us, now)
        register(limiter, key, now, group.save(limiter, now))

    async def block(self, name: str, duration_us: int | None) -> int:
        limiter, _, now = self._configured(name, self._now(), record=duration_us is not None)
        stored = limiter.config
        assert stored is not None
        until = now if stored.blocked_until is None else stored.blocked_until
        if duration_us is not None:
            until = stored.blocked_until = max(until, now + duration_us)
        return max(until - now, 0)

    async def unblock(self, name: str) -> bool:
        limiter, _, now = self._configured(name, self._now(), record=False)
        stored = limiter.config
        assert stored is not None
        until, stored.blocked_until = stored.blocked_until, None
        return until is not None and until > now

    async def blocked_until(self, name: str) -> int | None:
        limiter = self._shared.limiter(name, self._now())
        return None if limiter is None or limiter.config is None else limiter.config.blocked_until

    async def delete(self, name: str) -> bool:
        if self._shared.limiter(name, self._now()) is None:
            return False
        self._shared.drop(name)
        return True

    async def expire(self, name: str, ttl_us: int) -> bool:
        now = self._now()
        limiter = self._shared.limiter(name, now)
        if limiter is None or limiter.config is None:
            return False
        at = now + ms(ttl_us)
        limiter.config.expires_at = at
        limiter.config.deadline = at
        # The state's TTL as the new end gives it (refresh_group): an earlier end shortens
        # it, a later one gives back what an earlier expire() took. Its TTLs count from the
        # limiter's time, which never goes back (a clock behind it would end the state at
        # once, before the grants it holds, which Redis keeps for the TTL the script gives).
        acting = max(now, limiter.config.clock or now)
        refresh_group(limiter, None, acting)
        if limiter.registry:
            limiter.registry_expires_at = min(limiter.registry_expires_at, at)
        refresh_clients(limiter, limiter.config, acting)
        return True

    async def clear_expire(self, name: str) -> bool:
        now = self._now()
        limiter = self._shared.limiter(name, now)
        if limiter is None or limiter.config is None:
            return False
        stored = limiter.config
        had_ttl = stored.expires_at != FOREVER
        stored.expires_at = FOREVER
        stored.deadline = None
        refresh_group(limiter, None, now)
        refresh_clients(limiter, stored, now)
        return had_ttl
