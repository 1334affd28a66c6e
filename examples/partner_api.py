"""Calling a rate-limited partner API from many workers in two processes, without 429s.

A simulated partner (a real HTTP server on a free loopback port) allows 20 calls in any
second and answers 429 with Retry-After past that. Our workers, 6 per process, share one
limiter of 20 per 1.2 seconds through httpx's RateLimitedTransport, so the partner never
refuses them: the longer window absorbs the calls that reach it later than others (the first
ones of a connection). Once, the partner answers 429 with Retry-After: 1 anyway
(maintenance): every worker in both processes pauses for that second, and the refused call is
sent again after it.

    python examples/partner_api.py --redis redis://localhost:6379   # two processes
    python examples/partner_api.py                  # no Redis: two worker groups in memory
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections import deque

import httpx
from aiohttp import web
from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, RateLimiter, RateType, RedisBackend
from aiolimit.httpx import RateLimitedTransport

QUOTA = 20  # the partner's: calls per second
OUR_INTERVAL = 1.2  # a little longer than its second: delays on the way bunch arrivals
WORKERS = 6
CALLS_PER_WORKER = 6
MAINTENANCE_AT = 25  # the partner's 25th call is refused, quota or not


class Partner:
    """Enforces QUOTA per sliding second, and refuses one call for maintenance."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque()
        self.arrivals: list[float] = []
        self.quota_429s = 0
        self.paused_from = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        self.arrivals.append(now)
        while self.recent and self.recent[0] <= now - 1:
            self.recent.popleft()
        if len(self.arrivals) == MAINTENANCE_AT:
            self.paused_from = now
            return web.Response(status=429, headers={"Retry-After": "1"})
        if len(self.recent) >= QUOTA:
            self.quota_429s += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.recent.append(now)
        return web.json_response({"ok": True})


async def run_workers(partner_url: str, backend: Backend, group: str) -> int:
    """Runs WORKERS workers sharing one limiter; returns the calls answered 200."""
    limiter = RateLimiter("example-partner-api", backend)
    await limiter.try_set_rate(RateType.OVERALL, QUOTA, OUR_INTERVAL)
    transport = RateLimitedTransport(limiter)
    async with httpx.AsyncClient(transport=transport, base_url=partner_url) as client:

        async def worker(n: int) -> int:
            ok = 0
            for call in range(CALLS_PER_WORKER):
                answer = await client.get(f"/orders/{group}-{n}-{call}")
                ok += answer.status_code == 200
            return ok

        return sum(await asyncio.gather(*(worker(n) for n in range(WORKERS))))


async def main(redis_url: str | None) -> int:
    partner = Partner()
    app = web.Application()
    app.router.add_get("/orders/{order}", partner.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    redis = Redis.from_url(redis_url) if redis_url else None
    try:
        if redis is not None:
            if stale := await redis.keys("aiolimit:{example-partner-api*"):
                await redis.delete(*stale)  # an earlier run's pause or grants
            other = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--worker", url, "--redis", str(redis_url)
            )
            ours = await run_workers(url, RedisBackend(redis), "a")
            await other.wait()
            groups = "two processes"
        else:
            backend = MemoryBackend()
            results = await asyncio.gather(*(run_workers(url, backend, g) for g in "ab"))
            ours = results[0]
            groups = "two worker groups"
    finally:
        await runner.cleanup()
        if redis is not None:
            await redis.aclose()

    calls = len(partner.arrivals)
    # what was sent after the 429 (calls in flight then may still arrive in the first moment)
    during_pause = [t for t in partner.arrivals if 0.05 < t - partner.paused_from < 0.99]
    print(f"{groups}, {2 * WORKERS} workers: {calls} calls reached the partner")
    print(f"429s for the partner's quota: {partner.quota_429s}")
    print(f"forced 429 (Retry-After: 1), then calls during the pause: {len(during_pause)}")
    print(f"calls answered 200 in this process: {ours} of {WORKERS * CALLS_PER_WORKER}")
    good = partner.quota_429s == 0 and not during_pause and calls == 2 * 36 + 1
    print("OK: no 429 for the quota, and every worker paused" if good else "FAILED")
    return 0 if good else 1


def worker_process(url: str, redis_url: str) -> None:
    async def run() -> None:
        redis = Redis.from_url(redis_url)
        try:
            await run_workers(url, RedisBackend(redis), "b")
        finally:
            await redis.aclose()

    asyncio.run(run())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", help="Redis URL: two processes share the limiter through it")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_process(args.worker, args.redis)
    else:
        raise SystemExit(asyncio.run(main(args.redis)))
