"""An aiohttp client middleware that takes a permit before every request and obeys
``Retry-After``.

>>> from aiolimit.aiohttp import RateLimitedClientMiddleware
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate("100/minute")
>>> async with aiohttp.ClientSession(middlewares=[RateLimitedClientMiddleware(limiter)]) as session:
...     async with session.get("https://partner.example/orders") as response: ...

The same behaviour as :class:`aiolimit.httpx.RateLimitedTransport`: every session and process
that uses the limiter shares the partner's quota; a ``429`` (or ``503``) with ``Retry-After``
pauses every caller of the limiter in every process, and the request is sent once more after
the pause (``retry=False`` returns the response instead); a request that could not connect
(``aiohttp.ClientConnectorError``, ``ConnectionTimeoutError``) hands back what it took.
``tokens=`` meters tokens as the httpx transport does. Needs ``pip install
'aiolimit-redis[aiohttp]'`` (aiohttp >= 3.12, which has client middlewares).
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    from aiohttp import (
        ClientConnectorError,
        ClientHandlerType,
        ClientRequest,
        ClientResponse,
        ConnectionTimeoutError,
        payload,
    )
    from aiohttp.connector import Connection
except ImportError as exc:
    raise missing_extra("aiolimit.aiohttp", "aiohttp") from exc

from collections.abc import Awaitable, Callable, Mapping

from ._aiohttp_stream import meter_stream
from ._client_flow import (
    AGAIN,
    CONNECTED,
    DEFAULT_MAX_PAUSE,
    Answer,
    AskAgain,
    ClientCalls,
    Held,
    Settle,
    Tell,
    drive,
)
from ._concurrency import ConcurrencyLimiter
from ._learn import Learner
from ._limiter import RateLimiter
from ._meter import MAX_BODY, Used, estimate_by_kind, estimate_tokens, usage_by_kind, usage_tokens
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["RateLimitedClientMiddleware"]

_UNSENT = (ClientConnectorError, ConnectionTimeoutError)
"""Failures before the request left: no connection (refused, DNS, TLS, a proxy's), none in
time. Any other (a read timeout, the server gone) may come after the partner got it."""


class RateLimitedClientMiddleware:
    """A client middleware: ``ClientSession(middlewares=[RateLimitedClientMiddleware(limiter)])``.

    ``permits`` per request; ``timeout`` (seconds; None waits as long as it takes) bounds the
    wait for a pause and a permit, after which :class:`aiolimit.RateLimited` is raised, with
    ``retry_after``. A pause lasts at most ``max_pause`` (seconds or a timedelta; 15
    minutes by default), whatever ``Retry-After`` says; a longer one is logged (logger
    ``aiolimit``) and cut to it.

    ``tokens``, ``estimate`` and ``usage`` as :class:`aiolimit.httpx.RateLimitedTransport`
    takes them (``usage`` may be async: ``await response.json()``). The middleware reads a
    metered response's body itself (at most ``MAX_BODY``; the caller reads the same bytes)
    and settles at once. An event stream (``text/event-stream``) is the caller's to read:
    with the default ``usage``, the usage of its last ``data:`` event that carries one
    settles the tokens once the stream has been read to its end or the response is
    released (``async with`` left) or closed; a stream left before its usage event, or
    with a ``usage`` of your own, keeps the estimate.

    ``concurrency``: a slot of it is held from before the permit until aiohttp lets the
    response's connection go (the whole body received, or the response released: ``async
    with session.get(...)`` left), renewed meanwhile. When the slot's lease is lost before
    the response came, the request is cancelled and :class:`~aiolimit.LeaseLostError`
    raised; a loss after it is logged (aiohttp reads the body outside the middleware).
    """

    __slots__ = ("_calls", "_streams")

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int = 1,
        timeout: Duration | None = None,
        retry: bool = True,
        max_pause: Duration = DEFAULT_MAX_PAUSE,
        tokens: RateLimiter | Mapping[str, RateLimiter] | None = None,
        estimate: Callable[[ClientRequest], int | Mapping[str, int]] | None = None,
        usage: Callable[[ClientResponse], Used | Awaitable[Used]] | None = None,
        concurrency: ConcurrencyLimiter | None = None,
        learn: bool | Learner = False,
    ) -> None:
        self._calls = ClientCalls(
            limiter,
            permits=permits,
            timeout=timeout,
            retry=retry,
            max_pause=max_pause,
            tokens=tokens,
            estimate=estimate,
            usage=usage,
            concurrency=concurrency,
            learn=learn,
            defaults=(_estimate, _usage),
            kinds_defaults=(_estimate_by_kind, _usage_by_kind),
        )
        self._streams = usage is None  # (the default usage reads an event stream's too)

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._calls.limiter

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        flow = self._calls.flow(request, _UNSENT, True)
        return await drive(flow, _Exchange(handler, request, self._streams))


class _Exchange:
    """One request's part of the flow, through the next handler
    (:class:`_client_flow.Exchange`)."""

    __slots__ = ("handler", "request", "response", "streams", "tell")

    def __init__(self, handler: ClientHandlerType, request: ClientRequest, streams: bool) -> None:
        self.handler, self.request, self.streams = handler, request, streams
        self.response: ClientResponse | None = None
        self.tell: Tell | None = None  # (set while sending without a slot)
        _told_before_writing(request, self)

    async def send(self, held: Held | None, tell: Tell) -> Answer:
        """The request sent; with a slot, held until aiohttp lets the connection go. Without
        one, the flow is told ``CONNECTED`` once aiohttp has the connection, just before the
        request is written (``ClientRequest.send``), so a permit read later than the fleet's
        margin covers goes back and is asked again. (The permit itself is taken before: a
        middleware is not told of new connections; docs/http-clients.md.)"""
        self.tell = None if held is not None else tell
        response = await self.handler(self.request)
        if held is not None:
            connection = response.connection
            if connection is None:  # released already (no body, or read to its end)
                await held.release()
            else:  # (a plain callback: the slot goes back in the store's background)
                connection.add_callback(held.release_soon)
        self.response = response
        return response.status, response.headers

    async def discard(self) -> None:
        response, self.response = self.response, None
        assert response is not None
        response.release()

    async def settle(self, settle: Settle) -> None:
        """The call's tokens settled by its usage (an event stream's: once it is read)."""
        response = self.response
        assert response is not None
        if self.streams and response.content_type == "text/event-stream":
            meter_stream(response, await settle.events())  # the usage once the caller read it
            return
        readable = _readable(response)
        if readable:
            await response.read()  # (kept: the caller's read() gives the same bytes)
        await settle.read(response if readable else None)

    async def close(self) -> None:
        if self.response is not None:
            self.response.close()


def _told_before_writing(request: ClientRequest, exchange: _Exchange) -> None:
    """``request``'s own ``send`` (what aiohttp calls with the connection it has for it)
    first tells ``exchange``'s flow ``CONNECTED``; answered ``AGAIN``, the request is not
    written (aiohttp closes the connection it had) and the flow asks again."""
    write = request.send

    async def send(connection: Connection) -> ClientResponse:
        tell = exchange.tell
        if tell is not None and await tell(CONNECTED) is AGAIN:
            raise AskAgain
        return await write(connection)

    request.send = send  # type: ignore[method-assign,assignment]


def _readable(response: ClientResponse) -> bool:
    """Whether the middleware may read the body for its usage: not an event stream, and
    not longer than MAX_BODY by its Content-Length."""
    if response.content_type == "text/event-stream":
        return False
    length = response.content_length
    return length is None or length <= MAX_BODY


def _body(request: ClientRequest) -> bytes:
    body = request.body
    text = body.decode("utf-8", "replace") if isinstance(body, payload.BytesPayload) else ""
    return text.encode()


def _estimate(request: ClientRequest) -> int:
    return estimate_tokens(_body(request))


async def _usage(response: ClientResponse) -> int | None:
    return usage_tokens(await response.read())


def _estimate_by_kind(request: ClientRequest) -> dict[str, int]:
    return estimate_by_kind(_body(request))


async def _usage_by_kind(response: ClientResponse) -> dict[str, int | None] | None:
    return usage_by_kind(await response.read())
