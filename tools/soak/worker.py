"""One worker process of the soak tool: T tasks hammering one limiter, recording every grant.

The workload goes through the public :class:`~aiolimit.RateLimiter`. To learn the limiter's
own grant time, the backend is a :class:`~tools.soak.stamping.StampingBackend`: each
request notes the grant made for it (its limiter time, and this process's wall clock just
before and just after the script call), and keeps it only if the limiter call then returns
True, so a grant a cancelled caller handed back is never counted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from aiolimit import NotConfiguredError, Rate, RateLimiter, RateLimiterConfig, RateType

from .stamping import StampingBackend

__all__ = ["Grant", "WorkerConfig", "WorkerResult", "run_worker"]


class Grant(NamedTuple):
    """One granted request, as the worker saw it. Wall times are seconds (``time.time()``)."""

    process: int
    permits: int
    kind: str
    requested: float
    """Wall clock when the caller asked (before ``acquire``/``try_acquire``)."""
    sent: float
    """Wall clock just before the script call that granted."""
    received: float
    """Wall clock when ``acquire``/``try_acquire`` returned: the worker's own grant stamp
    (a waiter that was given a reserved future slot returns only once the slot is due)."""
    replied: float
    """Wall clock when the granting script call's reply arrived."""
    limiter_time: int
    """When the grant starts: microseconds of the limiter's clock (server ``TIME`` by
    default), corrected by any skew this worker injected into a client clock."""


@dataclass(frozen=True)
class WorkerConfig:
    url: str
    name: str
    rate_type: str
    rate: int
    """The most permits one request may ask for: the smallest rate's."""
    interval: float
    """The shortest rate's interval, seconds: the pace of timeouts and the final grace."""
    tasks: int
    mix: tuple[int, int, int]
    """Weights of acquire(1), try_acquire(1, timeout=…), acquire(2..max_multi)."""
    max_multi: int
    try_timeout: float
    clock: str
    """'server' or 'client'."""
    skew: float
    """Seconds added to this worker's client clock (only with clock='client')."""
    big: bool
    """Task 0 repeatedly asks for the whole rate; every other task floods acquire(1)."""
    big_timeout: float
    client_name: str
    client_retries: int
    """Retries redis-py makes on a dropped connection (0: ``Redis.from_url`` default)."""
    seed: int
    rates: str = ""
    """The limiter's rates, as ``Rate.parse`` reads them (empty: ``rate`` per ``interval``)."""
    algorithm: str = "SLIDING_WINDOW"
    min_spacing: float = 0.0
    """Seconds between the starts of consecutive grants (0: none)."""


@dataclass
class WorkerResult:
    process: int
    grants: list[Grant] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: dict[str, str] = field(default_factory=dict)
    refused: int = 0
    big_waits: list[float] = field(default_factory=list)
    """Seconds from asking for the whole rate to getting it."""
    big_timeouts: int = 0
    cancelled: int = 0


def run_worker(
    config: WorkerConfig,
    process: int,
    counts: Any,
    ready: Any,
    start: Any,
    window: Any,
    results: Any,
) -> None:
    """Process entry point: waits for ``start``, runs until ``window[1]``, sends its result."""
    result = asyncio.run(_main(config, process, counts, ready, start, window))
    results.put(result)


async def _main(
    config: WorkerConfig, process: int, counts: Any, ready: Any, start: Any, window: Any
) -> WorkerResult:
    options: dict[str, Any] = {}
    if config.client_retries:
        # redis-py retries a command whose connection dropped (a lost reply may have consumed
        # a permit; the caller still gets at most one grant per request).
        backoff = ExponentialWithJitterBackoff(base=0.01, cap=0.5)
        options["retry"] = Retry(backoff, config.client_retries)
    redis = Redis.from_url(config.url, client_name=config.client_name, **options)
    clock: Literal["server", "client"] | Callable[[], float] = "server"
    if config.clock == "client":
        skew = config.skew
        clock = (lambda: time.time() + skew) if skew else "client"
    backend = StampingBackend(redis, client_id=f"soak-process-{process}", clock=clock)
    # Grants are audited on the true clock, not the one this worker skewed.
    skew_us = round(config.skew * 1_000_000) if config.clock == "client" else 0
    limiter = RateLimiter(config.name, backend)
    result = WorkerResult(process)
    try:
        await redis.ping()
        ready.put(process)
        await asyncio.to_thread(start.wait)
        begin, end = window[0], window[1]
        await asyncio.sleep(max(0.0, begin - time.time()))
        rng = random.Random(config.seed * 1000 + process)
        tasks = [
            asyncio.ensure_future(
                _task(config, backend, limiter, process, index, end, rng, counts, result, skew_us)
            )
            for index in range(config.tasks)
        ]
        # Requests still waiting after the end get a few intervals to finish, then are dropped.
        grace = max(3 * config.interval, config.big_timeout if config.big else 0.0) + 1.0
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.time()) + grace)
        for task in pending:
            task.cancel()
        result.cancelled = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                result.errors[f"task crashed: {type(task.exception()).__name__}"] += 1
    finally:
        await redis.aclose()
    return result


def _pick(config: WorkerConfig, rng: random.Random) -> tuple[str, int]:
    acquire_weight, try_weight, multi_weight = config.mix
    roll = rng.random() * (acquire_weight + try_weight + multi_weight)
    if roll < acquire_weight:
        return "acquire", 1
    if roll < acquire_weight + try_weight:
        return "try", 1
    largest = min(config.max_multi, config.rate)
    if largest < 2:  # a rate of one permit: a request for several could never be granted
        return "acquire", 1
    return "multi", rng.randint(2, largest)


async def _task(
    config: WorkerConfig,
    backend: StampingBackend,
    limiter: RateLimiter,
    process: int,
    index: int,
    end: float,
    rng: random.Random,
    counts: Any,
    result: WorkerResult,
    skew_us: int,
) -> None:
    big = config.big and index == 0 and process == 0
    while time.time() < end:
        if big:
            kind, permits = "big", config.rate
        elif config.big:
            kind, permits = "acquire", 1
        else:
            kind, permits = _pick(config, rng)
        requested = time.time()
        try:
            with backend.request() as request:
                granted = await _ask(config, limiter, kind, permits)
        except NotConfiguredError as exc:
            # The server lost the config (a restart without persistence): set it again.
            result.errors[type(exc).__name__] += 1
            await _configure(config, limiter)
            continue
        except Exception as exc:
            result.errors[type(exc).__name__] += 1
            result.error_samples.setdefault(type(exc).__name__, str(exc)[:300])
            await asyncio.sleep(0.02)
            continue
        if big:
            if granted:
                result.big_waits.append(time.time() - requested)
            else:
                result.big_timeouts += 1
        if not granted:
            result.refused += 1
            continue
        grant = request.grant
        if grant is None:
            result.errors["grant without a recorded attempt"] += 1
            continue
        received = time.time()
        result.grants.append(
            Grant(
                process,
                permits,
                kind,
                requested,
                grant.sent,
                received,
                grant.replied,
                grant.time - skew_us,
            )
        )
        counts[process] += permits


async def _ask(config: WorkerConfig, limiter: RateLimiter, kind: str, permits: int) -> bool:
    if kind == "try":
        return await limiter.try_acquire(permits, timeout=config.try_timeout)
    if kind == "big":
        return await limiter.try_acquire(permits, timeout=config.big_timeout)
    await limiter.acquire(permits)
    return True


async def _configure(config: WorkerConfig, limiter: RateLimiter) -> None:
    try:
        rates = Rate.parse(config.rates) if config.rates else [Rate(config.rate, config.interval)]
        await limiter.try_set_rate(
            RateLimiterConfig.build(
                RateType(config.rate_type),
                rates,
                algorithm=config.algorithm,
                min_spacing=config.min_spacing or None,
            )
        )
    except Exception:
        await asyncio.sleep(0.02)
