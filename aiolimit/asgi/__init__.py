"""Rate limits for web apps: an ASGI middleware for the whole app, a FastAPI dependency per route.

>>> from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
>>> app = RateLimitMiddleware(
...     app,                                   # Starlette, FastAPI, Litestar, Quart...
...     backend=RedisBackend(redis),
...     rules=[
...         Rule("api-global", "1000/second"),
...         Rule("api-per-client", "10/second; 100/minute", key=client_ip, paths=["/api/"]),
...     ],
... )
>>> from aiolimit.fastapi import RateLimit
>>> @app.post("/login", dependencies=[Depends(RateLimit("login", "5/minute", backend=backend,
...                                                       key=client_ip))])

Every rule that matches a request is checked at once (one round trip on Redis). When one
refuses, the permits the others granted to that request are handed back, and the answer is
``429`` with ``Retry-After`` and the RateLimit fields of draft-ietf-httpapi-ratelimit-headers
(``RateLimit-Policy: "api-per-client";q=10;w=1`` and ``RateLimit: "api-per-client";r=0;t=1``),
which allowed responses carry too. This package imports no web framework; the FastAPI
dependency lives in :mod:`aiolimit.fastapi`.
"""

from ._addresses import client_ip, client_ip_from
from ._gate import RateLimitStats
from ._middleware import RateLimitMiddleware
from ._rules import Rule
from ._types import (
    ASGIApp,
    KeyFunc,
    Message,
    OnBackendError,
    PermitsFunc,
    Receive,
    Scope,
    Send,
)

__all__ = [
    "ASGIApp",
    "KeyFunc",
    "Message",
    "OnBackendError",
    "PermitsFunc",
    "RateLimitMiddleware",
    "RateLimitStats",
    "Receive",
    "Rule",
    "Scope",
    "Send",
    "client_ip",
    "client_ip_from",
]
