"""An httpx transport that takes a permit before every request and obeys ``Retry-After``.

>>> from aiolimit.httpx import RateLimitedTransport
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate(RateType.OVERALL, 100, 60)
>>> async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as client:
...     await client.get("https://partner.example/orders")

Every client and process that uses the limiter shares the partner's quota. When the partner
still answers ``429`` (or ``503``) with ``Retry-After`` (seconds or an HTTP date), every caller
of the limiter, in every process, pauses that long, and the request is sent once more after
the pause (``retry=False`` returns the response instead). With ``concurrency=sem`` (a
:class:`~aiolimit.ConcurrencyLimiter`) each request also holds a slot while it is in flight:
taken before the rate permit, released when the response's body is closed. Needs
``pip install 'aiolimit-redis[httpx]'``.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    import httpx
except ImportError as exc:
    raise missing_extra("aiolimit.httpx", "httpx") from exc

from collections.abc import AsyncIterator

from ._calls import DEFAULT_MAX_PAUSE, CallGuard
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight, hold_while
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

    ``concurrency``: a slot of it is held from before the permit until the response's body
    is closed (read to the end by ``client.get``; the ``async with client.stream(...)``
    block's end), renewed meanwhile. When the slot's lease is lost before the response
    came, the request is cancelled and :class:`~aiolimit.LeaseLostError` raised; after
    it, reading the body raises it.
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
        self._transport = transport or httpx.AsyncHTTPTransport()

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        guard = self._guard
        response = await self._send(request)
        paused = await guard.pause_for(response.status_code, response.headers.get("retry-after"))
        if not (paused and guard.retry and isinstance(request.stream, httpx.ByteStream)):
            return response
        await response.aclose()
        response = await self._send(request)  # after the pause, with a permit of its own
        await guard.pause_for(response.status_code, response.headers.get("retry-after"))
        return response

    async def _send(self, request: httpx.Request) -> httpx.Response:
        acquired = await self._guard.before_call()
        sending = self._transport.handle_async_request(request)
        if not isinstance(acquired, InFlight):
            return await sending
        response = await hold_while(acquired, sending)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_HeldStream(response.stream, acquired),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


class _HeldStream(httpx.AsyncByteStream):
    """A response's body whose slot is released when it is closed."""

    __slots__ = ("_acquired", "_stream")

    def __init__(
        self, stream: httpx.AsyncByteStream | httpx.SyncByteStream, acquired: InFlight
    ) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream, self._acquired = stream, acquired

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._acquired.check()  # a lost slot: LeaseLostError, loudly
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            await self._acquired.__aexit__(None, None, None)
