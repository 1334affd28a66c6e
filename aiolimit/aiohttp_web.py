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

import json
from collections.abc import Sequence
from typing import Any

from ._extras import missing_extra

try:
    from aiohttp import web
except ImportError as exc:
    raise missing_extra("aiolimit.aiohttp_web", "aiohttp") from exc

from ._types import Duration
from .asgi._fields import header_fields, items_of
from .asgi._gate import Gate, RateLimitStats, Verdict, record, record_allowed, refusal_headers
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
    JSON body ``{"detail": ...}``, and consumes no permit of any rule; ``wait`` serves a
    request whose permits are free within it; ``on_backend_error`` (``"deny"``: ``503``,
    ``"allow"``: let through) says what a store failure does. Allowed responses carry the
    fields (``headers``), those the handler raises (``web.HTTPNotFound``) too, unless the
    handler sent its headers itself (a prepared ``StreamResponse``).
    """

    __middleware_version__ = 1  # aiohttp: a middleware of (request, handler)
    __slots__ = ("_gate", "_headers", "_legacy")

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
    ) -> None:
        self._gate = Gate(backend, rules, wait, on_backend_error, error_retry_after)
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
        verdict = await self._gate.check(scope)
        if not record_allowed(scope, verdict):
            await record(scope, verdict)
            return self._refusal(verdict, scope)
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

    def _refusal(self, verdict: Verdict, scope: Scope) -> web.Response:
        headers = {
            name.decode(): value.decode()
            for name, value in refusal_headers(verdict, scope, self._legacy)
        }
        return web.Response(
            status=verdict.status,
            body=json.dumps({"detail": verdict.detail}).encode(),
            content_type="application/json",
            headers=headers,
        )
