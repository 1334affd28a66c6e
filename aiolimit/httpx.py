"""An httpx transport that takes a permit before every request and obeys ``Retry-After``.

>>> from aiolimit.httpx import RateLimitedTransport
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate(RateType.OVERALL, 100, 60)
>>> async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as client:
...     await client.get("https://partner.example/orders")

Every client and process that uses the limiter shares the partner's quota. When the partner
still answers ``429`` (or ``503``) with ``Retry-After`` (seconds or an HTTP date), every caller
of the limiter, in every process, pauses that long, and the request is sent once more after
the pause (``retry=False`` returns the response instead). Needs
``pip install 'aiolimit-redis[httpx]'``.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    import httpx
except ImportError as exc:
    raise missing_extra("aiolimit.httpx", "httpx") from exc

from ._calls import DEFAULT_MAX_PAUSE, CallGuard
from ._limiter import RateLimiter
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["RateLimitedTransport"]


class RateLimitedTransport(httpx.AsyncBaseTransport):
    """Wraps ``transport`` (default: ``httpx.AsyncHTTPTransport()``); see the module.

    ``permits`` per request; ``timeout`` (seconds; None waits as long as it takes) bounds the
    wait for a pause and a permit, after which :class:`aiolimit.RateLimited` is raised, with
    ``retry_after``. A pause lasts at most ``max_pause`` (seconds or a timedelta; 15
    minutes by default), whatever ``Retry-After`` says; a longer one is logged (logger
    ``aiolimit``) and cut to it. A request whose body is a stream is not sent again.
    """

    __slots__ = ("_guard", "_transport")

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        permits: int = 1,
        timeout: Duration | None = None,
        retry: bool = True,
        max_pause: Duration = DEFAULT_MAX_PAUSE,
    ) -> None:
        self._guard = CallGuard(
            limiter, permits=permits, timeout=timeout, retry=retry, max_pause=max_pause
        )
        self._transport = transport or httpx.AsyncHTTPTransport()

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        guard = self._guard
        await guard.before_call()
        response = await self._transport.handle_async_request(request)
        paused = await guard.pause_for(response.status_code, response.headers.get("retry-after"))
        if not (paused and guard.retry and isinstance(request.stream, httpx.ByteStream)):
            return response
        await response.aclose()
        await guard.before_call()  # after the pause, with a permit of its own
        response = await self._transport.handle_async_request(request)
        await guard.pause_for(response.status_code, response.headers.get("retry-after"))
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()
