"""A limiter split over several sub-limiters, for rates one Redis node cannot serve alone."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ._limiter import RateLimiter, _Acquiring, _check_permits, _max_wait
from ._types import Duration, RateLimiterConfig, RateType, check_name
from .backends.base import Backend, SetMode
from .backends.redis import RedisBackend
from .errors import BackendError, InvalidArgumentError, LimiterError, NotConfiguredError

__all__ = ["ShardedRateLimiter", "split_rate"]

MAX_SHARDS = 256


def split_rate(rate: int, shards: int) -> list[int]:
    """Each shard's budget: ``rate // shards``, the remainder spread one by one over the
    first shards, so the budgets sum to ``rate`` exactly.

    >>> split_rate(10, 3)
    [4, 3, 3]
    """
    if rate < shards:
        raise InvalidArgumentError(
            f"a rate of {rate} cannot be split over {shards} shards: every shard needs a "
            f"budget of at least 1 permit (use a rate >= {shards} or fewer shards)"
        )
    base, extra = divmod(rate, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def shard_names(name: str, shards: int, backend: Backend) -> list[str]:
    """The sub-limiters' names: ``f"{name}\\x00shard{i}"``, on Redis suffixed ``.<n>`` when
    needed so that shard ``i``'s slot lies near the middle of the ``i``-th of ``shards`` equal
    parts of the slot space. ``redis-cli --cluster create`` gives M masters M equal slot
    ranges, so with ``shards <= M`` every shard lands on its own master. The names depend only
    on the name, the shard count and the key layout: every process computes the same ones. No
    plain limiter's name may hold a NUL, so no plain limiter can be (or touch) a shard.
    """
    base = [f"{name}\x00shard{i}" for i in range(shards)]
    if not isinstance(backend, RedisBackend):
        return base
    part = REDIS_CLUSTER_HASH_SLOTS / shards
    reach = max(part / 4, 1.0)
    names = []
    for i, candidate in enumerate(base):
        middle = part * (i + 0.5)
        chosen = candidate
        for n in range(1, 200_000):  # about 2 * shards tries on average
            if abs(_slot(backend, chosen) - middle) <= reach:
                break
            chosen = f"{candidate}.{n}"
        else:  # pragma: no cover - not seen for any name; any slot still works
            chosen = candidate
        names.append(chosen)
    return names


def _most_telling(refusals: list[LimiterError], permits: int, shards: int) -> LimiterError:
    """The error to raise when no shard could even consider a request."""
    for kind in (BackendError, InvalidArgumentError):
        errors = [exc for exc in refusals if isinstance(exc, kind)]
        if errors and kind is InvalidArgumentError:
            return InvalidArgumentError(
                f"permits ({permits}) exceed every shard's budget (the rate split over "
                f"{shards} shards; a request is served by one shard)"
            )
        if errors:
            return errors[0]
    return refusals[0]


def _slot(backend: RedisBackend, name: str) -> int:
    slot: int = key_slot(backend.keys(name).tag.encode())
    return slot


class ShardedRateLimiter(_Acquiring):
    """One rate split over ``shards`` sub-limiters that live on different cluster slots.

    >>> limiter = ShardedRateLimiter("search-api", RedisBackend(RedisCluster(...)), shards=3)
    >>> await limiter.try_set_rate(RateType.OVERALL, 30_000, 1)   # 10_000/s per shard
    >>> async with limiter:
    ...     await call_search()

    One Redis node runs one limiter's scripts one at a time, which caps a plain
    :class:`RateLimiter` at what one node serves. Here each shard is an ordinary limiter with
    its own hash tag, placed so that with ``shards`` ≤ the number of masters (and the slot
    layout ``redis-cli --cluster create`` makes) every shard is on its own master.

    **Guarantee.** The shard budgets sum to the rate exactly (``rate // shards`` each, the
    remainder spread over the first shards), and each shard is an exact sliding window. So in
    any window of ``interval`` the grants of all shards together never exceed ``rate``,
    whichever shards callers pick. While a rate change is applied shard by shard, the sum
    never exceeds the larger of the old and new rates.

    **Choosing a shard.** ``try_acquire`` tries one shard (round robin, from a random start
    per object), and when it refuses, each other shard once, before waiting; so a permit free
    anywhere is found, at the cost of up to ``shards`` round trips for a refusal. It then
    waits on the shard whose wait is shortest, exactly as :class:`RateLimiter` waits.

    **Trade-offs.**

    - A request is served by one shard: ``permits`` may not exceed the largest shard budget
      (``ceil(rate / shards)``), and free permits scattered over shards do not add up (with
      rate 10 over 2 shards and 3 free on each, a request for 4 waits).
    - Fairness is per shard: waiters on one shard in this process are served first come,
      first served, but a waiter does not move to another shard that frees earlier, and
      callers that find a free shard may pass waiters queued on another one. Share one
      object per name within a process so its callers skip shards that have waiters.
    - Minimum per-shard rate: ``rate >= shards`` (else ``ValueError``). Small shard budgets
      waste more to fragmentation; keep ``rate / shards`` well above the typical request.
    - ``shards`` is part of the limiter's identity (it picks the shard names). Processes
      using different shard counts for one name each admit up to the rate; change it only
      together with the name, or with every user stopped.
    - ``PER_CLIENT`` gives each client id a budget of ``rate`` split the same way.
    """

    __slots__ = ("_backend", "_last", "_name", "_next", "_shards", "_waiting")

    def __init__(self, name: str, backend: Backend, *, shards: int) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise InvalidArgumentError(f"shards must be an int >= 1, not {shards!r}")
        if shards > MAX_SHARDS:
            raise InvalidArgumentError(f"shards must be at most {MAX_SHARDS}, not {shards}")
        self._name = check_name(name)
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
        self._backend = backend
        self._shards = [RateLimiter._shard(n, backend) for n in shard_names(name, shards, backend)]
        self._next = random.randrange(shards)
        self._last = 0  # the shard of this object's latest grant, where release starts
        self._waiting = [0] * shards  # this object's tasks waiting on each shard

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def shards(self) -> Sequence[RateLimiter]:
        """The sub-limiters, one per shard."""
        return tuple(self._shards)

    def __repr__(self) -> str:
        return (
            f"ShardedRateLimiter({self._name!r}, {type(self._backend).__name__}, "
            f"shards={len(self._shards)})"
        )

    # -- configuration -------------------------------------------------------------------------

    def _configs(
        self, rate_type: RateType | str, rate: int, interval: Duration, keep_alive: Duration | None
    ) -> list[RateLimiterConfig]:
        config = RateLimiterConfig.build(rate_type, rate, interval, keep_alive)
        return [
            RateLimiterConfig(config.rate_type, budget, config.interval, config.keep_alive)
            for budget in split_rate(config.rate, len(self._shards))
        ]

    async def _set(
        self, configs: list[RateLimiterConfig], mode: SetMode, keep_state: bool
    ) -> list[bool]:
        return await asyncio.gather(
            *(
                self._backend.set_rate(shard.name, config, mode, keep_state)
                for shard, config in zip(self._shards, configs, strict=True)
            )
        )

    async def try_set_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
    ) -> bool:
        """Sets the rate on every shard that has none; returns whether any shard had none."""
        configs = self._configs(rate_type, rate, interval, keep_alive)
        return any(await self._set(configs, "try", True))

    async def set_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
        keep_state: bool = False,
    ) -> None:
        """Sets the rate on every shard (see :meth:`RateLimiter.set_rate`)."""
        configs = self._configs(rate_type, rate, interval, keep_alive)
        await self._set(configs, "set", keep_state)

    async def update_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
        keep_state: bool = True,
    ) -> bool:
        """Updates every shard that has a config; True when all had one."""
        configs = self._configs(rate_type, rate, interval, keep_alive)
        return all(await self._set(configs, "update", keep_state))

    async def get_config(self) -> RateLimiterConfig | None:
        """The whole limiter's config (the shard rates summed); None unless every shard has one."""
        configs = await asyncio.gather(*(shard.get_config() for shard in self._shards))
        if any(config is None for config in configs):
            return None
        first = configs[0]
        assert first is not None
        return RateLimiterConfig(
            first.rate_type,
            sum(config.rate for config in configs if config is not None),
            first.interval,
            first.keep_alive,
        )

    # -- permits -------------------------------------------------------------------------------

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        """Takes ``permits`` from one shard if some shard can give them within ``timeout``.

        Tries every shard once (starting with the next in turn), then waits on the shard with
        the shortest wait. ``timeout=0`` never waits; ``None`` (or a timeout longer than
        ``MAX_DURATION``) waits as long as it takes; when even the shortest wait is longer
        than ``timeout``, returns False at once. A shard whose node fails is skipped;
        ``BackendError`` is raised only when no shard answers.
        """
        permits = _check_permits(permits)
        max_wait = _max_wait(timeout)
        seconds = None if max_wait < 0 else max_wait / 1e6
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds

        count = len(self._shards)
        start = self._next
        self._next = (start + 1) % count
        waits: dict[int, int] = {}  # shard -> microseconds until it could grant
        queued: list[int] = []  # shards where tasks of this process already wait
        refusals: list[LimiterError] = []  # why the other shards cannot serve this request
        for i in [(start + k) % count for k in range(count)]:
            if self._waiting[i]:
                queued.append(i)  # do not pass the tasks waiting there
                continue
            try:
                attempt = await self._backend.try_acquire(self._shards[i].name, permits)
            except (NotConfiguredError, InvalidArgumentError, BackendError) as exc:
                refusals.append(exc)  # no config, permits > this shard's budget, node down
                continue
            if attempt.granted:
                self._last = i
                return True
            waits[i] = attempt.wait
        if not waits and not queued:
            raise _most_telling(refusals, permits, count)
        if seconds == 0:
            return False
        if waits:
            best = min(waits, key=waits.__getitem__)
            if deadline is not None and loop.time() + waits[best] / 1e6 > deadline:
                return False
        else:
            best = min(queued, key=self._waiting.__getitem__)
        remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
        self._waiting[best] += 1
        try:
            granted = await self._shards[best].try_acquire(permits, timeout=remaining)
        finally:
            self._waiting[best] -= 1
        if granted:
            self._last = best
        return granted

    async def available_permits(self) -> int:
        """Free permits summed over the shards (a single request can use one shard's only)."""
        counts = await asyncio.gather(*(shard.available_permits() for shard in self._shards))
        return sum(counts)

    async def release(self, permits: int) -> None:
        """Hands back ``permits``: the most recent grants of the shard this object granted
        from last, then of the following shards, until ``permits`` are handed back."""
        count = len(self._shards)
        left = _check_permits(permits)
        for k in range(count):
            if left <= 0:
                break
            name = self._shards[(self._last + k) % count].name
            left -= await self._backend.release(name, left)

    # -- lifetime ------------------------------------------------------------------------------

    async def delete(self) -> bool:
        """Deletes every shard; returns whether any existed."""
        return any(await asyncio.gather(*[shard.delete() for shard in self._shards]))

    async def expire(self, ttl: Duration) -> bool:
        """Makes every shard disappear after ``ttl``; True when every shard had a config."""
        return all(await asyncio.gather(*[shard.expire(ttl) for shard in self._shards]))

    async def clear_expire(self) -> bool:
        """Removes a TTL set by :meth:`expire`; returns whether any shard had one."""
        return any(await asyncio.gather(*[shard.clear_expire() for shard in self._shards]))
