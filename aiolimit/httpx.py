"""An httpx transport that takes a permit before every request and obeys ``Retry-After``.

>>> from aiolimit.httpx import RateLimitedTransport
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate(RateType.OVERALL, 100, 60)
>>> async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as client:
...     await client.get("https://partner.example/orders")

Every client and process that uses the limiter shares the partner's quota. When the partner
still answers ``429`` (or ``503``) with ``Retry-After`` (seconds or an HTTP date), every caller
of the limiter, in every process, pauses that long, and the request is sent once more after
the pause (``retry=False`` returns the response instead). With ``tokens=`` (a second
limiter, of tokens), each request also reserves its estimated tokens, settled by the usage
its response reports once the body is read or closed (docs: Token budgets). With
``concurrency=sem`` (a :class:`~aiolimit.ConcurrencyLimiter`) each request also holds a slot
while it is in flight: taken before the rate permit, released when the response's body is
closed. A request that could not connect (``httpx.ConnectError``, ``ConnectTimeout``,
``PoolTimeout``) hands back its permit and tokens, as the partner never saw it; one that
failed after it was sent keeps them. Needs
``pip install 'aiolimit-redis[httpx]'``.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    import httpx
except ImportError as exc:
    raise missing_extra("aiolimit.httpx", "httpx") from exc

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ._acquire import Acquired
from ._calls import DEFAULT_MAX_PAUSE, CallGuard
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight, hold_while
from ._learn import Learner
from ._limiter import RateLimiter
from ._meter import MAX_BODY, estimate_tokens, meter_of, usage_tokens
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["RateLimitedTransport"]

T = TypeVar("T")

_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Failures before the request left: no connection (refused, DNS, TLS), none in time, none
free in the pool. Any other (a read timeout, a reset) may come after the partner got it."""


class RateLimitedTransport(httpx.AsyncBaseTransport):
    """Wraps ``transport`` (default: ``httpx.AsyncHTTPTransport()``); see the module.

    ``permits`` per request; ``timeout`` (seconds; None waits as long as it takes) bounds the
    wait for a pause and a permit, after which :class:`aiolimit.RateLimited` is raised, with
    ``retry_after``. A pause lasts at most ``max_pause`` (seconds or a timedelta; 15
    minutes by default), whatever ``Retry-After`` says; a longer one is logged (logger
    ``aiolimit``) and cut to it. A request whose body is a stream is not sent again.

    ``tokens`` (a :class:`~aiolimit.RateLimiter` of tokens): ``estimate(request)`` tokens
    (default: a token per 4 bytes of the body plus its ``max_tokens``) are taken with the
    request's permits, all or nothing; when the response body has been read (or a streamed
    one closed), ``usage(response)`` (default: ``usage.total_tokens`` of a JSON body, or of
    an event stream's last usage) settles them; None leaves the estimate standing. A
    provider's ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers are taken as floors
    for both limiters (``sync``). A process's metered requests ask one at a time, in order,
    and reserve at most 10 ms ahead, asking again meanwhile (docs: Token budgets, why).

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
        tokens: RateLimiter | None = None,
        estimate: Callable[[httpx.Request], int] | None = None,
        usage: Callable[[httpx.Response], int | None] | None = None,
        concurrency: ConcurrencyLimiter | None = None,
        learn: bool | Learner = False,
    ) -> None:
        meter = meter_of(tokens, limiter, estimate, usage, (_estimate, _usage))
        self._guard = CallGuard(
            limiter,
            permits=permits,
            timeout=timeout,
            retry=retry,
            max_pause=max_pause,
            concurrency=concurrency,
            meter=meter,
            learn=learn,
        )
        self._transport = transport or httpx.AsyncHTTPTransport()

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        guard = self._guard
        acquired = await guard.before_call(request)
        response = await self._send(request, acquired)
        paused = await _or_closed(response, self._pause_for(response))
        if paused and guard.retry and isinstance(request.stream, httpx.ByteStream):
            await response.aclose()
            if guard.meter is not None:
                await guard.meter.unused(acquired, response.headers)  # it used no tokens
            acquired = await guard.before_call(request)  # after the pause, a permit of its own
            response = await self._send(request, acquired)
            await _or_closed(response, self._pause_for(response))
        if guard.meter is None:
            return response
        settle = self._settler(request, response, acquired)
        if response.is_closed:  # read already (a response made with its content)
            await settle(response.content)
        else:
            response.stream = _Metered(response.stream, settle)
        return response

    async def _send(self, request: httpx.Request, acquired: Acquired) -> httpx.Response:
        sending = self._transport.handle_async_request(request)
        try:
            response = await hold_while(acquired, sending)  # (a slot: held, renewed)
        except _UNSENT:
            await self._guard.unsent(acquired)  # the partner never saw it: all goes back
            raise
        if isinstance(acquired, InFlight):  # the slot held until the body is closed
            response = httpx.Response(
                response.status_code,
                headers=response.headers,
                stream=_HeldStream(response.stream, acquired),
                extensions=response.extensions,
            )
        await _or_closed(
            response, self._guard.after_headers(response.headers, response.status_code, acquired)
        )
        return response

    def _pause_for(self, response: httpx.Response) -> Awaitable[bool]:
        return self._guard.pause_for(response.status_code, response.headers.get("retry-after"))

    def _settler(
        self, request: httpx.Request, response: httpx.Response, acquired: Acquired
    ) -> Callable[[bytes | None], Awaitable[None]]:
        """What settles the call once its body is read: ``usage`` sees the response with
        the body it read (a copy; a body longer than MAX_BODY: the estimate stands)."""
        meter = self._guard.meter
        assert meter is not None

        async def settle(body: bytes | None) -> None:
            read = None
            if body is not None:
                read = httpx.Response(
                    response.status_code, headers=response.headers, content=body, request=request
                )
            await meter.settle(acquired, read, response.headers)

        return settle

    async def aclose(self) -> None:
        await self._transport.aclose()


async def _or_closed(response: httpx.Response, step: Awaitable[T]) -> T:
    """``step`` (a sync, a pause: a round trip after the response came, before the caller
    has it); if it fails or its caller is cancelled, the response is closed first, since
    no one else will: its connection and its concurrency slot go back."""
    try:
        return await step
    except BaseException:
        with contextlib.suppress(Exception):  # (the step's error is the one to see)
            await asyncio.shield(response.aclose())
        raise


def _estimate(request: httpx.Request) -> int:
    try:
        body = request.content
    except httpx.RequestNotRead:  # a streamed body: its max_tokens cannot be read
        body = b""
    return estimate_tokens(body)


def _usage(response: httpx.Response) -> int | None:
    return usage_tokens(response.content)


class _Metered(httpx.AsyncByteStream):
    """A response body that keeps what it passes on (up to MAX_BODY) and, once closed,
    hands it to ``closed`` (None past MAX_BODY), once."""

    def __init__(
        self,
        stream: httpx.SyncByteStream | httpx.AsyncByteStream,
        closed: Callable[[bytes | None], Awaitable[None]],
    ) -> None:
        assert isinstance(stream, httpx.AsyncByteStream)
        self._stream = stream
        self._closed: Callable[[bytes | None], Awaitable[None]] | None = closed
        self._body: bytearray | None = bytearray()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            if self._body is not None:
                if len(self._body) + len(chunk) > MAX_BODY:
                    self._body = None
                else:
                    self._body += chunk
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            closed, self._closed = self._closed, None
            if closed is not None:
                await closed(None if self._body is None else bytes(self._body))


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
