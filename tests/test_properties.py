"""Random operation sequences on the memory backend and on a real redis-server, driven by one
fake clock: every result must agree, and no grant may push a sliding window over the rate.

Both backends read the same controllable clock (``clock=`` a callable), so the Lua scripts
and their Python twin see identical times. Redis key TTLs still run on the server's real
clock, so intervals here are tens of (fake) seconds, every example uses a fresh limiter
name, and ``keep_alive``/``expire`` (pure TTL behaviour) are left to test_redis_backend.py.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from servers import Server

from aiolimit import (
    InvalidArgumentError,
    MemoryBackend,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.backends import Backend

CLIENTS = ("a", "b")
INTERVALS_US = (10_000_000, 25_000_000, 40_000_000)
START_US = 1_000_000_000
_names = itertools.count()

client = st.sampled_from(CLIENTS)
permits = st.integers(1, 5)
config = st.tuples(st.sampled_from(RateType), st.integers(1, 4), st.sampled_from(INTERVALS_US))
# Steps of the fake clock; the named ones sit on the window's edges.
edges = st.sampled_from(["zero", "1us", "interval", "interval-1us", "interval+1us", "half"])
advance = st.one_of(edges, edges, edges, st.floats(0, 2.5))  # named or a fraction of interval
acquire = st.tuples(st.just("acquire"), client, permits)
step = st.tuples(st.just("advance"), advance)
operation = st.one_of(
    acquire,
    acquire,
    st.tuples(st.just("wait_then_acquire"), client, permits),
    st.tuples(
        st.just("reserve"), client, permits, st.sampled_from(["forever", "half", "interval"])
    ),
    st.tuples(st.just("public_try_acquire"), client, permits),
    st.tuples(st.just("release"), client, permits),
    st.tuples(st.just("available"), client),
    step,
    step,
    step,
    st.tuples(
        st.just("configure"), st.sampled_from(["set", "update", "try"]), config, st.booleans()
    ),
    st.tuples(st.just("get_config")),
    st.tuples(st.just("delete")),
)


@dataclass
class Audit:
    """Grants as the test saw them, to check the sliding-window bound independently.

    A grant stops counting ("dead") once the clock has passed its time plus the interval in
    force, even if a later, longer interval would cover it again: the backends may already
    have dropped it from their logs, which only makes them stricter.
    """

    config: tuple[RateType, int, int] | None = None  # (type, rate, interval_us)
    budgets: dict[str | None, list[list[Any]]] = field(
        default_factory=dict
    )  # [time, permits, dead]

    def budget(self, client_id: str) -> list[list[Any]]:
        assert self.config is not None
        key = client_id if self.config[0] is RateType.PER_CLIENT else None
        return self.budgets.setdefault(key, [])

    def expire(self, now: int) -> None:
        if self.config is None:
            return
        for budget in self.budgets.values():
            for grant in budget:
                if now - grant[0] >= self.config[2]:
                    grant[2] = True

    def in_window(self, client_id: str, now: int) -> int:
        assert self.config is not None
        start = now - self.config[2]
        return sum(p for t, p, dead in self.budget(client_id) if not dead and start < t <= now)

    def grant(self, client_id: str, permits: int, start: int) -> None:
        """Notes a grant (a reservation starts in the future) and checks every window that
        holds it: (x - interval, x] for each grant time x in [start, start + interval)."""
        assert self.config is not None
        budget = self.budget(client_id)
        budget.append([start, permits, False])
        budget.sort(key=lambda grant: grant[0])
        for end in {t for t, _, _ in budget if start <= t < start + self.config[2]}:
            held = self.in_window(client_id, end)
            assert held <= self.config[1], f"{held} permits in the window ending {end}"

    def release(self, client_id: str, permits: int, now: int) -> None:
        """Takes from the newest grants that have started (reservations are not released)."""
        budget = self.budget(client_id)
        started = [grant for grant in budget if grant[0] <= now]
        while permits:
            newest = started.pop()
            take = min(newest[1], permits)
            newest[1] -= take
            permits -= take
            if not newest[1]:
                budget.remove(newest)

    def configure(self, new: tuple[RateType, int, int], keep_state: bool, now: int) -> None:
        if not keep_state or self.config is None or self.config[0] is not new[0]:
            self.budgets.clear()
        self.config = new
        self.expire(now)


async def run(backend: Backend, op: tuple[Any, ...], name: str, interval: int) -> Any:
    kind = op[0]
    try:
        if kind == "acquire":
            attempt = asdict(await backend.try_acquire(name, op[2]))
            del attempt["grant"]  # ids may differ; the time and permits they log may not
            return ("attempt", attempt["granted"], tuple(attempt.items()))
        if kind == "reserve":
            max_wait = {"forever": -1, "half": interval // 2, "interval": interval}[op[3]]
            attempt = asdict(await backend.try_acquire(name, op[2], max_wait))
            del attempt["grant"]
            return ("attempt", attempt["granted"], tuple(attempt.items()))
        if kind == "public_try_acquire":
            return ("granted", await RateLimiter(name, backend).try_acquire(op[2]))
        if kind == "release":
            return ("released", await backend.release(name, op[2]))
        if kind == "available":
            # Clamped here: the memory backend's negative count has a test of its own below.
            return ("available", max(await backend.available_permits(name), 0))
        if kind == "configure":
            rate_type, rate, interval_us = op[2]
            built = RateLimiterConfig.build(rate_type, rate, interval_us / 1e6)
            return ("written", await backend.set_rate(name, built, op[1], op[3]))
        if kind == "get_config":
            return ("config", await backend.get_config(name))
        if kind == "delete":
            return ("deleted", await backend.delete(name))
    except (InvalidArgumentError, NotConfiguredError) as exc:
        return ("error", type(exc).__name__)
    raise AssertionError(f"unknown operation {op!r}")


def advance_by(step: str | float, audit: Audit) -> int:
    interval = audit.config[2] if audit.config else INTERVALS_US[0]
    if isinstance(step, float):
        return round(step * interval)
    return {"zero": 0, "1us": 1, "interval": interval, "interval-1us": interval - 1,
            "interval+1us": interval + 1, "half": interval // 2}[step]  # fmt: skip


class Twins:
    """One memory and one Redis backend per client id, on one fake clock, plus the audit."""

    def __init__(self, redis: Redis) -> None:
        self.now = START_US
        self.name = f"property-{next(_names)}"
        memory = MemoryBackend(client_id="a", clock=self.clock)
        remote = RedisBackend(redis, client_id="a", clock=self.clock)
        self.backends = {
            "a": (memory, remote),
            "b": (memory.with_client("b"), remote.with_client("b")),
        }
        self.audit = Audit()

    def clock(self) -> float:
        return self.now / 1e6

    def advance(self, us: int) -> None:
        self.now += us
        self.audit.expire(self.now)

    async def step(self, op: tuple[Any, ...]) -> Any:
        """Runs one operation on both backends, checks they agree, and updates the audit."""
        if op[0] == "advance":
            self.advance(advance_by(op[1], self.audit))
            return None
        if op[0] == "wait_then_acquire":
            return await self.wait_then_acquire(op[1], op[2])
        who = op[1] if op[0] in ("acquire", "public_try_acquire", "release", "available") else "a"
        in_memory, in_redis = self.backends[who]
        interval = audit.config[2] if (audit := self.audit).config else INTERVALS_US[0]
        expected = await run(in_memory, op, self.name, interval)
        actual = await run(in_redis, op, self.name, interval)
        assert actual == expected, f"{op!r}: redis {actual!r}, memory {expected!r}"

        kind, result = expected[0], expected[1]
        if kind in ("attempt", "granted") and result:
            start = self.now
            if kind == "attempt":  # a reservation starts when its wait is over
                attempt = dict(expected[2])
                start += attempt["wait"]
                assert attempt["time"] == start
            audit.grant(who, op[2], start)
        elif kind == "released" and result:
            audit.release(who, result, self.now)
        elif kind == "written" and result:
            audit.configure(op[2], op[3], self.now)
        elif kind == "deleted":
            audit.config = None
            audit.budgets.clear()
        elif kind == "available":
            assert audit.config is not None
            assert result <= max(audit.config[1] - audit.in_window(who, self.now), 0)
        return expected

    async def wait_then_acquire(self, who: str, permits: int) -> None:
        """A refused attempt's wait is exact: refused 1 us before it, granted at it."""
        first = await self.step(("acquire", who, permits))
        if first[0] != "attempt" or first[1]:
            return
        wait = dict(first[2])["wait"]
        assert wait >= 1
        if wait > 1:
            self.advance(wait - 1)
            early = await self.step(("acquire", who, permits))
            assert not early[1], f"granted 1 us before the wait of {wait} us ended"
            self.advance(1)
        else:
            self.advance(wait)
        assert (await self.step(("acquire", who, permits)))[1], f"refused after waiting {wait} us"


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same examples on every run, in CI too
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@example(  # a grant one microsecond before the oldest grant leaves the window
    first=(RateType.OVERALL, 2, INTERVALS_US[0]),
    operations=[("acquire", "a", 2), ("advance", "interval-1us"), ("acquire", "b", 1)],
)
@example(  # PER_CLIENT: each client its own budget; a type change clears the state
    first=(RateType.PER_CLIENT, 2, INTERVALS_US[1]),
    operations=[
        ("acquire", "a", 2),
        ("wait_then_acquire", "a", 1),
        ("acquire", "b", 2),
        ("release", "b", 1),
        ("configure", "update", (RateType.OVERALL, 3, INTERVALS_US[0]), True),
        ("wait_then_acquire", "b", 3),
    ],
)
@given(first=config, operations=st.lists(operation, min_size=5, max_size=50))
async def test_memory_and_redis_agree_and_never_exceed_the_rate(
    redis_server: Server, first: tuple[RateType, int, int], operations: list[tuple[Any, ...]]
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        twins = Twins(redis)
        for op in [("configure", "set", first, False), *operations]:
            await twins.step(op)
    finally:
        await redis.aclose()


async def test_available_permits_is_never_negative_on_either_backend(
    redis_server: Server,
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        twins = Twins(redis)
        await twins.step(("configure", "set", (RateType.OVERALL, 2, INTERVALS_US[0]), False))
        await twins.step(("acquire", "a", 2))
        await twins.step(("reserve", "a", 1, "forever"))  # left is -1 until the reservation
        for memory_or_redis in twins.backends["a"]:
            assert await memory_or_redis.available_permits(twins.name) == 0
    finally:
        await redis.aclose()
