"""What every limiter shares: ``RateLimiter`` (``_limiter``) and ``ShardedRateLimiter``
(``_sharded``) are made on this base.

Everything a limiter does besides taking permits (setting the rate, lifetime, the decorator,
``async with``) lives in ``_Limiter`` and acts on the limiter's sub-limiter names: one for
``RateLimiter``, one per shard for ``ShardedRateLimiter``. Permits are taken in the engine
(``_acquire``), through a subclass's ``try_acquire`` and ``_take``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from ._acquire import Acquired
from ._awaiting import awaited
from ._breaker import Breaker
from ._checks import check_permits, max_wait_of
from ._code_config import CodeConfig, asked_again
from ._deprecated import deprecated
from ._setting import _RateSetting, gather
from ._types import (
    Duration,
    RateLimiterConfig,
    check_name,
    exceeds_max_duration,
    shown,
    to_micros,
)
from ._values import seconds
from .backends.base import Backend, breaker_of
from .errors import (
    BackendError,
    InvalidArgumentError,
    LimiterError,
    NotConfiguredError,
    RateLimited,
)

__all__ = ["_Limiter", "made_from_parts", "most_telling"]

log = logging.getLogger("aiolimit")

_L = TypeVar("_L", bound="_Limiter")
_T = TypeVar("_T")
_P = ParamSpec("_P")


class _Limiter(_RateSetting):
    """What every limiter shares: its name and backend, the set-rate methods, lifetime,
    ``acquire`` and ``async with``, on top of a subclass's sub-limiter names and
    ``try_acquire``."""

    __slots__ = ("_names", "backend", "breaker", "name", "rate_in_code")

    name: str
    """The limiter's name (read-only)."""
    backend: Backend
    """Where its state lives (read-only)."""
    breaker: Breaker
    """The circuit breaker of its calls: its name's on the backend (read-only)."""
    rate_in_code: CodeConfig[RateLimiterConfig]
    """The rate its code gives (``rate=``, :meth:`ensure_rate`; its ``config`` is None
    without one), written before its first call and again whenever the store has lost it
    (read-only)."""

    def __init__(
        self, name: str, backend: Backend, config: RateLimiterConfig | None = None
    ) -> None:
        self.name = check_name(name)
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
        self.backend = backend
        self.breaker = breaker_of(backend, self.name)
        self._names: list[str] = [self.name]  # where the state lives: one per shard
        self.rate_in_code = CodeConfig(config, self._write_config)  # (config: the code's)

    # -- permits -------------------------------------------------------------------------------

    @awaited
    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        return (await self._take(check_permits(permits), max_wait_of(timeout))).granted

    @awaited
    async def reserve(self, permits: int = 1, *, timeout: Duration | None = 0) -> Acquired:
        """Takes ``permits`` as :meth:`try_acquire` does, and returns the acquisition: true
        when granted (``retry_after`` when not). Its ``release()`` hands everything back;
        its ``settle(n)`` says what the call really cost once it is known.

        >>> acquired = await tokens.reserve(prompt_tokens + max_tokens, timeout=30)
        >>> if acquired:
        ...     response = await call_model(...)
        ...     await acquired.settle(response.usage.total_tokens)

        A grant to be settled reserves no further ahead than 10 ms (``_pacing.HORIZON``):
        while the limit binds, a process's callers ask in turn, in the order they came, and
        again when a settle of their process hands permits back (at once) or after a short
        pause (up to 250 ms: a refund elsewhere); across processes, whoever asks first is
        served first (docs/token-budgets.md).
        """
        return await self._take(check_permits(permits), max_wait_of(timeout), settled=True)

    def _take(
        self, permits: int, max_wait: int | None, *, settled: bool = False
    ) -> Coroutine[Any, Any, Acquired]:
        """Takes ``permits`` (checked) within ``max_wait`` µs through the engine: the
        :class:`Acquired`, whose refusal says when to come back (the decorator's and the
        HTTP clients' path; ``settled``: a grant the caller may settle, ``reserve()``'s)."""
        raise NotImplementedError

    @awaited
    async def acquire(self, permits: int = 1) -> None:
        """Waits until ``permits`` are granted."""
        await self.try_acquire(permits, timeout=None)

    def permits(self, permits: int) -> _Permits:
        """``async with limiter.permits(3):`` takes 3 permits, then runs the block."""
        return _Permits(self, check_permits(permits))

    @overload
    def limit(self, permits: Callable[_P, Awaitable[_T]], /) -> Callable[_P, Awaitable[_T]]: ...

    @overload
    def limit(
        self, permits: int = 1, *, timeout: Duration | None = None
    ) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]: ...

    def limit(
        self,
        permits: int | Callable[_P, Awaitable[_T]] = 1,
        *,
        timeout: Duration | None = None,
    ) -> (
        Callable[_P, Awaitable[_T]]
        | Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]
    ):
        """A decorator: every call of the async function first takes ``permits``.

        >>> @limiter.limit(timeout=5)
        ... async def call_partner(order: int) -> dict: ...
        >>> @limiter.limit                  # one permit, waiting as long as it takes
        ... async def call_other() -> dict: ...

        Waits like :meth:`acquire`; when the permits cannot be had within ``timeout``
        seconds, the call raises :class:`~aiolimit.RateLimited` (with ``retry_after`` and
        ``name``) without running the function."""
        if callable(permits):
            return self.limit()(permits)
        permits = check_permits(permits)
        max_wait = max_wait_of(timeout)  # a bad timeout fails here, not at the first call

        def decorate(func: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
            if not inspect.iscoroutinefunction(func):
                raise InvalidArgumentError(f"limit() decorates async functions, not {func!r}")

            @functools.wraps(func)
            async def limited(*args: _P.args, **kwargs: _P.kwargs) -> _T:
                acquired = await self._take(permits, max_wait)
                if not acquired:
                    raise RateLimited(self.name, acquired.retry_after)
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

    async def _with_config(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` once the rate in code is stored; when it finds the store without a
        config, that rate is written again and ``call()`` made once more."""
        code = self.rate_in_code
        if not code.stored:
            await code.store()
        try:
            return await call()
        except NotConfiguredError as lost:
            return await asked_again(lost, [(name, code) for name in self._names], call)

    @awaited
    async def wait_time(self, permits: int = 1) -> float:
        """Seconds until ``permits`` could be granted (0: now); takes nothing. For a caller
        that was refused and wants to say when to come back (``Retry-After``)."""
        permits = check_permits(permits)
        return await self._with_config(lambda: self._wait_time(permits))

    async def _wait_time(self, permits: int) -> float:
        calls = (self.backend.wait_time(name, permits) for name in self._names)
        waits = await asyncio.gather(*calls, return_exceptions=True)
        served = [wait for wait in waits if isinstance(wait, int)]
        if served:
            return seconds(min(served))
        for wait in waits:  # no shard can serve it: say why
            if isinstance(wait, BaseException) and not isinstance(wait, LimiterError):
                raise wait
        errors = [wait for wait in waits if isinstance(wait, LimiterError)]
        raise most_telling(errors, permits, len(waits))

    @awaited
    async def available_permits(self) -> int:
        """Permits a request could take now (for ``PER_CLIENT``: this client's; for a sharded
        limiter, summed over the shards, though one request is served by one shard)."""

        def counts() -> Awaitable[list[int]]:
            return gather(self.backend.available_permits(name) for name in self._names)

        return sum(await self._with_config(counts))

    # -- lifetime ------------------------------------------------------------------------------

    async def pause(self, duration: Duration) -> None:
        """No grant to anyone (every process, every client) starts before ``duration``
        seconds from now: for a partner API that answered 429 with a ``Retry-After``.
        Reservations already made move behind it (their callers queue again when they wake).
        A later pause never shortens an earlier one; :meth:`resume`, ``delete`` and
        ``set_rate`` end it.

        Every caller that slept out a reservation checks for a pause when it wakes (one
        read), in every process."""
        if exceeds_max_duration(duration):
            raise InvalidArgumentError(
                f"duration must be at most 10 years (MAX_DURATION), not {shown(duration)}"
            )
        duration_us = to_micros(duration, "duration")
        if duration_us < 0:
            raise InvalidArgumentError(f"duration must be >= 0, not {duration!r}")
        await self._with_config(
            lambda: gather(self.backend.block(name, duration_us) for name in self._names)
        )

    async def resume(self) -> bool:
        """Ends a :meth:`pause` at once, in every process; returns whether one was in force.
        Reservations it already moved behind its end stay there."""
        names = self._names
        return any(await self._with_config(lambda: gather(self.backend.unblock(n) for n in names)))

    async def cap_remaining(self, remaining: int, *, reset: Duration) -> None:
        """Caps the permits left at a provider's own count (a subclass's)."""
        raise NotImplementedError

    async def _hand_back_latest(self, permits: int) -> None:
        """Hands back ``permits`` (checked) of the most recent grants (a subclass's)."""
        raise NotImplementedError

    # -- deprecated: each warns, then does what its replacement does -------------------------

    async def block(self, duration: Duration) -> None:
        """Deprecated: :meth:`pause`."""
        deprecated("RateLimiter.block()", "RateLimiter.pause()")
        await self.pause(duration)

    async def unblock(self) -> bool:
        """Deprecated: :meth:`resume`."""
        deprecated("RateLimiter.unblock()", "RateLimiter.resume()")
        return await self.resume()

    async def sync(self, *, remaining: int, reset: Duration) -> None:
        """Deprecated: :meth:`cap_remaining`."""
        deprecated("RateLimiter.sync()", "RateLimiter.cap_remaining()")
        await self.cap_remaining(remaining, reset=reset)

    async def release(self, permits: int) -> None:
        """Deprecated: hands back ``permits`` of the most recent grants of anyone (any task,
        any process), not the caller's own. Use :meth:`Acquired.release` (of :meth:`reserve`),
        which hands back exactly its grants."""
        deprecated("RateLimiter.release(n)", "Acquired.release() (of reserve())")
        await self._hand_back_latest(check_permits(permits))

    async def delete(self) -> bool:
        """Removes the config and every client's state; returns whether anything existed."""
        return any(await gather(self.backend.delete(name) for name in self._names))

    async def expire(self, ttl: Duration) -> bool:
        """Makes the whole limiter disappear after ``ttl``, grants made meanwhile included;
        False when it has no config."""
        ttl_us = to_micros(ttl, "ttl")
        if ttl_us <= 0:
            raise InvalidArgumentError(f"ttl must be positive, not {ttl!r}")
        return all(await gather(self.backend.expire(name, ttl_us) for name in self._names))

    async def clear_expire(self) -> bool:
        """Removes a TTL set by :meth:`expire`; returns whether there was one. The grants
        keep counting for their full window. (A ``keep_alive`` sets a TTL again on the next
        grant.)"""
        return any(await gather(self.backend.clear_expire(name) for name in self._names))


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


def most_telling(refusals: list[LimiterError], permits: int, shards: int) -> LimiterError:
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


def made_from_parts(
    cls: type[_L],
    name: str,
    backend: Backend,
    breaker: Breaker,
    rate_in_code: CodeConfig[RateLimiterConfig],
) -> _L:
    """A limiter of ``cls`` made from its parts, its name not checked (``_limiter.view_of``:
    a shard, or a client's view of a limiter)."""
    limiter = cls.__new__(cls)
    limiter.name, limiter.backend, limiter.breaker = name, backend, breaker
    limiter._names = [name]
    limiter.rate_in_code = rate_in_code
    return limiter
