"""Callers of an LLM provider (``tools/llm_provider.py``) that keeps a tokens and a requests
quota: ``processes`` x ``tasks`` callers, each sending calls of a random prompt and a fixed
``max_tokens`` as fast as they are let, in one of four ways (:data:`STRATEGIES`):

- ``settle``: before the call, ``acquire_all`` one request and prompt + ``max_tokens``
  tokens (one task per process asks at a time, reserving at most ``horizon`` s ahead,
  else asking again after at most that long); when the answer comes, the tokens grant is settled to
  ``usage.total_tokens`` (what was not used goes back at once); a 429's grants are kept;
- ``worst-case``: the same reservation, never settled: every call counts its prompt +
  ``max_tokens`` for a whole window;
- ``after``: before the call, one request only; after it, the call's ``usage.total_tokens``
  is taken from the tokens limiter, waiting for them (the caller pays for its call before
  its next one): what a client that meters tokens only once it knows them does;
- ``limits``: the best peer with weights, limits' moving window on Redis: before the call,
  ``hit(tokens, cost=prompt + max_tokens)`` and ``hit(requests)``, each retried after
  ``get_window_stats``' reset until it passes (limits cannot hand back or settle a hit, so
  the worst case is what it can charge without 429s).

A caller answered 429 sleeps the ``Retry-After`` and sends again, as the providers' SDKs do.
Every aiolimit limiter is a sliding window of the provider's quota with ``margin`` s added
to its interval (docs/http-clients.md: the spread of arrival times a partner sees).
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from tools.llm_provider import Provider, Seen, seen, serve

STRATEGIES = ("settle", "worst-case", "after", "limits")


@dataclass
class TokenTrial:
    """``processes`` x ``tasks`` callers against a provider of ``tpm`` tokens and ``rpm``
    requests per ``window`` s, for ``windows`` steady windows after a first one."""

    redis_url: str
    strategy: str = "settle"
    processes: int = 4
    tasks: int = 32
    tpm: int = 200_000
    rpm: int = 400
    window: float = 2.0
    windows: int = 20
    margin: float = 0.0
    latency: tuple[float, float] = (0.01, 0.1)  # the provider's shortest and longest call, s
    prompt: tuple[int, int] = (100, 900)  # a call's prompt tokens, uniform in this range
    max_tokens: int = 1024
    horizon: float = 0.01  # how far ahead a settle or worst-case caller reserves, s
    seed: int = 0
    prefix: str = "token-trial"


def available(strategy: str) -> bool:
    """Whether ``strategy`` can run here (``limits`` needs its package)."""
    return strategy != "limits" or importlib.util.find_spec("limits") is not None


def run(spec: TokenTrial) -> Seen:
    """Runs ``spec``'s callers in ``spec.processes`` processes; what the provider saw."""
    provider = Provider(spec.tpm, spec.rpm, spec.window, spec.latency, spec.seed)
    with serve(provider) as url:
        start_at = time.time() + 2.5  # (the workers' imports and connections first)
        context = multiprocessing.get_context("spawn")
        with context.Pool(spec.processes) as pool:
            results = [
                pool.apply_async(_worker, (spec, number, url, start_at))
                for number in range(spec.processes)
            ]
            for result in results:
                result.get(timeout=(spec.windows + 1) * spec.window + 60)
    return seen(provider.stats(), start_at, spec.windows)


def _worker(spec: TokenTrial, number: int, url: str, start_at: float) -> None:
    asyncio.run(_work(spec, number, url, start_at))


async def _work(spec: TokenTrial, number: int, url: str, start_at: float) -> None:
    strategy = await _open(spec)
    stop = start_at + (spec.windows + 1) * spec.window
    limits = httpx.Limits(max_connections=spec.tasks)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            await asyncio.gather(*(client.get("/ping") for _ in range(spec.tasks)))
            await asyncio.sleep(max(0.0, start_at - time.time()))
            seeds = (spec.seed * 1_000_003 + number * 1_009 + task for task in range(spec.tasks))
            await asyncio.gather(
                *(_caller(spec, strategy, client, random.Random(s), stop) for s in seeds)
            )
    finally:
        await strategy.close()


async def _caller(
    spec: TokenTrial,
    strategy: Strategy,
    client: httpx.AsyncClient,
    draws: random.Random,
    stop: float,
) -> None:
    while time.time() < stop:
        prompt = draws.randint(*spec.prompt)
        held = await strategy.before(prompt + spec.max_tokens)
        body = {"prompt_tokens": prompt, "max_tokens": spec.max_tokens}
        response = await client.post("/v1/chat/completions", json=body)
        if response.status_code == 429:
            await strategy.refused(held)
            await asyncio.sleep(float(response.headers["retry-after"]))
            continue
        response.raise_for_status()
        await strategy.after(held, response.json()["usage"]["total_tokens"])


# -- the four ways ------------------------------------------------------------------------------


class Strategy(Protocol):
    async def before(self, estimate: int) -> Any: ...
    async def after(self, held: Any, used: int) -> None: ...
    async def refused(self, held: Any) -> None: ...
    async def close(self) -> None: ...


async def _open(spec: TokenTrial) -> Strategy:
    if spec.strategy == "limits":
        return await LimitsWorstCase.open(spec)
    kinds = {"settle": ReserveSettle, "worst-case": WorstCase, "after": ChargeAfter}
    return kinds[spec.strategy](spec)


class ReserveSettle:
    """(a) prompt + ``max_tokens`` reserved with the request, settled to the usage."""

    def __init__(self, spec: TokenTrial) -> None:
        from redis.asyncio import Redis

        from aiolimit import RateLimiter, RedisBackend

        self.redis = Redis.from_url(spec.redis_url)
        self.backend = RedisBackend(self.redis)
        name, window, margin = f"{spec.prefix}-{spec.strategy}", spec.window, spec.margin
        self.rpm = RateLimiter(
            f"{name}-requests", self.backend, rate=spec.rpm, interval=window, margin=margin
        )
        self.tpm = RateLimiter(
            f"{name}-tokens", self.backend, rate=spec.tpm, interval=window, margin=margin
        )
        # A reservation is placed on what the store knows when it is made: a queue of
        # worst-case reservations far ahead would keep places that settled calls no longer
        # need. So one task per process asks at a time, the others wait here, and it reserves
        # only within ``horizon`` s, else asks again after at most that long.
        self.queue = asyncio.Lock()
        self.horizon = spec.horizon

    async def before(self, estimate: int) -> Any:
        from aiolimit import acquire_all

        async with self.queue:
            while True:
                acquired = await acquire_all(
                    [(self.rpm, 1), (self.tpm, estimate)], timeout=self.horizon
                )
                if acquired:
                    return acquired
                await asyncio.sleep(min(acquired.retry_after, self.horizon))

    async def after(self, held: Any, used: int) -> None:
        await settle(held, used, self.tpm)

    async def refused(self, held: Any) -> None:
        # Kept, not handed back: a 429 says the provider counts more than the limiter did
        # (requests that arrived late in its window), and the kept grant covers the
        # difference until it ages out, where handing it back would let the next caller
        # meet the same 429.
        pass

    async def close(self) -> None:
        await self.backend.aclose()
        await self.redis.aclose()


async def settle(acquired: Any, used: int, tpm: Any) -> None:
    """Settles the tokens grant of ``acquired`` (the second of ``acquire_all``) to ``used``."""
    await acquired.settle(used, limiter=tpm)


class WorstCase(ReserveSettle):
    """(b) the same reservation, never settled, never handed back."""

    async def after(self, held: Any, used: int) -> None:
        pass

    async def refused(self, held: Any) -> None:
        pass


class ChargeAfter(ReserveSettle):
    """(c) one request before the call; its tokens taken after it, waiting for them."""

    async def before(self, estimate: int) -> Any:
        await self.rpm.acquire()

    async def after(self, held: Any, used: int) -> None:
        await self.tpm.acquire(used)

    async def refused(self, held: Any) -> None:
        pass


class LimitsWorstCase:
    """(d) limits' moving window: the worst case hit before the call (it cannot settle)."""

    storage: Any
    limiter: Any
    tokens: Any
    requests: Any
    key: str

    @classmethod
    async def open(cls, spec: TokenTrial) -> LimitsWorstCase:
        from limits import RateLimitItemPerSecond  # type: ignore[import-not-found,unused-ignore]
        from limits.aio.storage import RedisStorage  # type: ignore[import-not-found,unused-ignore]
        from limits.aio.strategies import (  # type: ignore[import-not-found,unused-ignore]
            MovingWindowRateLimiter,
        )

        if spec.window != int(spec.window):
            raise ValueError("limits' items count whole seconds")
        self = cls()
        self.storage = RedisStorage(f"async+{spec.redis_url}", implementation="redispy")
        self.limiter = MovingWindowRateLimiter(self.storage)
        self.tokens = RateLimitItemPerSecond(spec.tpm, int(spec.window))
        self.requests = RateLimitItemPerSecond(spec.rpm, int(spec.window))
        self.key = f"{spec.prefix}-limits"
        return self

    async def before(self, estimate: int) -> Any:
        await self._hit(self.tokens, estimate)
        await self._hit(self.requests, 1)

    async def _hit(self, item: Any, cost: int) -> None:
        # limits does not wait: the documented way is to sleep until the window resets.
        while not await self.limiter.hit(item, self.key, cost=cost):
            stats = await self.limiter.get_window_stats(item, self.key)
            await asyncio.sleep(max(stats.reset_time - time.time(), 0.001))

    async def after(self, held: Any, used: int) -> None:
        pass

    async def refused(self, held: Any) -> None:
        pass

    async def close(self) -> None:
        client = getattr(self.storage.bridge, "storage", None)
        if client is not None:
            await client.aclose()
