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
from collections.abc import AsyncIterator, Callable, Mapping
from types import ModuleType
from typing import Any, Protocol

from ._body_tap import BodyTap
from ._client_flow import (
    AGAIN,
    CONNECTED,
    CONNECTING,
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
from ._meter import Used, estimate_by_kind, estimate_tokens, usage_by_kind, usage_tokens
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["AsyncTransport", "Flavour", "LimitedTransport", "flavour_of"]


class AsyncTransport(Protocol):
    """An async transport of either flavour (``httpx.MockTransport``,
    ``httpx2.AsyncHTTPTransport``)."""

    async def handle_async_request(self, request: Any) -> Any: ...

    async def aclose(self) -> None: ...


class Flavour:
    """What the transport needs of an httpx-like module (``httpx``, ``httpx2``): its
    ``ByteStream`` (a body that can be sent again), ``Response``, ``RequestNotRead``, the
    errors of a request that never left (``unsent``), and the body wrapper made a subclass
    of its ``AsyncByteStream`` (its client checks that a body is one)."""

    __slots__ = (
        "Body",
        "ByteStream",
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
        self.Body: Any = type("Body", (_Body, base), {"__module__": __name__})

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

    __slots__ = ("_calls", "_own", "_transport")

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
        self._transport = transport
        # The transport it makes itself speaks HTTP/1.1 through httpcore, which reports its
        # connections (the trace extension): a permit is taken once the connection is ready.
        self._own = transport is None

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._calls.limiter

    async def handle_async_request(self, request: Any) -> Any:
        flavour = flavour_of(request)
        if self._transport is None:  # (made before the permit: its set-up is not in the grant)
            self._transport = flavour.default_transport()
        resendable = isinstance(request.stream, flavour.ByteStream)
        flow = self._calls.flow(request, flavour.unsent, resendable)
        return await drive(flow, _Exchange(self._transport, request, flavour, self._own))

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()


class _Exchange:
    """One request's part of the flow, on the inner transport (:class:`_client_flow.Exchange`)."""

    __slots__ = ("flavour", "request", "response", "traced", "transport")

    def __init__(
        self, transport: AsyncTransport, request: Any, flavour: Flavour, traced: bool
    ) -> None:
        self.transport, self.request, self.flavour = transport, request, flavour
        self.traced = traced  # (httpcore underneath, HTTP/1.1: its trace tells the connection)
        self.response: Any = None

    async def send(self, held: Held | None, tell: Tell) -> Answer:
        if self.traced and held is None:  # (a slot is taken with the permit: not moved)
            response = await _Trace.sending(self.transport, self.request, tell)
        else:
            response = await self.transport.handle_async_request(self.request)
        if held is not None:  # the slot held until the body is closed
            response = self.flavour.Response(
                response.status_code,
                headers=response.headers,
                stream=self.flavour.Body(response.stream, held),
                extensions=response.extensions,
            )
        self.response = response
        return response.status_code, response.headers

    async def discard(self) -> None:
        response, self.response = self.response, None
        await response.aclose()

    async def settle(self, settle: Settle) -> None:
        """``usage`` sees the response with the body it read (a copy; a body longer than
        MAX_BODY: the estimate stands): now, if read already (a response made with its
        content), else once the caller has closed it."""
        flavour, request, response = self.flavour, self.request, self.response

        def reread(body: bytes) -> Any:
            return flavour.Response(
                response.status_code, headers=response.headers, content=body, request=request
            )

        if response.is_closed:
            await settle.read(reread(response.content))
        else:
            response.stream = flavour.Body(response.stream, None, settle.tap(reread))

    async def close(self) -> None:
        if self.response is not None:
            with contextlib.suppress(Exception):  # (the step's error is the one to see)
                await asyncio.shield(self.response.aclose())


class _Trace:
    """httpcore's ``trace`` extension for one request (the caller's own, if any, still sees
    every event): tells the flow when a new connection is made for the request, and when
    the connection (new or kept alive) is ready, the request about to be written (the
    permit is taken, or its lateness checked, there); then steps aside."""

    __slots__ = ("connecting", "extensions", "tell", "theirs")

    # A new connection's set-up begins; the connection is ready, the request's headers are
    # next (HTTP/1.1 only: an HTTP/2 connection's streams are numbered in the order they are
    # opened, and one held back while a later one goes would be refused).
    CONNECTS = frozenset(
        {"connection.connect_tcp.started", "connection.connect_unix_socket.started"}
    )
    READY = "http11.send_request_headers.started"

    def __init__(self, extensions: dict[str, Any], tell: Tell) -> None:
        self.extensions, self.tell = extensions, tell
        self.theirs: Any = extensions.get("trace")
        self.connecting = False

    @classmethod
    async def sending(cls, transport: AsyncTransport, request: Any, tell: Tell) -> Any:
        """``request`` sent through ``transport``, traced (httpcore reads the extension from
        the same dict, so it is set there, and set back after)."""
        extensions = request.extensions
        trace = cls(extensions, tell)
        extensions["trace"] = trace
        try:
            return await transport.handle_async_request(request)
        finally:
            trace.step_aside()

    def step_aside(self) -> None:
        if self.extensions.get("trace") is self:
            if self.theirs is None:
                del self.extensions["trace"]
            else:
                self.extensions["trace"] = self.theirs

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        if name in self.CONNECTS and not self.connecting:
            self.connecting = True
            await self.tell(CONNECTING)
        elif name == self.READY:
            self.step_aside()  # (the events after it need no telling)
            self.connecting = False
            if await self.tell(CONNECTED) is AGAIN:
                raise AskAgain  # (not written: httpcore lets the connection go)
        if self.theirs is not None:
            await self.theirs(name, info)


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


class _Body:
    """A response's body passed through: its slot (``held``) checked as it is read and
    released when it is closed; its bytes fed to ``tap``, ended when it is closed. Made a
    subclass of each flavour's ``AsyncByteStream`` (:class:`Flavour`)."""

    def __init__(
        self, stream: AsyncIterator[bytes], held: Held | None, tap: BodyTap | None = None
    ) -> None:
        self._stream: Any = stream
        self._held = held
        self._tap = tap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held, tap = self._held, self._tap
        async for chunk in self._stream:
            if held is not None:
                held.check()  # a lost slot: LeaseLostError, loudly
            if tap is not None:
                tap.feed(chunk)
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            try:
                if self._held is not None:
                    await self._held.release()
            finally:
                ending = None if self._tap is None else self._tap.end()
                if ending is not None:
                    await ending
