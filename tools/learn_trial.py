"""A partner whose limit is hidden and changes, and callers that must find it
(``benchmarks/learn.py``, ``tests/test_benchmarks.py``).

>>> result = trial(LearnTrial(redis_url, phases=(12, 6, 12), seconds=15), "learn")
>>> result.phases[1].refused, result.phases[1].delivered

A :class:`~tools.partner.Partner` keeps a strict sliding window of 1 s whose rate changes at
each phase; ``processes`` x ``tasks`` callers send as fast as they are let, through one of
:data:`CALLERS`. Each phase is judged after its first ``settle`` seconds: the calls that
arrived then, the 429s among them, the share of the hidden limit served, and when the
callers converged (the first of three seconds in a row that served at least 85 % of the
limit, refusing at most a tenth of it: a probe's one 429 is no miss).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from dataclasses import dataclass, field

import httpx

from tools.aimd import AimdPacer, PacedTransport
from tools.partner import Partner, Stamped, serve, stalls

CALLERS = ("fixed", "aimd", "learn", "stated")
"""The httpx transport with a limiter fixed at ``guess``; a per-process AIMD pacer starting
at (and at most) the process's share of ``guess``; ``learn=True`` with ``guess`` as the
ceiling; the same against a partner that states its limit (``RateLimit-Policy``)."""


@dataclass
class LearnTrial:
    redis_url: str
    phases: tuple[int, ...] = (12, 6, 12)
    seconds: float = 15.0
    settle: float = 5.0
    guess: int = 20
    processes: int = 5
    tasks: int = 4
    margin: float = 0.05  # seconds added to the limiter's interval (docs: HTTP clients)
    max_hold: float | None = None  # the Learner's (seconds; None: its default)
    prefix: str = "learn-trial"


@dataclass
class Phase:
    limit: int
    calls: int  # judged: arrived after the phase's first `settle` seconds
    refused: int
    delivered: float  # served / (limit x judged seconds)
    converged: float | None  # seconds after the change; None: never


@dataclass
class Result:
    caller: str
    phases: list[Phase] = field(default_factory=list)
    stall: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s, permits in force)


def trial(spec: LearnTrial, caller: str) -> Result:
    partner = Partner(spec.phases[0], 1.0, "sliding", states=caller == "stated")
    with serve(partner) as url:
        start_at = time.time() + 5.0  # (the workers' imports and connections first)
        changer = threading.Thread(target=_change, args=(partner, spec, start_at), daemon=True)
        changer.start()
        timeline: list[tuple[float, int]] = []
        watcher = threading.Thread(
            target=_watch, args=(spec, caller, start_at, timeline), daemon=True
        )
        watcher.start()
        context = multiprocessing.get_context("spawn")
        with context.Pool(spec.processes) as pool:
            runs = [
                pool.apply_async(_worker, (spec, caller, url, start_at))
                for _ in range(spec.processes)
            ]
            stall = max(run.get(timeout=spec.seconds * len(spec.phases) + 60) for run in runs)
        changer.join(5)
        watcher.join(5)
    result = Result(caller, stall=stall, timeline=timeline)
    for number, limit in enumerate(spec.phases):
        result.phases.append(judged(partner, spec, start_at + number * spec.seconds, limit))
    return result


def _change(partner: Partner, spec: LearnTrial, start_at: float) -> None:
    for number, limit in enumerate(spec.phases[1:], 1):
        time.sleep(max(0.0, start_at + number * spec.seconds - time.time()))
        partner.rate = limit


def _watch(
    spec: LearnTrial, caller: str, start_at: float, timeline: list[tuple[float, int]]
) -> None:
    """Reads the limiter's rate in force every 100 ms (the learned one: its config)."""
    from redis import Redis

    from aiolimit.backends.redis._keys import Keys

    config = Keys("aiolimit:", f"{spec.prefix}-{caller}").config
    stop = start_at + spec.seconds * len(spec.phases)
    with Redis.from_url(spec.redis_url) as redis:
        while time.time() < stop:
            time.sleep(0.1)
            rate = redis.hget(config, "rate")
            if rate is not None and time.time() >= start_at:
                timeline.append((round(time.time() - start_at, 2), int(rate)))


def judged(partner: Partner, spec: LearnTrial, began: float, limit: int) -> Phase:
    """One phase as the partner saw it."""
    requests = partner.stats()["requests"]
    ended = began + spec.seconds
    judged_from = began + spec.settle
    inside = [(at, served) for at, _late, served in requests if judged_from <= at < ended]
    served = sum(1 for _, ok in inside if ok)
    seconds = ended - judged_from
    converged = None
    run = 0
    for second in range(int(spec.seconds)):
        lo = began + second
        bucket = [(at, ok) for at, _late, ok in requests if lo <= at < lo + 1]
        refused = sum(not ok for _, ok in bucket)  # (a probe's one 429 is not a miss)
        on = len(bucket) - refused >= 0.85 * limit and refused <= max(1, limit // 10)
        run = run + 1 if on else 0
        if run == 3:
            converged = float(second - 2)
            break
    return Phase(limit, len(inside), len(inside) - served, served / (limit * seconds), converged)


def _worker(spec: LearnTrial, caller: str, url: str, start_at: float) -> float:
    return asyncio.run(_work(spec, caller, url, start_at))


async def _work(spec: LearnTrial, caller: str, url: str, start_at: float) -> float:
    from redis.asyncio import Redis

    from aiolimit import Learner, RateLimiter, RateLimiterConfig, RateType, RedisBackend
    from aiolimit.httpx import RateLimitedTransport

    redis = Redis.from_url(spec.redis_url)
    backend = RedisBackend(redis)
    stop = start_at + spec.seconds * len(spec.phases)
    try:
        transport: httpx.AsyncBaseTransport
        if caller == "aimd":
            transport = PacedTransport(AimdPacer(spec.guess / spec.processes))
        else:
            name = f"{spec.prefix}-{caller}"
            limiter = RateLimiter(
                name,
                backend,
                rate=RateLimiterConfig.build(
                    RateType.OVERALL, spec.guess, 1, margin=spec.margin, keep_alive=3600
                ),
            )
            learn: bool | Learner = caller in ("learn", "stated")
            if learn and spec.max_hold is not None:
                learn = Learner(limiter, max_hold=spec.max_hold)
            transport = RateLimitedTransport(
                limiter, Stamped(httpx.AsyncHTTPTransport()), learn=learn
            )
        await asyncio.sleep(max(0.0, start_at - time.time()))
        worst = [0.0]
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:

            async def call() -> None:
                while time.time() < stop:
                    try:
                        await client.get(f"{url}/call")
                    except httpx.TransportError:  # (a keep-alive the server closed meanwhile)
                        continue

            await asyncio.gather(
                stalls(start_at, stop, worst), *(call() for _ in range(spec.tasks))
            )
        return worst[0]
    finally:
        await backend.aclose()
        await redis.aclose()
