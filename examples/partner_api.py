"""Calling a rate-limited partner API from many workers in two processes, without 429s.

A simulated partner (a real HTTP server on a free loopback port) allows 20 calls in any
second and answers 429 with Retry-After past that. Our workers, 6 per process, share one
limiter of 20 per 1.2 seconds through httpx's RateLimitedTransport, so the partner never
refuses them: the longer window absorbs the calls that reach it later than others (the first
ones of a connection). Once, the partner answers 429 with Retry-After: 1 anyway
(maintenance): every worker in both processes pauses for that second, and the refused call is
sent again after it; the process that received it logs the pause (a WARNING of ``aiolimit``).

    python examples/partner_api.py --redis redis://localhost:6379   # two processes
    AIOLIMIT_REDIS_URL=redis://localhost:6379 python examples/partner_api.py
    python examples/partner_api.py                  # no Redis: two worker groups in memory
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from collections import Counter, deque

import httpx
from aiohttp import web
from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.httpx import RateLimitedTransport

QUOTA = 20  # the partner's: calls per second
OUR_INTERVAL = 1.2  # a little longer than its second: delays on the way bunch arrivals
WORKERS = 6
CALLS_PER_WORKER = 6
MAINTENANCE_AT = 25  # the partner's 25th call is refused, quota or not


class Lateness:
    """How late this process runs, as a ticker due every 5 ms sees it. On a busy machine a
    process may not run for a while, and every call due meanwhile goes out at its end."""

    PERIOD = 0.005

    def __init__(self) -> None:
        self.due = time.monotonic()
        self.ticks: deque[tuple[float, float]] = deque(maxlen=20)  # (woke, how late): 0.1 s

    async def tick(self) -> None:
        while True:
            self.due = time.monotonic() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            woke = time.monotonic()
            self.ticks.append((woke, woke - self.due))

    def now(self) -> float:
        """How late the process ran in the last 0.1 s: the tick due now, or one before."""
        at = time.monotonic()
        recent = (late for woke, late in self.ticks if woke > at - 0.1)
        return max(at - self.due, *recent, 0.0)


class SentAt(httpx.AsyncBaseTransport):
    """Under the limiter's transport: marks each call with when it left, less how late the
    process ran then (the monotonic clock is the machine's, the same in both processes).
    A partner elsewhere sees calls arrive as they left; this one runs on the same busy
    machine, where a call can spend longer on its way than the calls behind it, so it
    judges its quota by these marks."""

    def __init__(self, lateness: Lateness) -> None:
        self.lateness = lateness
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["X-Sent-At"] = repr(time.monotonic() - self.lateness.now())
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Partner:
    """Enforces QUOTA per sliding second (of the calls' X-Sent-At), and refuses one call for
    maintenance."""

    def __init__(self) -> None:
        self.accepted: list[float] = []  # when each call answered 200 was sent
        self.arrivals: list[float] = []
        self.workers: list[str] = []  # whose each call was
        self.quota_429s = 0
        self.paused_from = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        sent = float(request.headers["X-Sent-At"])
        self.arrivals.append(now)
        self.workers.append(request.match_info["order"].rsplit("-", 1)[0])
        if len(self.arrivals) == MAINTENANCE_AT:
            self.paused_from = now
            return web.Response(status=429, headers={"Retry-After": "1"})
        if sum(sent - 1 < t <= sent for t in self.accepted) >= QUOTA:
            self.quota_429s += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.accepted.append(sent)
        return web.json_response({"ok": True})


async def run_workers(partner_url: str, backend: Backend, group: str) -> int:
    """Runs WORKERS workers sharing one limiter; returns the calls answered 200."""
    limiter = RateLimiter("example-partner-api", backend)
    # keep_alive: Redis forgets the limiter a minute after its last grant
    await limiter.try_set_rate(
        RateLimiterConfig.build(RateType.OVERALL, QUOTA, OUR_INTERVAL, keep_alive=60)
    )
    lateness = Lateness()
    ticker = asyncio.create_task(lateness.tick())
    transport = RateLimitedTransport(limiter, SentAt(lateness))
    async with httpx.AsyncClient(transport=transport, base_url=partner_url) as client:

        async def worker(n: int) -> int:
            ok = 0
            for call in range(CALLS_PER_WORKER):
                answer = await client.get(f"/orders/{group}-{n}-{call}")
                ok += answer.status_code == 200
            return ok

        results = await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    ticker.cancel()
    return sum(results)


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
    # What reached the partner after the 429: of each worker, at most the call it had under
    # way before the limiter paused it (however slowly a busy machine carried it); not one
    # call it started after that.
    during_pause = Counter(
        worker
        for t, worker in zip(partner.arrivals, partner.workers, strict=True)
        if 0 < t - partner.paused_from < 0.99
    )
    after_pausing = sum(count - 1 for count in during_pause.values())
    print(f"{groups}, {2 * WORKERS} workers: {calls} calls reached the partner")
    print(f"429s for the partner's quota: {partner.quota_429s}")
    print(
        f"forced 429 (Retry-After: 1), then calls during the pause: {after_pausing} "
        f"(and {len(during_pause)} already under way)"
    )
    print(f"calls answered 200 in this process: {ours} of {WORKERS * CALLS_PER_WORKER}")
    good = partner.quota_429s == 0 and not after_pausing and calls == 2 * 36 + 1
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
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("AIOLIMIT_REDIS_URL") or None,
        help="Redis URL: two processes share the limiter through it (default: "
        "$AIOLIMIT_REDIS_URL, else one process, in memory)",
    )
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # The partner's 429s, as aiolimit logs them: one line when a pause starts.
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    if args.worker:
        worker_process(args.worker, args.redis)
    else:
        raise SystemExit(asyncio.run(main(args.redis)))
