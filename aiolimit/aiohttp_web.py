"""Rate limits for an ``aiohttp.web`` server: the ASGI middleware's rules, keys, header
fields, ``wait`` and failure policy, on aiohttp's own requests.

>>> from aiolimit.aiohttp_web import RateLimitMiddleware
>>> from aiolimit.asgi import Rule, client_ip
>>> limits = RateLimitMiddleware(backend=RedisBackend(redis), rules=[
...     Rule("api-global", "1000/second"),
...     Rule("api-per-client", "10/second", key=client_ip, paths=["/api/"]),
... ])
>>> app = web.Application(middlewares=[limits])
>>> app.on_startup.append(limits.on_startup)        # the rules' configs, written at startup

A request is checked by the same gate as :class:`aiolimit.asgi.RateLimitMiddleware`
(``aiolimit.asgi._gate``), on an ASGI-shaped view of it (:func:`scope_of`), so a rule's
``key`` and ``permits`` callables are the ones written for ASGI: ``client_ip`` reads the peer,
``client_ip_from`` a forwarding header. (Websocket handshakes are requests like any other
here: a refused one is answered ``429``.) This module is the server side; the client
middleware is :mod:`aiolimit.aiohttp`. Needs ``pip install 'aiolimit-redis[aiohttp]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._extras import missing_extra

try:
    from aiohttp import web
    from multidict import CIMultiDict
except ImportError as exc:
    raise missing_extra("aiolimit.aiohttp_web", "aiohttp") from exc

from ._concurrency import ConcurrencyLimiter
from ._types import Duration
from .asgi._answer import Answer, refusal
from .asgi._fields import header_fields, items_of
from .asgi._gate import Gate, RateLimitStats, record, record_allowed
from .asgi._rules import Rule
from .asgi._types import OnBackendError, Scope
from .backends.base import Backend

__all__ = ["SCOPE_KEY", "RateLimitMiddleware", "scope_of"]

_RequestKey = getattr(web, "RequestKey", None)  # aiohttp >= 3.14: typed request keys
SCOPE_KEY: Any = "aiolimit.scope" if _RequestKey is None else _RequestKey("aiolimit.scope", dict)
"""Where a checked request keeps its scope (``request[SCOPE_KEY]``): the rate limit items
and grants of the request, as an ASGI scope holds them; the middlewares of one request
(an app's and a sub-app's) share it, so a request refused by one consumes nothing in any."""


def scope_of(request: web.BaseRequest) -> Scope:
    """The request as an ASGI HTTP scope, as far as rules and keys read one: ``method``,
    ``path`` (decoded), ``root_path`` (empty), ``query_string``, ``headers`` (lower-case
    names, as received) and ``client``: ``(request.remote, port)``, the peer unless a
    middleware before this one set ``remote`` from a trusted proxy; None on a Unix socket."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    port = peer[1] if isinstance(peer, tuple) and len(peer) >= 2 else 0
    remote = request.remote
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.encode("latin-1", "replace"),
        "root_path": "",
        "query_string": request.query_string.encode("latin-1", "replace"),
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": (remote, port) if remote and isinstance(peer, tuple) else None,
    }


class RateLimitMiddleware:
    """Checks every request of an ``aiohttp.web`` application against ``rules``.

    >>> limits = RateLimitMiddleware(backend=backend, rules=rules, wait=0.5)
    >>> app = web.Application(middlewares=[limits])

    The arguments, answers and fields are those of :class:`aiolimit.asgi.RateLimitMiddleware`:
    a refused request is answered ``429`` with ``Retry-After``, the RateLimit fields and a
    JSON body ``{"detail": ...}``, byte for byte as the ASGI middleware answers it, and
    consumes no permit of any rule; ``wait`` serves a request whose permits are free within
    it; ``on_backend_error`` (``"deny"``: ``503``, ``"allow"``: let through) says what a
    store failure does. Allowed responses carry the fields (``headers``), those the handler
    raises (``web.HTTPNotFound``) too, unless the handler sent its headers itself (a prepared
    ``StreamResponse``).

    ``concurrency`` (a :class:`~aiolimit.ConcurrencyLimiter`) as on the ASGI middleware:
    each request holds a slot (renewed) from before its rules are checked until its
    response is sent, however it ends (an exception, a client that left, a cancelled
    handler); none within ``wait``: ``503`` with ``Retry-After: 1``. So that a body the
    server would send after the handler (a ``FileResponse``, a payload) is sent in the slot,
    the middleware sends the response itself: middlewares listed before it find it sent.
    Websocket handshakes take no slot.
    """

    __middleware_version__ = 1  # aiohttp: a middleware of (request, handler)
    __slots__ = ("_gate", "_headers", "_in_slot", "_legacy")

    def __init__(
        self,
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

    async def on_startup(self, app: web.Application) -> None:
        """For ``app.on_startup``: writes the rules' configs now (a failing store is logged,
        and they are written by the first request instead)."""
        await self._gate.configure_all()

    async def __call__(self, request: web.Request, handler: Any) -> web.StreamResponse:
        scope = request.get(SCOPE_KEY)
        if scope is None:
            scope = request[SCOPE_KEY] = scope_of(request)
        if self._in_slot and request.headers.get("Upgrade", "").lower() != "websocket":
            return await self._serve_in_slot(request, handler, scope)
        return await self._serve(request, handler, scope)

    async def _serve_in_slot(
        self, request: web.Request, handler: Any, scope: Scope
    ) -> web.StreamResponse:
        """The request with its slot held until its response is sent, or refused."""
        async with self._gate.slot(scope) as refused:
            if refused is not None:
                return _response_of(refusal(refused, scope, self._legacy))
            response = await self._serve(request, handler, scope)
            try:
                await response.prepare(request)
                await response.write_eof()
            except ConnectionError:  # the client left: the server finds it so, as ever
                pass
            return response

    async def _serve(self, request: web.Request, handler: Any, scope: Scope) -> web.StreamResponse:
        verdict = await self._gate.check(scope)
        if not record_allowed(scope, verdict):
            await record(scope, verdict)
            return _response_of(refusal(verdict, scope, self._legacy))
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            self._add_fields(exc, scope)
            raise
        self._add_fields(response, scope)
        return response

    def _add_fields(self, response: web.StreamResponse, scope: Scope) -> None:
        if self._headers and not response.prepared:
            for name, value in header_fields(items_of(scope), self._legacy):
                response.headers[name.decode()] = value.decode()


def _response_of(answer: Answer) -> web.Response:
    """``answer`` as aiohttp's response (its body unsent to a HEAD request, its
    ``content-length`` kept)."""
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in answer.headers]
    return web.Response(status=answer.status, body=answer.body, headers=CIMultiDict(headers))
