"""A token bucket's settle for fewer, or a hand-back, of a grant: the starts of every grant
callers are given, each counted as what it was settled for, never put more than the bucket
(its rate) plus its refill over any span into that span. On every backend, on a clock the
test moves: random reserve, acquire, settle, release and reset sequences; the one a refund
behind reservations would break; and refunds of a grant that started long enough ago that
the bucket, full meanwhile, lost some of the refill its tokens would have had."""

from __future__ import annotations

import random
from typing import Any

import pytest
from conformance import advance, flush
from settling import BUCKET, NAME, limiter, take

from aiolimit import RateLimiterConfig, RateType
from aiolimit.backends import Backend, Grant
from aiolimit.backends._protocol import parse_grant

RATE, INTERVAL_US = 10, 60_000_000  # settling.limiter's "10/minute"
SEEDS, STEPS = 12, 40


def over_the_bucket(
    starts: list[tuple[int, int]], rate: int = RATE, interval_us: int = INTERVAL_US
) -> list[tuple[int, int, int]]:
    """The spans [first, last] of grant starts holding more permits than ``rate`` plus the
    refill over the span, with the permits in them (none: the schedule keeps the bucket)."""
    starts = sorted(starts)
    over = []
    for i, (first, _) in enumerate(starts):
        held = 0
        for last, permits in starts[i:]:
            held += permits
            if held * interval_us > rate * interval_us + rate * (last - first):
                over.append((first, last, held))
    return over


class Schedule:
    """The grants callers were given, per life of the limiter (each reset starts another):
    member -> [start, permits it counts]."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lives: list[dict[str, list[int]]] = [{}]
        self.done: set[str] = set()  # settled or released

    @property
    def grants(self) -> dict[str, list[int]]:
        return self.lives[-1]

    def add(self, grant: Grant) -> None:
        self.grants[grant.member] = [grant.starts_at, parse_grant(grant.member)[0]]

    def members(self) -> list[tuple[str, int]]:
        """Every grant not yet settled or released, with its start, of every life."""
        return [
            (member, start)
            for life in self.lives
            for member, (start, _) in life.items()
            if member not in self.done
        ]

    async def settle(self, member: str, permits: int) -> None:
        settled = await self.backend.settle(NAME, member, permits)
        assert settled.charged == 0
        self.done.add(member)
        if member in self.grants:
            self.grants[member][1] = permits
        else:  # a grant of a life since reset: it settles nothing
            assert settled.handed_back == 0, f"{member} of an earlier life: {settled}"

    async def release(self, member: str) -> None:
        released = await self.backend.release(NAME, parse_grant(member)[0], member)
        self.done.add(member)
        if member in self.grants:
            self.grants[member][1] = 0
        else:
            assert released == 0, f"{member} of an earlier life: {released} released"

    async def reset(self, store: Any, how: str) -> None:
        config = RateLimiterConfig.build(RateType.OVERALL, "10/minute", algorithm=BUCKET)
        if how == "delete":
            await self.backend.delete(NAME)
        elif how == "flush":
            await flush(store)
        assert await self.backend.set_rate(NAME, config, "set", False)
        self.lives.append({})


STEPS_DRAWN = ["acquire", "greedy", "greedy", "reserve", "settle", "settle", "release", "advance"]


async def random_schedule(store: Any, seed: int) -> Schedule:
    rng = random.Random(seed)
    clock, backend = await limiter(store, BUCKET)
    schedule = Schedule(backend)
    for _ in range(STEPS):
        now = round(clock() * 1e6)
        step = rng.choice([*STEPS_DRAWN, "advance", "reset"] if rng.random() < 0.5 else STEPS_DRAWN)
        if step in ("acquire", "reserve", "greedy"):
            wait = None if step == "reserve" else 0
            permits = rng.randint(1, RATE)
            if step == "greedy":  # every permit free now, if any
                permits = max(1, await backend.available_permits(NAME))
            grant = await backend.try_acquire(NAME, permits, wait)
            if isinstance(grant, Grant):
                schedule.add(grant)
        elif step == "settle":  # a grant that has started, settled for fewer
            started = [member for member, start in schedule.members() if start <= now]
            if started:
                member = rng.choice(started)
                await schedule.settle(member, rng.randint(0, parse_grant(member)[0]))
        elif step == "release":  # any grant, a reservation too, handed back
            members = schedule.members()
            if members:
                await schedule.release(rng.choice(members)[0])
        elif step == "reset":
            await schedule.reset(store, rng.choice(["delete", "set_rate", "flush"]))
        else:
            await advance(store, clock, rng.choice([0.1, 1, 3, 5.9, 6, 20, 45]))
    return schedule


async def test_settles_and_hand_backs_keep_every_span_within_the_bucket(store: Any) -> None:
    for seed in range(SEEDS):
        schedule = await random_schedule(store, seed)
        for life in schedule.lives:
            starts = [(start, permits) for start, permits in life.values()]
            assert over_the_bucket(starts) == [], f"seed {seed}: {starts}"
        await store.backend("client-a").delete(NAME)


async def test_a_refund_behind_a_reservation_would_give_its_slot_twice(store: Any) -> None:
    # A grant of the whole bucket, a reservation of the whole bucket behind it (one interval
    # on), then the first settled to 0 at once. Were its tokens given back, the bucket would
    # be full again one interval on, at the reservation's start, for a newcomer too: twice
    # the bucket in one microsecond. So nothing goes back while the reservation waits.
    _, backend = await limiter(store, BUCKET)
    first = await take(backend, RATE)
    reserved = await take(backend, RATE, wait=True)
    assert reserved.starts_at == first.starts_at + INTERVAL_US
    assert (await backend.settle(NAME, first.member, 0)).handed_back == 0
    newcomer = await take(backend, RATE, wait=True)
    schedule = [(first.starts_at, 0), (reserved.starts_at, RATE), (newcomer.starts_at, RATE)]
    assert over_the_bucket(schedule) == []
    assert newcomer.starts_at == reserved.starts_at + INTERVAL_US


# -- a refund of a grant the bucket's refill has partly paid back already ----------------------


async def greedy(backend: Backend) -> list[tuple[int, int]]:
    """Takes every permit free now, one grant; its (start, permits), if any."""
    left = await backend.available_permits(NAME)
    if left == 0:
        return []
    grant = await take(backend, left)
    return [(grant.starts_at, left)]


@pytest.mark.parametrize("kept", [0, 1, None], ids=["settled_to_0", "settled_to_1", "released"])
async def test_a_refund_gives_back_none_of_the_refill_a_full_bucket_lost(
    store: Any, kept: int | None
) -> None:
    # 4 per 40 s (a token per 10 s). A takes 2 at 0 s; B 2 at 19.9 s. Had A never taken them,
    # the bucket would have been full from 10 s on (A's refill beyond that lost to the cap),
    # and B would have left it 2 tokens, then a token per 10 s: A's refund is worth 0.1 s of
    # refill, not the 10 s of its second token. Then everything free is taken at 19.9 s and
    # at 20.0 s: no more than 4 + 4 * 0.1 / 40 permits in those 0.1 s.
    clock, backend = await limiter(store, BUCKET, rates="4/40 seconds")
    first = await take(backend, 2)
    await advance(store, clock, 19.9)
    second = await take(backend, 2)
    if kept is None:
        assert await backend.release(NAME, 2, first.member) == 1
    else:
        assert (await backend.settle(NAME, first.member, kept)).handed_back == 1
    starts = [(first.starts_at, kept or 0), (second.starts_at, 2), *await greedy(backend)]
    await advance(store, clock, 0.1)
    starts += await greedy(backend)
    assert over_the_bucket(starts, 4, 40_000_000) == [], starts
    assert sum(permits for _, permits in starts[1:]) == 4  # (and no fewer than that)
