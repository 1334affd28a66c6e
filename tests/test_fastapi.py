"""The FastAPI dependency as a FastAPI user writes it: a key of the Starlette ``Request``, a
429 body of the app's own, ``app.add_middleware`` and the backend closed in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from starlette.requests import Request

from aiolimit import MemoryBackend
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
from aiolimit.fastapi import RateLimit

pytestmark = pytest.mark.looptime


def client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app, client=("203.0.113.7", 50000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_a_key_may_take_the_starlette_request() -> None:
    def api_key(request: Request) -> str | None:
        return request.headers.get("x-api-key")

    limit = RateLimit("per-key", "1/minute", backend=MemoryBackend(), key=api_key)
    app = FastAPI()

    @app.get("/items", dependencies=[Depends(limit)])
    async def items() -> list[int]:
        return []

    async with client(app) as http:
        first = await http.get("/items", headers={"x-api-key": "alice"})
        again = await http.get("/items", headers={"x-api-key": "alice"})
        other = await http.get("/items", headers={"x-api-key": "bob"})
        anonymous = await http.get("/items")  # None: the limit does not apply
    assert [first.status_code, again.status_code, other.status_code] == [200, 429, 200]
    assert anonymous.status_code == 200


async def test_the_429_body_is_the_app_s_own() -> None:
    def detail(status: int, retry_after: int) -> dict[str, Any]:
        return {"error": "slow_down" if status == 429 else "unavailable", "wait": retry_after}

    limit = RateLimit("login", "1/minute", backend=MemoryBackend(), detail=detail)
    app = FastAPI()

    @app.post("/login", dependencies=[Depends(limit)])
    async def login() -> dict[str, str]:
        return {"token": "t"}

    async with client(app) as http:
        assert (await http.post("/login")).status_code == 200
        refused = await http.post("/login")
    assert refused.status_code == 429
    assert refused.json() == {"detail": {"error": "slow_down", "wait": 60}}
    assert refused.headers["retry-after"] == "60"


async def test_add_middleware_and_a_lifespan_that_closes_the_backend() -> None:
    backend = MemoryBackend()
    closed = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await backend.aclose()
        closed.append(True)

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(
        RateLimitMiddleware, backend=backend, rules=[Rule("api", "2/minute", key=client_ip)]
    )

    @app.get("/items")
    async def items() -> list[int]:
        return []

    async with lifespan_of(app), client(app) as http:
        codes = [(await http.get("/items")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert closed == [True]


@asynccontextmanager
async def lifespan_of(app: Any) -> AsyncIterator[None]:
    """Runs the app's lifespan (httpx's ASGITransport does not)."""
    async with app.router.lifespan_context(app):
        yield
