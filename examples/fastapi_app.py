"""A FastAPI app with a global limit, a per-client limit on /api/, and a stricter login limit.

    uvicorn examples.fastapi_app:app                 # serve it (in-memory limits)
    AIOLIMIT_REDIS_URL=redis://localhost:6379 uvicorn examples.fastapi_app:app
    python examples/fastapi_app.py                   # serve it on a free port and call it
    python examples/fastapi_app.py --redis redis://localhost:6379

Run as a script, it serves the app with uvicorn on a free loopback port, calls it with httpx
and prints each answer with its RateLimit fields: the sixth /api/ call in a second and the
fourth login in a minute are refused with 429 and a Retry-After.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket

from fastapi import Depends, FastAPI

from aiolimit import Backend, MemoryBackend, RateLimiter, RedisBackend
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
from aiolimit.fastapi import RateLimit


def backend_of(redis_url: str | None) -> Backend:
    """The limits' store: the Redis server at ``redis_url``, else this process's memory."""
    return RedisBackend.from_url(redis_url) if redis_url else MemoryBackend()


def build(backend: Backend) -> RateLimitMiddleware:
    """The app: its routes, the login dependency, and the middleware's rules on ``backend``."""
    api = FastAPI()
    login_limit = RateLimit("example-login", "3/minute", backend=backend, key=client_ip)

    @api.get("/api/items/{item}")
    async def get_item(item: int) -> dict[str, int]:
        return {"item": item}

    @api.post("/login", dependencies=[Depends(login_limit)])
    async def login() -> dict[str, str]:
        return {"token": "let-me-in"}

    return RateLimitMiddleware(
        api,
        backend=backend,
        rules=[
            Rule("example-global", "1000/second"),
            Rule("example-per-client", "5/second", key=client_ip, paths=["/api/"]),
        ],
        on_backend_error="deny",
    )


app = build(backend_of(os.environ.get("AIOLIMIT_REDIS_URL")))  # what uvicorn serves


async def main(redis_url: str | None) -> None:
    import httpx
    import uvicorn

    backend = backend_of(redis_url)
    served = build(backend)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(served, host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.ensure_future(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            calls = [("GET", f"/api/items/{i}") for i in range(6)] + [("POST", "/login")] * 4
            for method, path in calls:
                answer = await http.request(method, path)
                print(
                    f"{method:4} {path:14} -> {answer.status_code}"
                    f"  RateLimit: {answer.headers.get('ratelimit')}"
                    + (f"  Retry-After: {answer.headers['retry-after']}" if answer.is_error else "")
                )
    finally:
        server.should_exit = True
        await serving
        for name in ("example-global", "example-per-client", "example-login"):
            await RateLimiter(name, backend).delete()  # so that the next run starts afresh
        await backend.aclose()  # (and the Redis client from_url made)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("AIOLIMIT_REDIS_URL") or None,
        help="Redis server to keep the limits in (default: $AIOLIMIT_REDIS_URL, else memory)",
    )
    asyncio.run(main(parser.parse_args().redis))
