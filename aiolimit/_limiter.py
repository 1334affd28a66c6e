"""The limiters: ``RateLimiter`` and ``ShardedRateLimiter``, on one base.

A permit's path: ``RateLimiter.try_acquire`` checks its arguments, asks the backend once
(``Backend.try_acquire``: one Lua script, or its Python twin), and sleeps until a reserved
slot starts. Everything else a limiter does (setting the rate, lifetime, ``async with``) lives
in ``_Limiter`` and acts on the limiter's sub-limiter names: one for ``RateLimiter``, one
per shard for ``ShardedRateLimiter``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import ParamSpec, TypeVar

from . import _observe
from ._observe import Observer
from ._types import (
    MAX_RATE,
    Algorithm,
    Duration,
    Rate,
    RateLimiterConfig,
    RateType,
    check_name,
    exceeds_max_duration,
    shown,
    to_micros,
)
from .backends.base import Backend, Grant, SetMode
from .errors import (
    BackendError,
    InvalidArgumentError,
    LimiterError,
    NotConfiguredError,
    RateLimited,
)

__all__ = ["RateLimiter", "ShardedRateLimiter"]

log = logging.getLogger("aiolimit")

MAX_SHARDS = 256
_SLOTS = 16384  # Redis Cluster's hash slots


def _max_wait(timeout: Duration | None) -> int | None:
    """A public timeout as the longest wait in microseconds; None waits as long as it takes.

    A timeout longer than MAX_DURATION (infinity included) is no limit: no interval is that
    long, so no wait can be."""
    if timeout is None or exceeds_max_duration(timeout):
        return None
    max_wait = to_micros(timeout, "timeout")
    if max_wait < 0:
        raise InvalidArgumentError(f"timeout must be >= 0 or None, not {timeout!r}")
    return max_wait


def _check_permits(permits: object) -> int:
    if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= MAX_RATE:
        raise InvalidArgumentError(
            f"permits must be an int from 1 to {MAX_RATE} (MAX_RATE), not {shown(permits)}"
        )
    return permits


async def _sleep_out(backend: Backend, name: str, grant: Grant) -> None:
    """Sleeps until a reserved grant starts; a cancelled sleeper hands its grant back."""
    try:
        await asyncio.sleep(grant.starts_in / 1e6)
    except asyncio.CancelledError:
        backend.hand_back(name, grant.member)
        raise


async def _sleep_observed(
    observer: Observer, backend: Backend, name: str, grant: Grant, label: str
) -> float:
    """Sleeps out a reservation as the observer's ``label`` waiting; returns the seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    observer.queued(label, 1)
    try:
        await _sleep_out(backend, name, grant)
    finally:
        observer.queued(label, -1)
    return loop.time() - began


async def _take(
    backend: Backend,
    name: str,
    permits: int,
    max_wait: int | None,
    observer: Observer | None,
    label: str,
) -> float | None:
    """One attempt on ``name``, sleeping out a reservation (and asking again if a block()
    came meanwhile): the seconds slept (0.0: granted at once), or None when refused. An
    observer sees the reservation waiting under ``label``, the limiter's own name. Every
    limiter's ``try_acquire`` comes here."""
    waited = 0.0
    while True:
        attempt = await backend.try_acquire(name, permits, max_wait)
        if not isinstance(attempt, Grant):
            return None
        if attempt.starts_in <= 0:
            return waited
        if observer is None:
            await _sleep_out(backend, name, attempt)
            waited += attempt.starts_in / 1e6
        else:
            waited += await _sleep_observed(observer, backend, name, attempt, label)
        if not await _moved_by_block(backend, name, permits, attempt):
            return waited
        if max_wait is not None:
            max_wait = max(max_wait - attempt.starts_in, 0)  # the time it slept


async def _moved_by_block(backend: Backend, name: str, permits: int, grant: Grant) -> bool:
    """After sleeping out a reservation: whether a block() came meanwhile (from any process,
    the first block too), in which case the reservation is handed back, to be asked for again
    behind the block (one read)."""
    until = await backend.blocked_until(name)
    if until is None or until <= grant.starts_at:
        return False
    await backend.release(name, permits, grant.member)
    return True


_L = TypeVar("_L", bound="_Limiter")
_T = TypeVar("_T")
_P = ParamSpec("_P")

# Names this process has blocked (block()), or expects to be blocked (the HTTP clients'
# limiters): their sleepers check for a block when they wake. Other names' sleepers check once
# a grant says the limiter has been blocked.
_blocked_here: set[str] = set()

# Configs try_set_rate found different from the one asked for, each warned about once.
_warned: set[tuple[str, RateLimiterConfig, RateLimiterConfig]] = set()


class _Limiter:
    """What every limiter shares: its name and backend, the set-rate methods, lifetime,
    ``acquire`` and ``async with``, on top of a subclass's sub-limiter names and
    ``try_acquire``."""

    __slots__ = ("_backend", "_name", "_names")

    def __init__(self, name: str, backend: Backend) -> None:
        self._name = check_name(name)
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
        self._backend = backend
        self._names: list[str] = [self._name]  # where the state lives: one per shard

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend(self) -> Backend:
        return self._backend

    # -- configuration -------------------------------------------------------------------------

    def _configs(self, config: RateLimiterConfig) -> list[RateLimiterConfig]:
        """The config of each sub-limiter."""
        return [config]

    async def _set(
        self,
        mode: SetMode,
        config: RateLimiterConfig,
        keep_state: bool,
    ) -> list[bool]:
        configs = self._configs(config)
        return await _gather(
            self._backend.set_rate(name, sub, mode, keep_state)
            for name, sub in zip(self._names, configs, strict=True)
        )

    async def try_set_rate(
        self,
        rate_type: RateType | str,
        rate: int | Sequence[Rate],
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        keep_alive: Duration | None = None,
    ) -> bool:
        """Sets the rate only where the limiter has none; returns whether it did.

        ``rate`` is an int with its ``interval``, or a sequence of :class:`Rate` (every one
        must allow a grant; :meth:`Rate.parse` reads them from text) without one.
        ``min_spacing`` keeps the starts of consecutive grants at least that far apart.

        When a stored config differs from the one asked for (another process, or an earlier
        run, set another rate), it stays, and a warning is logged once per process."""
        asked = RateLimiterConfig.build(
            rate_type, rate, interval, keep_alive, algorithm=algorithm, min_spacing=min_spacing
        )
        written = await self._set("try", asked, True)
        if not all(written):
            stored = await self.get_config()
            if stored is not None and stored != asked and (seen := (self._name, asked, stored)):
                if seen in _warned:
                    return any(written)
                _warned.add(seen)
                log.warning(
                    "try_set_rate(%r): kept the stored config %s, not %s (set_rate replaces it)",
                    self._name,
                    stored,
                    asked,
                )
        return any(written)

    async def set_rate(
        self,
        rate_type: RateType | str,
        rate: int | Sequence[Rate],
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        keep_alive: Duration | None = None,
        keep_state: bool = False,
    ) -> None:
        """Sets the rate (as :meth:`try_set_rate` takes it), replacing any config. Without
        ``keep_state`` every budget restarts full; with it, what was granted keeps counting
        (a change of rate type or algorithm always clears the state)."""
        config = RateLimiterConfig.build(
            rate_type, rate, interval, keep_alive, algorithm=algorithm, min_spacing=min_spacing
        )
        await self._set("set", config, keep_state)

    async def update_rate(
        self,
        rate_type: RateType | str,
        rate: int | Sequence[Rate],
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        keep_alive: Duration | None = None,
        keep_state: bool = True,
    ) -> bool:
        """Like :meth:`set_rate`, but only when a config exists (returns False otherwise)."""
        config = RateLimiterConfig.build(
            rate_type, rate, interval, keep_alive, algorithm=algorithm, min_spacing=min_spacing
        )
        return all(await self._set("update", config, keep_state))

    async def get_config(self) -> RateLimiterConfig | None:
        """The limiter's config (for a sharded one, the shards' rates summed); None unless it
        has one."""
        configs = await _gather(self._backend.get_config(name) for name in self._names)
        if any(config is None for config in configs):
            return None
        first = configs[0]
        assert first is not None
        if len(configs) == 1:
            return first
        rates = tuple(
            Rate(sum(c.rates[i].permits for c in configs if c is not None), rate.interval)
            for i, rate in enumerate(first.rates)
        )
        spacing = first.min_spacing and first.min_spacing / len(configs)
        return replace(first, rate=rates[0].permits, rates=rates, min_spacing=spacing)

    # -- permits -------------------------------------------------------------------------------

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        raise NotImplementedError

    async def acquire(self, permits: int = 1) -> None:
        """Waits until ``permits`` are granted."""
        await self.try_acquire(permits, timeout=None)

    def permits(self, permits: int) -> _Permits:
        """``async with limiter.permits(3):`` takes 3 permits, then runs the block."""
        return _Permits(self, _check_permits(permits))

    def limit(
        self, permits: int = 1, *, timeout: Duration | None = None
    ) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]:
        """A decorator: every call of the async function first takes ``permits``.

        >>> @limiter.limit(timeout=5)
        ... async def call_partner(order: int) -> dict: ...

        Waits like :meth:`acquire`; when the permits cannot be had within ``timeout``
        seconds, the call raises :class:`~aiolimit.RateLimited` (with ``retry_after`` and
        ``name``) without running the function."""
        permits = _check_permits(permits)
        _max_wait(timeout)  # a bad timeout fails here, not at the first call

        def decorate(func: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
            if not inspect.iscoroutinefunction(func):
                raise InvalidArgumentError(f"limit() decorates async functions, not {func!r}")

            @functools.wraps(func)
            async def limited(*args: _P.args, **kwargs: _P.kwargs) -> _T:
                if not await self.try_acquire(permits, timeout=timeout):
                    raise RateLimited(self._name, await self.wait_time(permits))
                return await func(*args, **kwargs)

            return limited

        return decorate

    async def __aenter__(self: _L) -> _L:
        await self.try_acquire(1, timeout=None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``permits`` could be granted (0: now); takes nothing. For a caller
        that was refused and wants to say when to come back (``Retry-After``)."""
        permits = _check_permits(permits)
        calls = (self._backend.wait_time(name, permits) for name in self._names)
        waits = await asyncio.gather(*calls, return_exceptions=True)
        served = [wait for wait in waits if isinstance(wait, int)]
        if served:
            return min(served) / 1e6
        for wait in waits:  # no shard can serve it: say why
            if isinstance(wait, BaseException) and not isinstance(wait, LimiterError):
                raise wait
        errors = [wait for wait in waits if isinstance(wait, LimiterError)]
        raise _most_telling(errors, permits, len(waits))

    async def available_permits(self) -> int:
        """Permits a request could take now (for ``PER_CLIENT``: this client's; for a sharded
        limiter, summed over the shards, though one request is served by one shard)."""
        return sum(await _gather(self._backend.available_permits(n) for n in self._names))

    # -- lifetime ------------------------------------------------------------------------------

    def _expect_blocks(self) -> None:
        """From now on, this process's callers that sleep out a reservation check for a
        ``block()`` (from any process) when they wake: one read each."""
        _blocked_here.update(self._names)

    async def block(self, duration: Duration) -> None:
        """No grant to anyone (every process, every client) starts before ``duration``
        seconds from now: for a partner API that answered 429 with a ``Retry-After``.
        Reservations already made move behind it (their callers queue again when they wake).
        A later block never shortens an earlier one; ``delete`` and ``set_rate`` clear it.

        Sleeping callers check for a block when they wake (one read) where blocks are
        expected: in this process once it has blocked the limiter, for the HTTP clients'
        limiters, and once a grant said the limiter had been blocked before."""
        if exceeds_max_duration(duration):
            raise InvalidArgumentError(
                f"duration must be at most 10 years (MAX_DURATION), not {shown(duration)}"
            )
        duration_us = to_micros(duration, "duration")
        if duration_us < 0:
            raise InvalidArgumentError(f"duration must be >= 0, not {duration!r}")
        self._expect_blocks()
        await _gather(self._backend.block(name, duration_us) for name in self._names)

    async def unblock(self) -> bool:
        """Ends a :meth:`block` at once, in every process; returns whether one was in force.
        Reservations it already moved behind its end stay there."""
        return any(await _gather(self._backend.unblock(name) for name in self._names))

    async def delete(self) -> bool:
        """Removes the config and every client's state; returns whether anything existed."""
        return any(await _gather(self._backend.delete(name) for name in self._names))

    async def expire(self, ttl: Duration) -> bool:
        """Makes the whole limiter disappear after ``ttl``, grants made meanwhile included;
        False when it has no config."""
        ttl_us = to_micros(ttl, "ttl")
        if ttl_us <= 0:
            raise InvalidArgumentError(f"ttl must be positive, not {ttl!r}")
        return all(await _gather(self._backend.expire(name, ttl_us) for name in self._names))

    async def clear_expire(self) -> bool:
        """Removes a TTL set by :meth:`expire`; returns whether there was one. The grants
        keep counting for their full window. (A ``keep_alive`` sets a TTL again on the next
        grant.)"""
        return any(await _gather(self._backend.clear_expire(name) for name in self._names))


async def _gather(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    return list(await asyncio.gather(*calls))


class _Permits:
    """``async with limiter.permits(n):``: takes ``n`` permits on entry."""

    __slots__ = ("_limiter", "_permits")

    def __init__(self, limiter: _Limiter, permits: int) -> None:
        self._limiter = limiter
        self._permits = permits

    async def __aenter__(self) -> None:
        await self._limiter.try_acquire(self._permits, timeout=None)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class RateLimiter(_Limiter):
    """A named, distributed rate limiter: at most ``rate`` permits in any sliding ``interval``.

    >>> limiter = RateLimiter("partner-api", RedisBackend(Redis()))
    >>> await limiter.try_set_rate(RateType.OVERALL, 100, timedelta(hours=1))
    >>> async with limiter:          # waits for one permit
    ...     await call_partner()
    >>> if not await limiter.try_acquire(3, timeout=2.5):
    ...     raise TooBusy(retry_after=await limiter.wait_time(3))

    Waiting is exact and fair: a request that cannot be served now is given the first slot
    in which enough permits are free, after every request that asked before it, in any
    process, and sleeps until then. Objects are cheap; create one wherever convenient.
    """

    __slots__ = ()

    @classmethod
    def _shard(cls, name: str, backend: Backend) -> RateLimiter:
        """A sub-limiter of a ShardedRateLimiter: its name holds a NUL, which no plain
        limiter's may, so no plain limiter can share its state."""
        limiter = cls.__new__(cls)
        limiter._name = name
        limiter._backend = backend
        limiter._names = [name]
        return limiter

    def __repr__(self) -> str:
        return f"RateLimiter({self._name!r}, {type(self._backend).__name__})"

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        """Takes ``permits`` if they can be had within ``timeout`` seconds.

        ``timeout=0`` makes one attempt; ``None`` waits as long as it takes, and so does any
        timeout longer than ``MAX_DURATION`` (10 years; ``math.inf`` included). When the
        permits will not be free within the timeout, returns False at once; otherwise they are
        reserved and this sleeps until they are free, then returns True. A negative or NaN
        timeout raises InvalidArgumentError.
        """
        permits = _check_permits(permits)
        max_wait = _max_wait(timeout)
        observer = _observe.current  # None unless aiolimit.observe() attached one
        try:
            waited = await _take(self._backend, self._name, permits, max_wait, observer, self._name)
        except LimiterError as exc:
            if observer is not None:
                observer.failed(self._name, permits, exc)
            raise
        if observer is not None:
            if waited is None:
                observer.refused(self._name, permits)
            else:
                observer.granted(self._name, permits, waited)
        return waited is not None

    async def release(self, permits: int) -> None:
        """Hands back ``permits`` from the most recent grants, as if they had not happened."""
        await self._backend.release(self._name, _check_permits(permits))


# -- sharding -------------------------------------------------------------------------------------


def _split_rate(rate: int, shards: int) -> list[int]:
    """Each shard's budget: ``rate // shards``, the remainder spread one by one over the
    first shards, so the budgets sum to ``rate`` exactly (10 over 3: 4, 3, 3)."""
    if rate < shards:
        raise InvalidArgumentError(
            f"a rate of {rate} cannot be split over {shards} shards: every shard needs a "
            f"budget of at least 1 permit (use a rate >= {shards} or fewer shards)"
        )
    base, extra = divmod(rate, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def _shard_names(name: str, shards: int, backend: Backend) -> list[str]:
    """The sub-limiters' names: ``f"{name}\\x00shard{i}"``, on a store spread over slots
    (``backend.slot``) suffixed ``.<n>`` when needed so that shard ``i``'s slot lies near the
    middle of the ``i``-th of ``shards`` equal parts of the slot space. ``redis-cli --cluster
    create`` gives M masters M equal slot ranges, so with ``shards <= M`` every shard lands on
    its own master. The names depend only on the name, the shard count and the store's key
    layout: every process computes the same ones. No plain limiter's name may hold a NUL, so
    no plain limiter can be (or touch) a shard.
    """
    base = [f"{name}\x00shard{i}" for i in range(shards)]
    if backend.slot(base[0]) is None:
        return base
    part = _SLOTS / shards
    reach = max(part / 4, 1.0)
    names = []
    for i, candidate in enumerate(base):
        middle = part * (i + 0.5)
        chosen = candidate
        for n in range(1, 200_000):  # about 2 * shards tries on average
            if abs((backend.slot(chosen) or 0) - middle) <= reach:
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


class ShardedRateLimiter(_Limiter):
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
    - Minimum per-shard rate: ``rate >= shards`` (else ``InvalidArgumentError``). Small shard
      budgets waste more to fragmentation; keep ``rate / shards`` well above the typical
      request.
    - ``shards`` is part of the limiter's identity (it picks the shard names). Processes
      using different shard counts for one name each admit up to the rate; change it only
      together with the name, or with every user stopped.
    - ``PER_CLIENT`` gives each client id a budget of ``rate`` split the same way.
    """

    __slots__ = ("_last", "_next", "_shards", "_waiting")

    def __init__(self, name: str, backend: Backend, *, shards: int) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise InvalidArgumentError(f"shards must be an int >= 1, not {shards!r}")
        if shards > MAX_SHARDS:
            raise InvalidArgumentError(f"shards must be at most {MAX_SHARDS}, not {shards}")
        super().__init__(name, backend)
        self._names = _shard_names(self._name, shards, backend)
        self._shards = [RateLimiter._shard(n, backend) for n in self._names]
        self._next = random.randrange(shards)
        self._last = 0  # the shard of this object's latest grant, where release starts
        self._waiting = [0] * shards  # this object's tasks waiting on each shard

    @property
    def shards(self) -> Sequence[RateLimiter]:
        """The sub-limiters, one per shard."""
        return tuple(self._shards)

    def __repr__(self) -> str:
        return (
            f"ShardedRateLimiter({self._name!r}, {type(self._backend).__name__}, "
            f"shards={len(self._shards)})"
        )

    def _configs(self, config: RateLimiterConfig) -> list[RateLimiterConfig]:
        """Each shard gets its share of every rate, and a spacing as many times longer as
        there are shards (so that the shards together keep the spacing on average)."""
        shards = len(self._shards)
        shares = [_split_rate(rate.permits, shards) for rate in config.rates]
        spacing = config.min_spacing and config.min_spacing * shards
        configs = []
        for i in range(shards):
            rates = tuple(
                Rate(share[i], rate.interval)
                for share, rate in zip(shares, config.rates, strict=True)
            )
            configs.append(replace(config, rate=rates[0].permits, rates=rates, min_spacing=spacing))
        return configs

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
        observer = _observe.current
        if observer is None:
            return await self._try_acquire(permits, max_wait, None) is not None
        try:
            waited = await self._try_acquire(permits, max_wait, observer)
        except LimiterError as exc:
            observer.failed(self._name, permits, exc)
            raise
        if waited is None:
            observer.refused(self._name, permits)
            return False
        observer.granted(self._name, permits, waited)
        return True

    async def _try_acquire(
        self, permits: int, max_wait: int | None, observer: Observer | None
    ) -> float | None:
        """The seconds a grant waited (0.0: at once), or None when refused."""
        seconds = None if max_wait is None else max_wait / 1e6
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
                attempt = await self._backend.try_acquire(self._names[i], permits)
            except (NotConfiguredError, InvalidArgumentError, BackendError) as exc:
                refusals.append(exc)  # no config, permits > this shard's budget, node down
                continue
            if isinstance(attempt, Grant):
                self._last = i
                return 0.0
            waits[i] = attempt.retry_in
        if not waits and not queued:
            raise _most_telling(refusals, permits, count)
        if seconds == 0:
            return None
        if waits:
            best = min(waits, key=waits.__getitem__)
            if deadline is not None and loop.time() + waits[best] / 1e6 > deadline:
                return None
        else:
            best = min(queued, key=self._waiting.__getitem__)
        remaining = None if deadline is None else _max_wait(max(deadline - loop.time(), 0.0))
        self._waiting[best] += 1
        try:
            waited = await _take(
                self._backend, self._names[best], permits, remaining, observer, self._name
            )
        finally:
            self._waiting[best] -= 1
        if waited is not None:
            self._last = best
        return waited

    async def release(self, permits: int) -> None:
        """Hands back ``permits``: the most recent grants of the shard this object granted
        from last, then of the following shards, until ``permits`` are handed back."""
        count = len(self._shards)
        left = _check_permits(permits)
        for k in range(count):
            if left <= 0:
                break
            left -= await self._backend.release(self._names[(self._last + k) % count], left)
