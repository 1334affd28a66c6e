"""The two halves of http_middleware.py that run in processes of their own: the app (bare,
behind aiolimit's middleware, or slowapi's), served by uvicorn or called in-process, and the
load generator (64 aiohttp tasks, each on its own keep-alive connection).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from typing import Any

TASKS = 64
RATE = "1000000/second"  # never refused: far above any throughput here


def build_app(config: str, redis_url: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if config == "slowapi":
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.util import get_remote_address

        limiter = Limiter(key_func=get_remote_address, storage_uri=redis_url)

        @limiter.limit(RATE)
        async def limited_hello(request: Request) -> JSONResponse:
            return JSONResponse({"hello": "world"})

        app = Starlette(routes=[Route("/hello", limited_hello)])
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]
        return app

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    app = Starlette(routes=[Route("/hello", hello)])
    if config == "bare":
        return app

    from redis.asyncio import Redis as AsyncRedis

    from aiolimit import RedisBackend
    from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip

    rules = [Rule(f"bench-api-global-{os.getpid()}", RATE)]
    if config == "aiolimit-2":
        rules.append(Rule(f"bench-api-per-client-{os.getpid()}", RATE, key=client_ip))
    backend = RedisBackend(AsyncRedis.from_url(redis_url))
    return RateLimitMiddleware(app, backend=backend, rules=rules)


def serve(config: str, port: int, redis_url: str, loop: str, http: str) -> None:
    import uvicorn

    uvicorn.run(
        build_app(config, redis_url),
        host="127.0.0.1",
        port=port,
        workers=1,
        loop=loop,  # type: ignore[arg-type]
        http=http,  # type: ignore[arg-type]
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


async def load(url: str, clients: int, warmup: float, duration: float) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    measuring = stopping = False
    clock = time.perf_counter

    async def client(session: aiohttp.ClientSession) -> None:
        while not stopping:
            before = clock()
            async with session.get(url) as response:
                await response.read()
            if measuring:
                latencies.append(clock() - before)
                statuses[response.status] = statuses.get(response.status, 0) + 1

    # One connection per task, kept alive; no cookie jar, no per-request timeout object.
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        tasks = [asyncio.ensure_future(client(session)) for _ in range(clients)]
        await asyncio.sleep(warmup)
        measuring = True
        began, cpu = clock(), time.process_time()
        await asyncio.sleep(duration)
        measuring = False
        elapsed, cpu = clock() - began, time.process_time() - cpu
        stopping = True
        await asyncio.gather(*tasks)
    latencies.sort()
    count = len(latencies)
    return {
        "requests": count,
        "elapsed": elapsed,
        "rps": count / elapsed,
        "p50_ms": latencies[count // 2] * 1000 if count else None,
        "p99_ms": latencies[min(count - 1, int(count * 0.99))] * 1000 if count else None,
        "statuses": statuses,
        "load_cpu": cpu,
    }


def run_load(url: str, clients: int, warmup: float, duration: float) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(load(url, clients, warmup, duration))))


# -- in-process: the app called with no HTTP ----------------------------------------


async def acquire_all_cost(url: str, calls: int) -> tuple[float, int, int]:
    """CPU µs per acquire_all call over two limiters, and the garbage collections meanwhile."""
    from redis.asyncio import Redis

    import aiolimit

    backend = aiolimit.RedisBackend(Redis.from_url(url))
    limiters = [aiolimit.RateLimiter(f"asgi-cost-all-{i}-{os.getpid()}", backend) for i in (1, 2)]
    for limiter in limiters:
        # (the loose arguments, deprecated: every checkout compared, older ones too, takes them)
        await limiter.set_rate(aiolimit.RateType.OVERALL, 1_000_000, 1)
    pairs = [(limiter, 1) for limiter in limiters]

    async def caller(count: int) -> None:
        for _ in range(count):
            assert await aiolimit.acquire_all(pairs)

    await asyncio.gather(*(caller(200) for _ in range(TASKS)))  # warm-up
    return await _timed(lambda each: asyncio.gather(*(caller(each) for _ in range(TASKS))), calls)


async def _timed(run: Any, count: int) -> tuple[float, int, int]:
    """CPU µs per call of ``run(each)`` (``each`` calls per task), and the collections of the
    youngest and of the oldest generation meanwhile."""
    collections = [0, 0, 0]

    def counted(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections[info["generation"]] += 1

    each = count // TASKS
    gc.callbacks.append(counted)
    cpu = time.process_time()
    await run(each)
    cpu = time.process_time() - cpu
    gc.callbacks.remove(counted)
    return cpu / (each * TASKS) * 1e6, collections[0], collections[2]


async def measure(config: str, url: str, requests: int) -> tuple[float, int, int]:
    """CPU µs per request of ``config`` after a warm-up, and the garbage collections."""
    if config == "acquire-all":
        return await acquire_all_cost(url, requests)
    app = build_app(config, url)
    startup: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def lifespan_send(message: dict[str, Any]) -> None:
        started.set()

    lifespan = asyncio.ensure_future(
        app(
            {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
            startup.get,
            lifespan_send,
        )
    )
    await started.wait()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200, message

    async def client(count: int) -> None:
        for _ in range(count):
            scope = {
                "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": "1.1", "server": ("127.0.0.1", 8000),
                "client": ("127.0.0.1", 50000), "scheme": "http", "method": "GET",
                "root_path": "", "path": "/hello", "raw_path": b"/hello", "query_string": b"",
                "headers": [(b"host", b"127.0.0.1:8000"), (b"accept", b"*/*")], "state": {},
            }  # fmt: skip
            await app(scope, receive, send)

    await asyncio.gather(*(client(200) for _ in range(TASKS)))  # warm-up
    cost = await _timed(
        lambda each: asyncio.gather(*(client(each) for _ in range(TASKS))), requests
    )
    lifespan.cancel()
    return cost


def in_process(config: str, url: str, requests: int) -> dict[str, float]:
    """CPU µs per request of ``config`` called in this process, and the garbage collections
    (youngest generation, full) meanwhile."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    cpu, young, full = asyncio.run(measure(config, url, requests))
    return {"cpu_us": cpu, "young": young, "full": full}
