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
from collections.abc import Callable, Sequence
from datetime import timedelta

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ._types import Algorithm, Rate
from .asgi._fields import header_fields, items_of
from .asgi._gate import Gate, RateLimitStats, record, refusal_headers
from .asgi._rules import Rule
from .asgi._types import KeyFunc, OnBackendError, Scope
from .backends.base import Backend

__all__ = ["RateLimit"]


class RateLimit:
    """A per-route limit, as a FastAPI dependency.

    >>> login_limit = RateLimit("login", "5/minute", backend=backend, key=client_ip)
    >>> @app.post("/login", dependencies=[Depends(login_limit)])
    ... async def login(form: LoginForm) -> Token: ...

    The same checks, status codes, body and header fields as :class:`RateLimitMiddleware`
    (it raises ``HTTPException(429)`` or ``(503)``; FastAPI writes the response). On allowed
    responses the fields go through FastAPI's response, which an endpoint that returns a
    ``Response`` itself replaces: with a ``RateLimitMiddleware`` around the app (rules may
    be empty) every response gets them, together with the middleware's own.
    """

    __slots__ = ("__signature__", "_gate", "_headers", "_legacy")

    def __init__(
        self,
        name: str,
        rates: str | Sequence[Rate],
        *,
        backend: Backend,
        key: KeyFunc | None = None,
        cost: int | Callable[[Scope], int] = 1,
        algorithm: Algorithm | str | None = None,
        wait: float | timedelta = 0,
        on_backend_error: OnBackendError = "deny",
        error_retry_after: float = 1,
        headers: bool = True,
        legacy_headers: bool = False,
    ) -> None:
        rule = Rule(name, rates, key=key, cost=cost, algorithm=algorithm)
        self._gate = Gate(backend, [rule], wait, on_backend_error, error_retry_after)
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

    async def __call__(self, request: Request, response: Response) -> None:
        scope = request.scope
        verdict = await self._gate.check(scope)
        await record(scope, verdict)
        if verdict.status != 200:
            fields = refusal_headers(verdict, scope, self._legacy)
            raise HTTPException(
                verdict.status,
                detail=verdict.detail,
                headers={name.decode(): value.decode() for name, value in fields},
            )
        if self._headers:
            for name, value in header_fields(items_of(scope), self._legacy):
                response.headers[name.decode()] = value.decode()
