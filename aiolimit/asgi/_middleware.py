"""The ASGI middleware: every HTTP request and websocket connection checked against rules."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from .._concurrency import ConcurrencyLimiter
from .._types import Duration
from ..backends.base import Backend
from ._answer import refusal
from ._fields import header_fields, items_of, with_fields
from ._gate import Gate, RateLimitStats, Verdict, record, record_allowed
from ._rules import Rule
from ._types import ASGIApp, Message, OnBackendError, Receive, Scope, Send

__all__ = ["RateLimitMiddleware"]

# Close codes (RFC 6455): 1008 a policy was violated, 1013 try again later.
_WS_POLICY_VIOLATION = 1008
_WS_TRY_AGAIN_LATER = 1013


class RateLimitMiddleware:
    """Checks every HTTP request and websocket connection against ``rules``.

    >>> app = RateLimitMiddleware(app, backend=RedisBackend(redis), rules=[
    ...     Rule("api-global", "1000/second"),
    ...     Rule("api-per-client", "10/second", key=client_ip, paths=["/api/"]),
    ... ], wait=0.5, on_backend_error="deny")

    A refused request is answered ``429`` with ``Retry-After`` (whole seconds, rounded up,
    at least 1), the RateLimit fields and a JSON body ``{"detail": ...}`` (none to a HEAD
    request), as the aiohttp.web middleware and the FastAPI dependency answer it (one
    rendering: ``aiolimit.asgi._answer``); it consumes no permit of any rule. ``wait``
    (seconds): a request whose permits are free within it is reserved and served then
    instead of refused. ``on_backend_error``: when the store fails, ``"deny"`` answers
    ``503`` with ``Retry-After: error_retry_after``, ``"allow"`` lets the request through;
    either way each outage is logged once (logger ``aiolimit``) and counted in
    :attr:`stats`. ``headers``: the RateLimit fields on allowed responses too;
    ``legacy_headers``: also ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (Unix
    time) for the most constraining rule. The fields are written once per response,
    replacing any of the same name the app set. Websocket connections are checked at
    connect and refused with close code 1008 (1013 when the store fails and ``"deny"``);
    ``lifespan`` passes through, and startup writes the rules' configs.

    ``concurrency`` (a :class:`~aiolimit.ConcurrencyLimiter`, its limit set): every HTTP
    request holds one of its slots from before its rules are checked until the app has
    answered (or the client left), so that at most its limit are served at once, across
    every process. A request waits for a slot in FIFO order up to ``wait``, then for its
    permits up to ``wait`` again; with no slot in time it is answered ``503`` with
    ``Retry-After: 1`` (counted in ``stats.busy``) and consumes no permit. A slot whose
    lease is lost cancels the request (the server answers 500). Websockets are not counted.
    """

    __slots__ = ("_gate", "_headers", "_in_slot", "_legacy", "app")

    def __init__(
        self,
        app: ASGIApp,
        *,
        backend: Backend,
        rules: Sequence[Rule],
        wait: Duration = 0,
        on_backend_error: OnBackendError = "deny",
        error_retry_after: Duration = 1,
        headers: bool = True,
        legacy_headers: bool = False,
        concurrency: ConcurrencyLimiter | None = None,
    ) -> None:
        self.app = app
        self._gate = Gate(backend, rules, wait, on_backend_error, error_retry_after, concurrency)
        self._in_slot = self._gate.holds_slots
        self._headers = headers
        self._legacy = legacy_headers

    @property
    def stats(self) -> RateLimitStats:
        return self._gate.stats

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._gate.rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, self._configure_at_startup(receive), send)
            return
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if kind == "http" and self._in_slot:
            await self._serve_in_slot(scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve_in_slot(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request with its slot held until the app has answered, or refused."""
        async with self._gate.slot(scope) as refused:
            if refused is None:
                await self._serve(scope, receive, send)
            else:
                await self._refuse(refused, scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        verdict = await self._gate.check(scope)
        if not record_allowed(scope, verdict):
            await record(scope, verdict)
        if kind == "websocket":
            if verdict.status == 200:
                await self.app(scope, receive, send)
            else:
                await _refuse_websocket(verdict, receive, send)
            return
        if verdict.status != 200:
            await self._refuse(verdict, scope, receive, send)
        elif self._headers:
            legacy = self._legacy

            def send_with_fields(message: Message) -> Awaitable[None]:
                # (a coroutine function in all but name: one frame fewer per message)
                if message["type"] == "http.response.start":
                    message = with_fields(message, header_fields(items_of(scope), legacy))
                return send(message)

            await self.app(scope, receive, send_with_fields)
        else:
            await self.app(scope, receive, send)

    def _configure_at_startup(self, receive: Receive) -> Receive:
        async def receive_then_configure() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                await self._gate.configure_all()
            return message

        return receive_then_configure

    def _refuse(
        self, verdict: Verdict, scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        return refusal(verdict, scope, self._legacy)(scope, receive, send)


async def _refuse_websocket(verdict: Verdict, receive: Receive, send: Send) -> None:
    """Accepts, then closes with the reason: a close before the handshake completes reaches a
    browser as a bare 403, without the code or the wait."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client is gone already
    code = _WS_POLICY_VIOLATION if verdict.status == 429 else _WS_TRY_AGAIN_LATER
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": verdict.detail[:120]})
