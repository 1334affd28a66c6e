"""The middleware's own CPU per request: a trivial ASGI app called in-process (no HTTP), bare
and behind ``RateLimitMiddleware``, for checkouts side by side.

    git archive main aiolimit | tar -x -C /tmp/aiolimit-main
    python benchmarks/asgi_cost.py /tmp/aiolimit-main .

``benchmarks/http.py`` measures the whole stack (uvicorn, a load generator and Redis sharing
the machine's cores), where a few µs of the middleware are lost in the noise of the rest. Here
64 tasks call the app directly, one request after another, each with a fresh HTTP scope, and
the process's CPU time per request is read: the Starlette app of http.py (``GET /hello``
answering ``{"hello": "world"}``) bare, behind one rule (``OVERALL``, the default algorithm),
and behind two (a global rule and a per-client rule, ``key=client_ip``). Every rate is
1,000,000/second, so every request is granted and does the whole path, its Redis script call
shared with the requests in flight. A last row has no app: 64 tasks calling ``acquire_all``
over two limiters (what two rules do), with the garbage collections it sets off. Starts its
own redis-server on a free 127.0.0.1 port. Each configuration of each checkout runs in a
fresh process, in alternating rounds; the tables have the median of the rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/http.py is named like the standard library's ``http`` package, which Starlette
# imports: keep this directory off the import path.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import time
from typing import Any

CONFIGS = {"bare": "bare app", "1-rule": "1 rule", "2-rules": "2 rules (global + per-client)"}
# Not an app: 64 tasks calling acquire_all over two limiters, the call the 2 rules make.
ACQUIRE_ALL = "acquire_all of 2 (no app)"
TASKS = 64
RATE = "1000000/second"


def build(config: str, url: str) -> Any:
    from redis.asyncio import Redis
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request: Request) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    app = Starlette(routes=[Route("/hello", hello)])
    if config == "bare":
        return app
    from aiolimit import RedisBackend
    from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip

    rules = [Rule(f"asgi-cost-{os.getpid()}", RATE)]
    if config == "2-rules":
        rules.append(Rule(f"asgi-cost-pc-{os.getpid()}", RATE, key=client_ip))
    return RateLimitMiddleware(app, backend=RedisBackend(Redis.from_url(url)), rules=rules)


async def acquire_all_cost(url: str, calls: int) -> tuple[float, int, int]:
    """CPU µs per acquire_all call over two limiters, and the garbage collections meanwhile."""
    from redis.asyncio import Redis

    import aiolimit

    backend = aiolimit.RedisBackend(Redis.from_url(url))
    limiters = [aiolimit.RateLimiter(f"asgi-cost-all-{i}-{os.getpid()}", backend) for i in (1, 2)]
    for limiter in limiters:
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
    app = build(config, url)
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


def run_one(config: str, url: str, requests: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(measure(config, url, requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", default=["."])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # config, url: in a subprocess
    args = parser.parse_args()
    if args.one:
        run_one(args.one[0], args.one[1], args.requests)
        return
    from tools import LocalRedis

    configs = [*CONFIGS, "acquire-all"]
    results: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
    with LocalRedis() as server:
        for _ in range(args.rounds):
            for checkout in args.checkouts:
                env = {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
                for config in configs:
                    done = subprocess.run(
                        [sys.executable, __file__, "--one", config, server.url,
                         "--requests", str(args.requests)],
                        capture_output=True, text=True, env=env, check=True,
                    )  # fmt: skip
                    results.setdefault((checkout, config), []).append(
                        tuple(json.loads(done.stdout))
                    )

    def median(checkout: str, config: str) -> float:
        return statistics.median(r[0] for r in results[(checkout, config)])

    print(f"CPU µs per request, median of {args.rounds} rounds ({TASKS} tasks, in-process)\n")
    print("| checkout | " + " | ".join(CONFIGS.values()) + " | added by 1 rule | by 2 rules |")
    print("|---|" + "--:|" * (len(CONFIGS) + 2))
    for checkout in args.checkouts:
        cost = {c: median(checkout, c) for c in CONFIGS}
        cells = [f"{cost[c]:.1f}" for c in CONFIGS]
        added = [f"+{cost[c] - cost['bare']:.1f}" for c in ("1-rule", "2-rules")]
        print(f"| {checkout} | " + " | ".join(cells + added) + " |")
    print(f"\n{ACQUIRE_ALL}: CPU µs per call, and garbage collections per 10 000 calls "
          "(youngest generation / full), median of the rounds\n")  # fmt: skip
    print("| checkout | µs / call | collections (youngest / full) |")
    print("|---|--:|--:|")
    for checkout in args.checkouts:
        runs = results[(checkout, "acquire-all")]
        young = statistics.median(r[1] for r in runs) * 10_000 / args.requests
        full = statistics.median(r[2] for r in runs) * 10_000 / args.requests
        print(f"| {checkout} | {median(checkout, 'acquire-all'):.1f} | {young:.0f} / {full:.1f} |")


if __name__ == "__main__":
    main()
