"""One key-function contract on every server surface: a key written for the ASGI scope, or one
whose first parameter is annotated with Starlette's ``Request`` (or ``HTTPConnection``), works
the same on a middleware ``Rule`` as on the FastAPI dependency: never a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from fastapi import Request as FastAPIRequest
from starlette.requests import HTTPConnection, Request

from aiolimit import MemoryBackend
from aiolimit.asgi import RateLimitMiddleware, Rule
from aiolimit.asgi._types import Scope
from aiolimit.fastapi import RateLimit

pytestmark = pytest.mark.looptime


def by_request(request: Request) -> str | None:
    return request.headers.get("x-api-key")


def by_fastapi_request(request: FastAPIRequest) -> str | None:
    return request.headers.get("x-api-key")


def by_connection(connection: HTTPConnection) -> str | None:
    return connection.headers.get("x-api-key")


def by_scope(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-api-key":
            return str(value.decode())
    return None


def by_lambda_scope(scope: Any) -> str | None:
    return by_scope(scope)


KEYS = [by_request, by_fastapi_request, by_connection, by_scope, by_lambda_scope]


def middleware_app(key: Callable[..., str | None]) -> FastAPI:
    app = FastAPI()

    @app.get("/search")
    async def search() -> list[str]:
        return []

    rule = Rule("search", "1/minute", key=key)
    app.add_middleware(RateLimitMiddleware, backend=MemoryBackend(), rules=[rule])
    return app


def dependency_app(key: Callable[..., str | None]) -> FastAPI:
    app = FastAPI()
    limit = RateLimit("search", "1/minute", backend=MemoryBackend(), key=key)

    @app.get("/search", dependencies=[Depends(limit)])
    async def search() -> list[str]:
        return []

    return app


@pytest.mark.parametrize("surface", [middleware_app, dependency_app], ids=["rule", "dependency"])
@pytest.mark.parametrize("key", KEYS, ids=[key.__name__ for key in KEYS])
async def test_the_same_key_function_counts_alike_on_the_rule_and_the_dependency(
    surface: Callable[[Callable[..., str | None]], FastAPI], key: Callable[..., str | None]
) -> None:
    transport = httpx.ASGITransport(app=surface(key))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        alice = [
            (await client.get("/search", headers={"x-api-key": "alice"})).status_code
            for _ in range(2)
        ]
        bob = (await client.get("/search", headers={"x-api-key": "bob"})).status_code
        nobody = [(await client.get("/search")).status_code for _ in range(2)]
    assert alice == [200, 429]
    assert bob == 200
    assert nobody == [200, 200]  # None: the limit does not apply
