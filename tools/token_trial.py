"""Callers of an LLM provider (``tools/llm_provider.py``) that keeps a tokens and a requests
quota: ``processes`` x ``tasks`` callers, each sending calls of a random prompt and a fixed
``max_tokens`` as fast as they are let, in one of these ways (:data:`STRATEGIES`):

- ``transport``: through ``RateLimitedTransport(requests, tokens=tokens, estimate=...)``,
  which reserves prompt + ``max_tokens`` with the request and settles to the body's usage;
- ``reserve``: by hand, as the docs show it: ``acquired = await tokens.reserve(prompt +
  max_tokens, timeout=30)`` (again when refused), the call, ``await
  acquired.settle(usage.total_tokens)``; no requests limiter, nothing else;
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
import json
import multiprocessing
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from tools.llm_provider import Provider, Seen, seen, serve
from tools.partner import LATENESS_HEADER, stalls, stamp_when_written, start_of

STRATEGIES = ("transport", "reserve", "settle", "worst-case", "after", "limits")


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
            ends = (spec.windows + 1) * spec.window + 60
            worst = [result.get(timeout=ends) for result in results]
    result = seen(provider.stats(), start_at, spec.windows, spec.margin)
    result.stall = max(worst, default=0.0)
    return result


def _worker(spec: TokenTrial, number: int, url: str, start_at: float) -> float:
    """One caller process; how late its event loop ran at worst in the steady windows."""
    return asyncio.run(_work(spec, number, url, start_at))


async def _work(spec: TokenTrial, number: int, url: str, start_at: float) -> float:
    strategy = await _open(spec)
    stop = start_at + (spec.windows + 1) * spec.window
    connections = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=spec.tasks))
    transport = strategy.transport(connections)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30, transport=transport) as client:
            # Every connection opened before the run, on the transport that sends the calls.
            await asyncio.gather(*(_ping(transport, url) for _ in range(spec.tasks)))
            await asyncio.sleep(max(0.0, start_at - time.time()))
            seeds = (spec.seed * 1_000_003 + number * 1_009 + task for task in range(spec.tasks))
            worst = [0.0]
            await asyncio.gather(
                stalls(start_at, stop, worst),
                *(_caller(spec, strategy, client, random.Random(s), stop) for s in seeds),
            )
            return worst[0]
    finally:
        await strategy.close()


async def _ping(transport: httpx.AsyncBaseTransport, url: str) -> None:
    response = await transport.handle_async_request(httpx.Request("GET", f"{url}/ping"))
    await response.aread()
    await response.aclose()


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
        start = start_of(held)
        headers = {} if start is None else {LATENESS_HEADER: str(start)}
        response = await client.post(
            "/v1/chat/completions", json=body, headers=headers, extensions=strategy.extensions
        )
        if response.status_code == 429:
            await strategy.refused(held)
            await asyncio.sleep(float(response.headers["retry-after"]))
            continue
        response.raise_for_status()
        await strategy.after(held, response.json()["usage"]["total_tokens"])


# -- the four ways ------------------------------------------------------------------------------


class Strategy(Protocol):
    extensions: dict[str, Any]  # each call's (the transport's: stamped as it is written)

    def transport(self, connections: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport: ...
    async def before(self, estimate: int) -> Any: ...
    async def after(self, held: Any, used: int) -> None: ...
    async def refused(self, held: Any) -> None: ...
    async def close(self) -> None: ...


async def _open(spec: TokenTrial) -> Strategy:
    if spec.strategy == "limits":
        return await LimitsWorstCase.open(spec)
    kinds: dict[str, type[ReserveSettle]] = {
        "settle": ReserveSettle,
        "transport": Transport,
        "reserve": ByHand,
        "worst-case": WorstCase,
        "after": ChargeAfter,
    }
    return kinds[spec.strategy](spec)


class ReserveSettle:
    """(a) prompt + ``max_tokens`` reserved with the request, settled to the usage."""

    extensions: dict[str, Any] = {}  # noqa: RUF012 (read only)

    def __init__(self, spec: TokenTrial) -> None:
        from redis.asyncio import Redis

        from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend

        self.redis = Redis.from_url(spec.redis_url)
        self.backend = RedisBackend(self.redis)
        # A margin of 0 is none given: the limiters' default.
        name, window, margin = f"{spec.prefix}-{spec.strategy}", spec.window, spec.margin or None
        self.rpm = RateLimiter(
            f"{name}-requests",
            self.backend,
            rate=RateLimiterConfig.build(RateType.OVERALL, spec.rpm, window, margin=margin),
        )
        self.tpm = RateLimiter(
            f"{name}-tokens",
            self.backend,
            rate=RateLimiterConfig.build(RateType.OVERALL, spec.tpm, window, margin=margin),
        )
        # A reservation is placed on what the store knows when it is made: a queue of
        # worst-case reservations far ahead would keep places that settled calls no longer
        # need. So one task per process asks at a time, the others wait here, and it reserves
        # only within ``horizon`` s, else asks again after at most that long.
        self.queue = asyncio.Lock()
        self.horizon = spec.horizon

    def transport(self, connections: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        return connections

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


class Transport(ReserveSettle):
    """(a) through ``RateLimitedTransport(requests, tokens=...)`` on its own connections, as a
    user writes it: every task asks at once, reserving prompt + ``max_tokens`` (read from the
    body) as long ahead as it takes; the transport settles to the body's ``usage`` and syncs
    from the provider's headers. Each call carries its grant's start, stamped as it is
    written (``stamp_when_written``)."""

    extensions = {"trace": stamp_when_written}  # noqa: RUF012 (read only)

    def __init__(self, spec: TokenTrial) -> None:
        super().__init__(spec)
        self.max_tokens = spec.max_tokens

    def transport(self, connections: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        from aiolimit.httpx import RateLimitedTransport

        def estimate(request: httpx.Request) -> int:
            if not request.content:  # (a ping: a request, no tokens)
                return 0
            return int(json.loads(request.content)["prompt_tokens"]) + self.max_tokens

        return RateLimitedTransport(self.rpm, tokens=self.tpm, estimate=estimate, retry=False)

    async def before(self, estimate: int) -> Any:
        return None

    async def after(self, held: Any, used: int) -> None:
        pass


class ByHand(ReserveSettle):
    """``tokens.reserve(prompt + max_tokens)`` in every task, settled to the usage: what a
    user writes first (docs/token-budgets.md)."""

    async def before(self, estimate: int) -> Any:
        while True:
            acquired = await self.tpm.reserve(estimate, timeout=30)
            if acquired:
                return acquired

    async def after(self, held: Any, used: int) -> None:
        await held.settle(used)


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

    extensions: dict[str, Any] = {}  # noqa: RUF012 (read only)

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

    def transport(self, connections: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        return connections

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
