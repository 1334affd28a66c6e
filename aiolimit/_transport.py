"""The one rate-limited transport behind :mod:`aiolimit.httpx` and :mod:`aiolimit.httpx2`.

httpx2 (the successor of httpx that the LLM SDKs use) has httpx's API under another module
name, so its classes are not httpx's: a response body must be an ``httpx2.AsyncByteStream``
for an ``httpx2.AsyncClient``, an unsent request raises ``httpx2.ConnectError``. The transport
imports neither: each request names its *flavour* (the module its class comes from, found
once per class), and the transport takes from it the classes it builds or checks.

>>> flavour = flavour_of(request)        # httpx or httpx2, from the request's class
>>> flavour.Response(200, content=body)  # that module's own
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import ModuleType
from typing import Any, Protocol, TypeVar

from ._acquire import Acquired
from ._calls import DEFAULT_MAX_PAUSE, CallGuard
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight, hold_while
from ._learn import Learner
from ._limiter import RateLimiter
from ._meter import (
    MAX_BODY,
    Used,
    estimate_by_kind,
    estimate_tokens,
    meter_of,
    usage_by_kind,
    usage_tokens,
)
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["AsyncTransport", "Flavour", "LimitedTransport", "flavour_of"]

T = TypeVar("T")


class AsyncTransport(Protocol):
    """An async transport of either flavour (``httpx.MockTransport``,
    ``httpx2.AsyncHTTPTransport``)."""

    async def handle_async_request(self, request: Any) -> Any: ...

    async def aclose(self) -> None: ...


class Flavour:
    """What the transport needs of an httpx-like module (``httpx``, ``httpx2``): its
    ``ByteStream`` (a body that can be sent again), ``Response``, ``RequestNotRead``, the
    errors of a request that never left (``unsent``), and the two body wrappers made as
    subclasses of its ``AsyncByteStream`` (its client checks that a body is one)."""

    __slots__ = (
        "ByteStream",
        "HeldStream",
        "Metered",
        "RequestNotRead",
        "Response",
        "module",
        "unsent",
    )

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.ByteStream: type = module.ByteStream
        self.Response: Any = module.Response
        self.RequestNotRead: type[Exception] = module.RequestNotRead
        # Failures before the request left: no connection (refused, DNS, TLS), none in time,
        # none free in the pool. Any other (a read timeout, a reset) may come after the
        # partner got it.
        self.unsent: tuple[type[Exception], ...] = (
            module.ConnectError,
            module.ConnectTimeout,
            module.PoolTimeout,
        )
        base = module.AsyncByteStream
        self.Metered: Any = type("Metered", (_Metered, base), {"__module__": __name__})
        self.HeldStream: Any = type("HeldStream", (_HeldStream, base), {"__module__": __name__})

    def default_transport(self) -> AsyncTransport:
        """The module's own ``AsyncHTTPTransport()``."""
        transport: AsyncTransport = self.module.AsyncHTTPTransport()
        return transport


_by_module: dict[str, Flavour] = {}
_by_class: dict[type, Flavour] = {}


def flavour_of(request: object) -> Flavour:
    """The flavour of ``request``: the module whose ``Request`` its class is (or derives
    from); TypeError for anything else."""
    kind = type(request)
    found = _by_class.get(kind)
    if found is None:
        found = _by_class[kind] = _flavour_of_class(kind)
    return found


def _flavour_of_class(kind: type) -> Flavour:
    for cls in kind.__mro__:
        name = cls.__module__.partition(".")[0]
        module = sys.modules.get(name)
        if module is not None and getattr(module, "Request", None) is cls:
            found = _by_module.get(module.__name__)
            if found is None:
                found = _by_module[module.__name__] = Flavour(module)
            return found
    raise TypeError(f"a rate-limited transport sends httpx or httpx2 requests, not {kind!r}")


class LimitedTransport:
    """Wraps ``transport`` (default: the ``AsyncHTTPTransport()`` of the first request's
    flavour, made then); see :class:`aiolimit.httpx.RateLimitedTransport`, its options."""

    __slots__ = ("_guard", "_transport")

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        transport: AsyncTransport | None = None,
        *,
        permits: int = 1,
        timeout: Duration | None = None,
        retry: bool = True,
        max_pause: Duration = DEFAULT_MAX_PAUSE,
        tokens: RateLimiter | Mapping[str, RateLimiter] | None = None,
        estimate: Callable[[Any], int | Mapping[str, int]] | None = None,
        usage: Callable[[Any], Used] | None = None,
        concurrency: ConcurrencyLimiter | None = None,
        learn: bool | Learner = False,
    ) -> None:
        defaults = (_estimate, _usage), (_estimate_by_kind, _usage_by_kind)
        meter = meter_of(tokens, limiter, estimate, usage, *defaults)
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
        self._transport = transport

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def handle_async_request(self, request: Any) -> Any:
        guard = self._guard
        flavour = flavour_of(request)
        if self._transport is None:  # (made before the permit: its set-up is not in the grant)
            self._transport = flavour.default_transport()
        acquired = await guard.before_call(request)
        response = await self._send(request, acquired, flavour)
        paused = await _or_closed(response, self._pause_for(response))
        if paused and guard.retry and isinstance(request.stream, flavour.ByteStream):
            await response.aclose()
            if guard.meter is not None:
                await guard.meter.unused(acquired, response.headers)  # it used no tokens
            acquired = await guard.before_call(request)  # after the pause, a permit of its own
            response = await self._send(request, acquired, flavour)
            await _or_closed(response, self._pause_for(response))
        if guard.meter is None:
            return response
        settle = self._settler(request, response, acquired, flavour)
        if response.is_closed:  # read already (a response made with its content)
            await settle(response.content)
        else:
            response.stream = flavour.Metered(response.stream, settle)
        return response

    async def _send(self, request: Any, acquired: Acquired, flavour: Flavour) -> Any:
        assert self._transport is not None
        sending = self._transport.handle_async_request(request)
        try:
            response = await hold_while(acquired, sending)  # (a slot: held, renewed)
        except flavour.unsent:
            await self._guard.unsent(acquired)  # the partner never saw it: all goes back
            raise
        if isinstance(acquired, InFlight):  # the slot held until the body is closed
            response = flavour.Response(
                response.status_code,
                headers=response.headers,
                stream=flavour.HeldStream(response.stream, acquired),
                extensions=response.extensions,
            )
        await _or_closed(
            response, self._guard.after_headers(response.headers, response.status_code, acquired)
        )
        return response

    def _pause_for(self, response: Any) -> Awaitable[bool]:
        return self._guard.pause_for(response.status_code, response.headers.get("retry-after"))

    def _settler(
        self, request: Any, response: Any, acquired: Acquired, flavour: Flavour
    ) -> Callable[[bytes | None], Awaitable[None]]:
        """What settles the call once its body is read: ``usage`` sees the response with
        the body it read (a copy; a body longer than MAX_BODY: the estimate stands)."""
        meter = self._guard.meter
        assert meter is not None

        async def settle(body: bytes | None) -> None:
            read = None
            if body is not None:
                read = flavour.Response(
                    response.status_code, headers=response.headers, content=body, request=request
                )
            await meter.settle(acquired, read, response.headers)

        return settle

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()


async def _or_closed(response: Any, step: Awaitable[T]) -> T:
    """``step`` (a sync, a pause: a round trip after the response came, before the caller
    has it); if it fails or its caller is cancelled, the response is closed first, since
    no one else will: its connection and its concurrency slot go back."""
    try:
        return await step
    except BaseException:
        with contextlib.suppress(Exception):  # (the step's error is the one to see)
            await asyncio.shield(response.aclose())
        raise


def _body(request: Any) -> bytes:
    try:
        body: bytes = request.content
    except flavour_of(request).RequestNotRead:  # a streamed body: its max_tokens unread
        return b""
    return body


def _estimate(request: Any) -> int:
    return estimate_tokens(_body(request))


def _usage(response: Any) -> int | None:
    return usage_tokens(response.content)


def _estimate_by_kind(request: Any) -> dict[str, int]:
    return estimate_by_kind(_body(request))


def _usage_by_kind(response: Any) -> dict[str, int | None] | None:
    return usage_by_kind(response.content)


class _Metered:
    """A response body that keeps what it passes on (up to MAX_BODY) and, once closed,
    hands it to ``closed`` (None past MAX_BODY), once. Made a subclass of each flavour's
    ``AsyncByteStream`` (:class:`Flavour`)."""

    def __init__(
        self, stream: AsyncIterator[bytes], closed: Callable[[bytes | None], Awaitable[None]]
    ) -> None:
        self._stream: Any = stream
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


class _HeldStream:
    """A response's body whose slot is released when it is closed (made a subclass of each
    flavour's ``AsyncByteStream``, :class:`Flavour`)."""

    def __init__(self, stream: AsyncIterator[bytes], acquired: InFlight) -> None:
        self._stream: Any = stream
        self._acquired = acquired

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._acquired.check()  # a lost slot: LeaseLostError, loudly
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            await self._acquired.__aexit__(None, None, None)
