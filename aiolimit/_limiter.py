from __future__ import annotations

import asyncio
import random
from collections import deque
from types import TracebackType

from ._types import Duration, RateLimiterConfig, RateType, to_micros, to_seconds
from .backends.base import Attempt, Backend
from .errors import InvalidArgumentError

__all__ = ["RateLimiter"]


class _WaitQueue:
    """The tasks of this process waiting on one limiter, served first come, first served.

    Only the head of the queue talks to the backend: it sleeps exactly until the wait the
    backend returned, tries again, and on success passes its turn to the next task. The
    other tasks wait on a future, so a request for many permits is never overtaken by a
    stream of small ones from this process.
    """

    __slots__ = ("__weakref__", "_backend", "_name", "_not_before", "_turns")

    def __init__(self, backend: Backend, name: str) -> None:
        self._backend = backend
        self._name = name
        self._turns: deque[asyncio.Future[bool]] = deque()
        # Loop time before which no permit can be free (from the last grant that left none).
        self._not_before = 0.0

    async def acquire(self, permits: int, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        wake = 0.0
        if not self._turns:
            attempt = await self._attempt(permits)
            if attempt.granted:
                self._note(attempt, loop)
                return True
            wake = loop.time() + attempt.wait / 1e6
            if deadline is not None and wake > deadline:
                return False
        elif timeout == 0:
            return False  # others are queued ahead of this request

        turn: asyncio.Future[bool] = loop.create_future()
        self._turns.append(turn)
        try:
            if self._turns[0] is not turn and not await self._my_turn(turn, deadline, loop):
                return False
            while True:
                wake = max(wake, self._not_before)
                if deadline is not None and wake > deadline:
                    return False
                delay = wake - loop.time()
                if delay > 0:
                    # A little jitter keeps processes woken by one expiry from arriving at once.
                    await asyncio.sleep(delay + random.random() * min(0.001, delay * 0.05))
                attempt = await self._attempt(permits)
                if attempt.granted:
                    self._note(attempt, loop)
                    return True
                wake = loop.time() + attempt.wait / 1e6
        finally:
            self._leave(turn)

    async def _my_turn(
        self, turn: asyncio.Future[bool], deadline: float | None, loop: asyncio.AbstractEventLoop
    ) -> bool:
        if deadline is None:
            return await turn
        timer = loop.call_at(deadline, _settle, turn, False)
        try:
            return await turn
        finally:
            timer.cancel()

    def _leave(self, turn: asyncio.Future[bool]) -> None:
        was_head = self._turns[0] is turn
        self._turns.remove(turn)
        if was_head and self._turns:
            _settle(self._turns[0], True)

    def _note(self, attempt: Attempt, loop: asyncio.AbstractEventLoop) -> None:
        self._not_before = loop.time() + attempt.next_free / 1e6 if attempt.left <= 0 else 0.0

    async def _attempt(self, permits: int) -> Attempt:
        # Backends hand back a grant whose caller was cancelled while the call was in flight.
        return await self._backend.try_acquire(self._name, permits)


def _settle(turn: asyncio.Future[bool], value: bool) -> None:
    if not turn.done():
        turn.set_result(value)


def _check_permits(permits: object) -> int:
    if isinstance(permits, bool) or not isinstance(permits, int) or permits < 1:
        raise InvalidArgumentError(f"permits must be an int >= 1, not {permits!r}")
    return permits


class RateLimiter:
    """A named, distributed rate limiter: at most ``rate`` permits in any sliding ``interval``.

    >>> limiter = RateLimiter("partner-api", RedisBackend(Redis()))
    >>> await limiter.try_set_rate(RateType.OVERALL, 100, timedelta(hours=1))
    >>> async with limiter:          # waits for one permit
    ...     await call_partner()
    >>> if not await limiter.try_acquire(3, timeout=2.5):
    ...     raise TooBusy()

    Objects are cheap; every ``RateLimiter`` with the same name on the same backend shares
    one queue of waiting tasks, served first come, first served.
    """

    __slots__ = ("_backend", "_name", "_queue")

    def __init__(self, name: str, backend: Backend) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"name must be a non-empty str, not {name!r}")
        if not isinstance(backend, Backend):
            raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
        self._name = name
        self._backend = backend
        queue = backend._queues.get(name)
        if queue is None:
            queue = backend._queues[name] = _WaitQueue(backend, name)
        self._queue: _WaitQueue = queue

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

        ``timeout=0`` makes one attempt; ``None`` waits as long as it takes. When the
        backend says the wait is longer than the time left, returns False at once.
        """
        permits = _check_permits(permits)
        seconds = None
        if timeout is not None:
            seconds = to_seconds(timeout, "timeout")
            if seconds < 0:
                raise InvalidArgumentError(f"timeout must be >= 0 or None, not {timeout!r}")
        return await self._queue.acquire(permits, seconds)

    async def acquire(self, permits: int = 1) -> None:
        """Waits until ``permits`` are granted."""
        await self.try_acquire(permits, timeout=None)

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
        """Makes the whole limiter disappear after ``ttl``; False when it has no config."""
        ttl_us = to_micros(ttl, "ttl")
        if ttl_us <= 0:
            raise InvalidArgumentError(f"ttl must be positive, not {ttl!r}")
        return await self._backend.expire(self._name, ttl_us)

    async def clear_expire(self) -> bool:
        """Removes a TTL set by :meth:`expire`; returns whether there was one.
        (A ``keep_alive`` sets it again on the next grant.)"""
        return await self._backend.clear_expire(self._name)

    # -- async with ----------------------------------------------------------------------------

    async def __aenter__(self) -> RateLimiter:
        await self.try_acquire(1, timeout=None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None
