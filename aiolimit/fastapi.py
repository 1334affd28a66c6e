"""Rate limits per route, as a FastAPI dependency.

>>> from aiolimit.asgi import client_ip
>>> from aiolimit.fastapi import RateLimit
>>> login_limit = RateLimit("login", "5/minute", backend=backend, key=client_ip)
>>> @app.post("/login", dependencies=[Depends(login_limit)])
... async def login(form: LoginForm) -> Token: ...

This module imports Starlette (FastAPI's base); :mod:`aiolimit.asgi` imports no web framework.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from ._extras import missing_extra

try:
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
except ImportError as exc:
    raise missing_extra("aiolimit.fastapi", "fastapi") from exc

from ._concurrency import ConcurrencyLimiter
from ._types import Algorithm, Duration, Rate
from .asgi._answer import refusal
from .asgi._fields import header_fields, items_of
from .asgi._gate import Gate, RateLimitStats, Verdict, record
from .asgi._rules import Rule
from .asgi._types import KeyFunc, OnBackendError, PermitsFunc, Scope
from .backends.base import Backend

__all__ = ["RateLimit"]

RequestKeyFunc = Callable[[Request], "str | None"]
"""A key written for FastAPI: the client id of a Starlette ``Request`` (None: the limit does
not apply)."""
DetailFunc = Callable[[int, int], Any]
"""The ``detail`` of a refusal's body: called with the status (429, or 503 when the store
failed) and the ``Retry-After`` seconds."""


class RateLimit:
    """A per-route limit, as a FastAPI dependency.

    >>> login_limit = RateLimit("login", "5/minute", backend=backend, key=client_ip)
    >>> @app.post("/login", dependencies=[Depends(login_limit)])
    ... async def login(form: LoginForm) -> Token: ...

    The same checks, status codes, body and header fields as :class:`RateLimitMiddleware`,
    byte for byte (it raises ``HTTPException(429)`` or ``(503)`` with the one refusal's
    fields and detail; FastAPI writes the body as the middleware does). On allowed
    responses the fields go through FastAPI's response, which an endpoint that returns a
    ``Response`` itself replaces: with a ``RateLimitMiddleware`` around the app (rules may
    be empty) every response gets them, together with the middleware's own.

    ``key`` is a key of the ASGI scope (``client_ip``) or, when its first parameter is
    annotated ``Request``, of the Starlette request: ``def api_key(request: Request) ->
    str | None``, as a middleware :class:`~aiolimit.asgi.Rule` takes it. ``detail`` makes the
    body's ``detail`` of a refusal: ``detail(status, retry_after)`` (FastAPI writes
    ``{"detail": ...}``; an exception handler for ``HTTPException`` may write any other body).

    ``concurrency`` (a :class:`~aiolimit.ConcurrencyLimiter`) as on the middleware: the
    request holds one of its slots (renewed) from before the limit is checked until its
    response is sent (a streaming one's whole body; FastAPI before 0.118, or ``Depends(...,
    scope="function")``: until the endpoint returns), however it ends; none within ``wait``:
    ``503`` with ``Retry-After: 1``. The dependency is one with ``yield`` (FastAPI ends it).
    """

    __slots__ = ("__signature__", "_detail", "_gate", "_headers", "_in_slot", "_legacy")

    def __init__(
        self,
        name: str,
        rates: str | Rate | Sequence[Rate],
        *,
        backend: Backend,
        key: KeyFunc | RequestKeyFunc | None = None,
        permits: int | PermitsFunc = 1,
        algorithm: Algorithm | str | None = None,
        wait: Duration = 0,
        on_backend_error: OnBackendError = "deny",
        error_retry_after: Duration = 1,
        headers: bool = True,
        legacy_headers: bool = False,
        detail: DetailFunc | None = None,
        concurrency: ConcurrencyLimiter | None = None,
    ) -> None:
        rule = Rule(name, rates, key=key, permits=permits, algorithm=algorithm)
        self._detail = detail
        self._gate = Gate(backend, [rule], wait, on_backend_error, error_retry_after, concurrency)
        self._in_slot = self._gate.holds_slots
        self._headers = headers
        self._legacy = legacy_headers
        # FastAPI injects by annotation: the real classes, whatever postponed annotations do.
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        self.__signature__ = inspect.Signature(
            [
                inspect.Parameter("request", positional, annotation=Request),
                inspect.Parameter("response", positional, annotation=Response),
            ],
            return_annotation=None,
        )

    @property
    def stats(self) -> RateLimitStats:
        return self._gate.stats

    @property
    def rule(self) -> Rule:
        return self._gate.rules[0]

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[None]:
        scope = request.scope
        if not self._in_slot:
            await self._check(scope, response)
            yield
            return
        async with self._gate.slot(scope) as refused:
            if refused is not None:
                raise self._refused(refused, scope)
            await self._check(scope, response)
            yield

    async def _check(self, scope: Scope, response: Response) -> None:
        verdict = await self._gate.check(scope)
        await record(scope, verdict)
        if verdict.status != 200:
            raise self._refused(verdict, scope)
        if self._headers:
            for name, value in header_fields(items_of(scope), self._legacy):
                response.headers[name.decode()] = value.decode()

    def _refused(self, verdict: Verdict, scope: Scope) -> HTTPException:
        """The refusal as FastAPI answers from a dependency: the one rendering's status and
        fields, and its detail, whose body FastAPI writes as that rendering does (or the
        app's ``detail``: ``detail(status, retry_after)``)."""
        answer = refusal(verdict, scope, self._legacy)
        detail = verdict.detail
        if self._detail is not None:
            detail = self._detail(verdict.status, verdict.retry_after)
        fields = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in answer.fields()
        }
        return HTTPException(answer.status, detail=detail, headers=fields)
