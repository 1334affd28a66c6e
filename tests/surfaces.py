"""The three server surfaces, each on its real server: the ASGI middleware around a Starlette
app and the FastAPI dependency (both under uvicorn), and the aiohttp.web middleware (aiohttp's
own server), all on 127.0.0.1, each with one route ``/work`` (GET and HEAD) that a
:class:`Handler` answers.

>>> handler = Handler()
>>> async with serving("aiohttp", handler, backend=backend, rule=Rule("work", "1/minute")) as url:
...     ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from aiolimit.aiohttp_web import RateLimitMiddleware as AiohttpMiddleware
from aiolimit.asgi import RateLimitMiddleware, Rule
from aiolimit.fastapi import RateLimit
from tools import free_port

__all__ = ["SURFACES", "Handler", "serving"]

SURFACES = ["asgi", "aiohttp", "fastapi"]
CHUNK = b"chunk\n"


class Handler:
    """The route's handler on every surface: answers ``ok`` (``mode="ok"``), or first waits
    for :attr:`release` (``"hold"``), raises (``"raise"``), or streams a chunk every 10 ms
    until :attr:`release` (``"stream"``). Counts the requests it is in at once."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most = 0
        self.served = 0

    async def count_in_flight(self) -> int:
        """:attr:`in_flight`, as ``conformance.until`` reads a value."""
        return self.in_flight

    async def work(self) -> None:
        """What a request does before its answer (its body, for a stream)."""
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.served += 1
        try:
            if self.mode == "hold":
                await self.release.wait()
            elif self.mode == "raise":
                raise RuntimeError("the handler failed")
        finally:
            if self.mode != "stream":
                self.in_flight -= 1

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while not self.release.is_set():
                yield CHUNK
                await asyncio.sleep(0.01)
        finally:
            self.in_flight -= 1

    # -- the route, as each framework takes it -------------------------------------------------

    async def starlette(self, request: Request) -> Response:
        await self.work()
        if self.mode == "stream":
            return StreamingResponse(self.chunks(), media_type="text/plain")
        return PlainTextResponse("ok")

    async def aiohttp(self, request: web.Request) -> web.StreamResponse:
        await self.work()
        if self.mode != "stream":
            return web.Response(text="ok")
        # A body the server sends after the handler returned (as a file's): the slot is
        # held until it is sent all the same.
        return web.Response(body=self.chunks(), content_type="text/plain")


@asynccontextmanager
async def serving(
    surface: str, handler: Handler, *, rule: Rule, **options: Any
) -> AsyncIterator[str]:
    """``surface`` (one of :data:`SURFACES`) with ``rule`` and ``options`` (``backend=``,
    ``concurrency=``, ``wait=``...) on its real server; yields the base URL."""
    if surface == "aiohttp":
        async with _aiohttp_serving(handler, rule, options) as url:
            yield url
        return
    if surface == "asgi":
        app: Any = RateLimitMiddleware(
            Starlette(routes=[Route("/work", handler.starlette, methods=["GET", "HEAD"])]),
            rules=[rule],
            **options,
        )
    else:
        app = _fastapi_app(handler, rule, options)
    async with _uvicorn_serving(app) as url:
        yield url


def _fastapi_app(handler: Handler, rule: Rule, options: dict[str, Any]) -> FastAPI:
    limit = RateLimit(
        rule.name, rule.rates, key=rule.key, permits=rule.permits, algorithm=rule.algorithm,
        **options,
    )  # fmt: skip
    app = FastAPI()
    app.add_api_route(
        "/work", handler.starlette, methods=["GET", "HEAD"], dependencies=[Depends(limit)]
    )
    return app


@asynccontextmanager
async def _uvicorn_serving(app: Any) -> AsyncIterator[str]:
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def _aiohttp_serving(
    handler: Handler, rule: Rule, options: dict[str, Any]
) -> AsyncIterator[str]:
    cancel = options.pop("handler_cancellation", False)
    limits = AiohttpMiddleware(rules=[rule], **options)
    app = web.Application(middlewares=[limits])
    app.router.add_get("/work", handler.aiohttp)  # (HEAD too)
    runner = web.AppRunner(app, handler_cancellation=cancel)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
