"""An aiohttp client middleware that takes a permit before every request and obeys
``Retry-After``.

>>> from aiolimit.aiohttp import RateLimitedClientMiddleware
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate(RateType.OVERALL, 100, 60)
>>> async with aiohttp.ClientSession(middlewares=[RateLimitedClientMiddleware(limiter)]) as session:
...     async with session.get("https://partner.example/orders") as response: ...

The same behaviour as :class:`aiolimit.httpx.RateLimitedTransport`: every session and process
that uses the limiter shares the partner's quota; a ``429`` (or ``503``) with ``Retry-After``
pauses every caller of the limiter in every process, and the request is sent once more after
the pause (``retry=False`` returns the response instead). With ``concurrency=sem`` each
request also holds a slot while it is in flight, until its body has been received. Needs
``pip install
'aiolimit-redis[aiohttp]'`` (aiohttp >= 3.12, which has client middlewares).
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
except ImportError as exc:
    raise missing_extra("aiolimit.aiohttp", "aiohttp") from exc

import asyncio
import logging
from typing import Any

from ._calls import DEFAULT_MAX_PAUSE, CallGuard
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight, hold_while
from ._limiter import RateLimiter
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["RateLimitedClientMiddleware"]


class RateLimitedClientMiddleware:
    """A client middleware: ``ClientSession(middlewares=[RateLimitedClientMiddleware(limiter)])``.

    ``permits`` per request; ``timeout`` (seconds; None waits as long as it takes) bounds the
    wait for a pause and a permit, after which :class:`aiolimit.RateLimited` is raised, with
    ``retry_after``. A pause lasts at most ``max_pause`` (seconds or a timedelta; 15
    minutes by default), whatever ``Retry-After`` says; a longer one is logged (logger
    ``aiolimit``) and cut to it.

    ``concurrency``: a slot of it is held from before the permit until aiohttp lets the
    response's connection go (the whole body received, or the response released: ``async
    with session.get(...)`` left), renewed meanwhile. When the slot's lease is lost before
    the response came, the request is cancelled and :class:`~aiolimit.LeaseLostError`
    raised; a loss after it is logged (aiohttp reads the body outside the middleware).
    """

    __slots__ = ("_guard",)

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int = 1,
        timeout: Duration | None = None,
        retry: bool = True,
        max_pause: Duration = DEFAULT_MAX_PAUSE,
        concurrency: ConcurrencyLimiter | None = None,
    ) -> None:
        self._guard = CallGuard(
            limiter,
            permits=permits,
            timeout=timeout,
            retry=retry,
            max_pause=max_pause,
            concurrency=concurrency,
        )

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        guard = self._guard
        response = await self._send(request, handler)
        paused = await guard.pause_for(response.status, response.headers.get("Retry-After"))
        if not (paused and guard.retry):
            return response
        response.release()
        response = await self._send(request, handler)  # after the pause, a permit of its own
        await guard.pause_for(response.status, response.headers.get("Retry-After"))
        return response

    async def _send(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        acquired = await self._guard.before_call()
        if not isinstance(acquired, InFlight):
            return await handler(request)
        response = await hold_while(acquired, handler(request))
        connection = response.connection
        if connection is None:  # released already (no body, or read to its end)
            await acquired.__aexit__(None, None, None)
        else:
            connection.add_callback(lambda: _background(acquired.__aexit__(None, None, None)))
        return response


log = logging.getLogger("aiolimit")
_background_tasks: set[asyncio.Task[Any]] = set()


def _background(releasing: Any) -> None:
    """Releases a response's slot when aiohttp releases its connection (a callback)."""
    task = asyncio.ensure_future(releasing)
    _background_tasks.add(task)
    task.add_done_callback(_released)


def _released(task: asyncio.Task[Any]) -> None:
    _background_tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("a response's concurrency slot: %s", task.exception())
