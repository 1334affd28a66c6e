from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TypeVar

from ._types import (
    MAX_RATE,
    Duration,
    RateLimiterConfig,
    RateType,
    check_name,
    exceeds_max_duration,
    shown,
    to_micros,
)
from .backends.base import Attempt, Backend
from .errors import InvalidArgumentError

__all__ = ["RateLimiter"]


async def _sleep_out(backend: Backend, name: str, attempt: Attempt) -> None:
    """Sleeps until a reserved grant starts; a cancelled sleeper hands its grant back."""
    try:
        await asyncio.sleep(attempt.wait / 1e6)
    except asyncio.CancelledError:
        assert attempt.grant is not None
        backend.hand_back(name, attempt.grant)
        raise


def _max_wait(timeout: Duration | None) -> int:
    """A public timeout as the longest wait in microseconds; -1 waits as long as it takes.

    A timeout longer than MAX_DURATION (infinity included) is no limit: no interval is that
    long, so no wait can be."""
    if timeout is None or exceeds_max_duration(timeout):
        return -1
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


_A = TypeVar("_A", bound="_Acquiring")


class _Acquiring:
    """``acquire`` and ``async with`` (one permit), on top of a subclass's ``try_acquire``."""

    __slots__ = ()

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        raise NotImplementedError

    async def acquire(self, permits: int = 1) -> None:
        """Waits until ``permits`` are granted."""
        await self.try_acquire(permits, timeout=None)

    async def __aenter__(self: _A) -> _A:
        await self.try_acquire(1, timeout=None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class RateLimiter(_Acquiring):
    """A named, distributed rate limiter: at most ``rate`` permits in any sliding ``interval``.

    >>> limiter = RateLimiter("partner-api", RedisBackend(Redis()))
    >>> await limiter.try_set_rate(RateType.OVERALL, 100, timedelta(hours=1))
    >>> async with limiter:          # waits for one permit
    ...     await call_partner()
    >>> if not await limiter.try_acquire(3, timeout=2.5):
    ...     raise TooBusy()

    Waiting is exact and fair: a request that cannot be served now is given the first slot
    in which enough permits are free, after every request that asked before it, in any
    process, and sleeps until then. Objects are cheap; create one wherever convenient.
    """

    __slots__ = ("_backend", "_name")

    def __init__(self, name: str, backend: Backend) -> None:
        name = check_name(name)
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
        self._name = name
        self._backend = backend

    @classmethod
    def _shard(cls, name: str, backend: Backend) -> RateLimiter:
        """A sub-limiter of a ShardedRateLimiter: its name holds a NUL, which no plain
        limiter's may, so no plain limiter can share its state."""
        limiter = cls.__new__(cls)
        limiter._name = name
        limiter._backend = backend
        return limiter

    @property
    def name(self) -> str:
        return self._name

    @property
    def backend(self) -> Backend:
        return self._backend

    def __repr__(self) -> str:
        return f"RateLimiter({self._name!r}, {type(self._backend).__name__})"

    # -- configuration -------------------------------------------------------------------------

    async def try_set_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
    ) -> bool:
        """Sets the rate only if the limiter has none; returns whether it did."""
        config = RateLimiterConfig.build(rate_type, rate, interval, keep_alive)
        return await self._backend.set_rate(self._name, config, "try", True)

    async def set_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
        keep_state: bool = False,
    ) -> None:
        """Sets the rate, replacing any config. Without ``keep_state`` every budget restarts
        full; with it, grants still inside the new window keep counting."""
        config = RateLimiterConfig.build(rate_type, rate, interval, keep_alive)
        await self._backend.set_rate(self._name, config, "set", keep_state)

    async def update_rate(
        self,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        *,
        keep_alive: Duration | None = None,
        keep_state: bool = True,
    ) -> bool:
        """Like :meth:`set_rate`, but only when a config exists (returns False otherwise).
        A change of rate type always clears the state."""
        config = RateLimiterConfig.build(rate_type, rate, interval, keep_alive)
        return await self._backend.set_rate(self._name, config, "update", keep_state)

    async def get_config(self) -> RateLimiterConfig | None:
        return await self._backend.get_config(self._name)

    # -- permits -------------------------------------------------------------------------------

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        """Takes ``permits`` if they can be had within ``timeout`` seconds.

        ``timeout=0`` makes one attempt; ``None`` waits as long as it takes, and so does any
        timeout longer than ``MAX_DURATION`` (10 years; ``math.inf`` included). When the
        permits will not be free within the timeout, returns False at once; otherwise they are
        reserved and this sleeps until they are free, then returns True. A negative or NaN
        timeout raises InvalidArgumentError.
        """
        permits = _check_permits(permits)
        attempt = await self._backend.try_acquire(self._name, permits, _max_wait(timeout))
        if not attempt.granted:
            return False
        if attempt.wait > 0:
            await _sleep_out(self._backend, self._name, attempt)
        return True

    async def available_permits(self) -> int:
        """Permits a request could take now (for ``PER_CLIENT``: this client's)."""
        return await self._backend.available_permits(self._name)

    async def release(self, permits: int) -> None:
        """Hands back ``permits`` from the most recent grants, as if they had not happened."""
        await self._backend.release(self._name, _check_permits(permits))

    # -- lifetime ------------------------------------------------------------------------------

    async def delete(self) -> bool:
        """Removes the config and every client's state; returns whether anything existed."""
        return await self._backend.delete(self._name)

    async def expire(self, ttl: Duration) -> bool:
        """Makes the whole limiter disappear after ``ttl``, grants made meanwhile included;
        False when it has no config."""
        ttl_us = to_micros(ttl, "ttl")
        if ttl_us <= 0:
            raise InvalidArgumentError(f"ttl must be positive, not {ttl!r}")
        return await self._backend.expire(self._name, ttl_us)

    async def clear_expire(self) -> bool:
        """Removes a TTL set by :meth:`expire`; returns whether there was one. The grants
        keep counting for their full window. (A ``keep_alive`` sets a TTL again on the next
        grant.)"""
        return await self._backend.clear_expire(self._name)
