"""The limiters under test, each behind the same small interface, on redis.asyncio clients.

A contender is opened on a server URL and a list of limiter names, all with the same rate per
interval, and then answers ``hit(i)`` (one non-blocking attempt on limiter ``i``: granted or
not) and ``acquire(i)`` (waits, the library's own way, until limiter ``i`` grants one permit).
A peer whose package is not installed (``pip install -e '.[bench]'``) is left out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

import aiolimit

# Concurrent configuration calls while setting up 10 000 limiters.
_SETUP_BATCH = 50


class Contender:
    name = ""
    reference = False  # a no-limiter reference row, left out of the "best peer"
    blocking = True  # has an acquire() that waits (takes part in the saturation scenario)
    package = ""  # the module a peer needs

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        raise NotImplementedError

    async def hit(self, index: int) -> bool:
        raise NotImplementedError

    async def acquire(self, index: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass


async def _in_batches(calls: list[Any]) -> None:
    for start in range(0, len(calls), _SETUP_BATCH):
        await asyncio.gather(*(call() for call in calls[start : start + _SETUP_BATCH]))


class Aiolimit(Contender):
    """aiolimit with one of its algorithms (the sliding window, its default, is "aiolimit")."""

    def __init__(self, algorithm: aiolimit.Algorithm = aiolimit.Algorithm.SLIDING_WINDOW) -> None:
        self.algorithm = algorithm
        default = algorithm is aiolimit.Algorithm.SLIDING_WINDOW
        self.name = "aiolimit" if default else f"aiolimit {algorithm.value.lower()}"
        # The saturation scenario's lateness is measured against the sliding window's slots.
        self.blocking = default

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        self.redis = Redis.from_url(url)
        backend = aiolimit.RedisBackend(self.redis)
        self.limiters = [aiolimit.RateLimiter(name, backend) for name in names]
        # The loose arguments (deprecated): every checkout compared, older ones too, takes them.
        await _in_batches(
            [
                lambda lim=lim: lim.set_rate(
                    aiolimit.RateType.OVERALL, rate, interval, algorithm=self.algorithm
                )
                for lim in self.limiters
            ]
        )

    async def hit(self, index: int) -> bool:
        return await self.limiters[index].try_acquire()

    async def acquire(self, index: int) -> None:
        await self.limiters[index].acquire()

    async def close(self) -> None:
        await self.redis.aclose()


class Limits(Contender):
    """limits with its async redis storage on redis-py (``implementation="redispy"``)."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.name = f"limits {strategy}"
        self.package = "limits"

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        from limits import RateLimitItemPerSecond
        from limits.aio.storage import RedisStorage
        from limits.aio.strategies import (
            MovingWindowRateLimiter,
            SlidingWindowCounterRateLimiter,
        )

        assert interval == 1.0, "the limits rows use per-second items"
        self.storage = RedisStorage(f"async+{url}", implementation="redispy")
        strategies = {
            "moving window": MovingWindowRateLimiter,
            "sliding window counter": SlidingWindowCounterRateLimiter,
        }
        self.limiter = strategies[self.strategy](self.storage)
        self.item = RateLimitItemPerSecond(rate)
        self.names = names

    async def hit(self, index: int) -> bool:
        return await self.limiter.hit(self.item, self.names[index])

    async def acquire(self, index: int) -> None:
        # limits does not wait: the documented way is to sleep until the window resets.
        while not await self.limiter.hit(self.item, self.names[index]):
            stats = await self.limiter.get_window_stats(self.item, self.names[index])
            await asyncio.sleep(max(stats.reset_time - time.time(), 0.001))

    async def close(self) -> None:
        client = getattr(self.storage.bridge, "storage", None)
        if client is not None:
            await client.aclose()


class Pyrate(Contender):
    """PyrateLimiter: one RedisBucket per limiter name, async redis-py client."""

    name = "PyrateLimiter"
    package = "pyrate_limiter"

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        from pyrate_limiter import BucketFactory, Limiter, Rate, RateItem, RedisBucket

        self.redis = Redis.from_url(url)
        rates = [Rate(rate, round(interval * 1000))]
        first = await RedisBucket.init(rates, self.redis, f"pyrate:{names[0]}")
        buckets = {names[0]: first}
        for name in names[1:]:  # the script is loaded once; the rest share its sha
            buckets[name] = RedisBucket(rates, self.redis, f"pyrate:{name}", first.script_hash)

        class ByName(BucketFactory):  # type: ignore[misc]
            def wrap_item(self, name: str, weight: int = 1) -> RateItem:
                return RateItem(name, time.time_ns() // 1_000_000, weight=weight)

            def get(self, item: RateItem) -> RedisBucket:
                return buckets[item.name]

        self.limiter = Limiter(first if len(names) == 1 else ByName())
        self.names = names

    async def hit(self, index: int) -> bool:
        return await self.limiter.try_acquire_async(self.names[index], blocking=False)

    async def acquire(self, index: int) -> None:
        await self.limiter.try_acquire_async(self.names[index], blocking=True)

    async def close(self) -> None:
        self.limiter.close()
        await self.redis.aclose()


class Throttled(Contender):
    """throttled-py with its async RedisStore (redis.asyncio), default token bucket."""

    name = "throttled-py"
    package = "throttled"

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        from throttled.asyncio import RedisStore, Throttled, per_duration

        self.store = RedisStore(server=url, options={"MAX_CONNECTIONS": 100})
        quota = per_duration(timedelta(seconds=interval), rate)
        self.check = Throttled(quota=quota, store=self.store)
        self.wait = Throttled(quota=quota, store=self.store, timeout=60)
        self.names = names

    async def hit(self, index: int) -> bool:
        return not (await self.check.limit(self.names[index])).limited

    async def acquire(self, index: int) -> None:
        await self.wait.limit(self.names[index])


class Incr(Contender):
    """No limiter: one redis-py INCR per call, the cost of a plain round trip."""

    name = "redis-py INCR (reference)"
    reference = True
    blocking = False

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        self.redis = Redis.from_url(url)
        self.keys = [f"incr:{name}" for name in names]

    async def hit(self, index: int) -> bool:
        await self.redis.incr(self.keys[index])
        return True

    async def close(self) -> None:
        await self.redis.aclose()


class Evalsha(Contender):
    """aiolimit's acquire script sent with a plain redis-py EVALSHA: no limiter code, no
    coalescing. The script-only cost a grant would have without aiolimit's client side."""

    name = "redis-py EVALSHA acquire.lua (reference)"
    reference = True
    blocking = False

    async def open(self, url: str, names: list[str], rate: int, interval: float) -> None:
        setup = Aiolimit()
        await setup.open(url, [f"evalsha:{name}" for name in names], rate, interval)
        backend = setup.limiters[0].backend
        assert isinstance(backend, aiolimit.RedisBackend)
        self.keys = [
            backend.keys(lim.name).budget(aiolimit.RateType.OVERALL, "") for lim in setup.limiters
        ]
        await setup.close()
        from aiolimit.backends.redis._scripts import ACQUIRE  # the script, as aiolimit sends it

        self.redis = Redis.from_url(url)
        self.sha = await self.redis.script_load(ACQUIRE.source)

    async def hit(self, index: int) -> bool:
        reply = await self.redis.evalsha(self.sha, 3, *self.keys[index], "1 - 0 OVERALL")
        return reply.startswith(b"0 ")

    async def close(self) -> None:
        await self.redis.aclose()


def all_contenders() -> list[Contender]:
    """Every contender whose package is installed."""
    every = [
        Aiolimit(),
        Aiolimit(aiolimit.Algorithm.TOKEN_BUCKET),
        Aiolimit(aiolimit.Algorithm.FIXED_WINDOW),
        Limits("moving window"),
        Limits("sliding window counter"),
        Pyrate(),
        Throttled(),
        Incr(),
        Evalsha(),
    ]
    return [c for c in every if not c.package or importlib.util.find_spec(c.package)]


def missing() -> list[str]:
    """The peers' packages that are not installed."""
    packages = ("limits", "pyrate_limiter", "throttled")
    return [p for p in packages if importlib.util.find_spec(p) is None]


def by_name(name: str) -> Contender:
    for contender in all_contenders():
        if contender.name == name:
            return contender
    raise KeyError(name)
