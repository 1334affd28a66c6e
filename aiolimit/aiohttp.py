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
the pause (``retry=False`` returns the response instead). Needs ``pip install
'aiolimit-redis[aiohttp]'`` (aiohttp >= 3.12, which has client middlewares).
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    from aiohttp import ClientHandlerType, ClientRequest, ClientResponse
except ImportError as exc:
    raise missing_extra("aiolimit.aiohttp", "aiohttp") from exc

from ._calls import DEFAULT_MAX_PAUSE, CallGuard
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
    ) -> None:
        self._guard = CallGuard(
            limiter, permits=permits, timeout=timeout, retry=retry, max_pause=max_pause
        )

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        guard = self._guard
        await guard.before_call()
        response = await handler(request)
        paused = await guard.pause_for(response.status, response.headers.get("Retry-After"))
        if not (paused and guard.retry):
            return response
        response.release()
        await guard.before_call()  # after the pause, with a permit of its own
        response = await handler(request)
        await guard.pause_for(response.status, response.headers.get("Retry-After"))
        return response
