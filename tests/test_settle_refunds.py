"""A token bucket's settle for fewer, with reservations queued behind the grant: the starts
of every grant callers are given, each counted as what it was settled for, never put more
than the bucket (its rate) plus its refill over any span into that span. On every backend,
on a clock the test moves: random reserve, acquire and settle sequences, and the one a
refund behind reservations would break."""

from __future__ import annotations

import random
from typing import Any

from conformance import advance
from settling import BUCKET, NAME, limiter, take

from aiolimit.backends import Backend, Grant
from aiolimit.backends._protocol import parse_grant

RATE, INTERVAL_US = 10, 60_000_000  # settling.limiter's "10/minute"
SEEDS, STEPS = 12, 40


def over_the_bucket(starts: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The spans [first, last] of grant starts holding more permits than RATE plus the
    refill over the span, with the permits in them (none: the schedule keeps the bucket)."""
    starts = sorted(starts)
    over = []
    for i, (first, _) in enumerate(starts):
        held = 0
        for last, permits in starts[i:]:
            held += permits
            if held * INTERVAL_US > RATE * INTERVAL_US + RATE * (last - first):
                over.append((first, last, held))
    return over


class Schedule:
    """The grants callers were given: member -> [start, permits it counts]."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.grants: dict[str, list[int]] = {}
        self.settled: set[str] = set()

    def add(self, grant: Grant) -> None:
        self.grants[grant.member] = [grant.starts_at, parse_grant(grant.member)[0]]

    async def settle(self, member: str, permits: int) -> None:
        settled = await self.backend.settle(NAME, member, permits)
        self.grants[member][1] = permits
        self.settled.add(member)
        assert settled.charged == 0

    def starts(self) -> list[tuple[int, int]]:
        return [(start, permits) for start, permits in self.grants.values()]


async def random_schedule(store: Any, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    clock, backend = await limiter(store, BUCKET)
    schedule = Schedule(backend)
    for _ in range(STEPS):
        now = round(clock() * 1e6)
        step = rng.choice(["acquire", "reserve", "reserve", "settle", "settle", "advance"])
        if step in ("acquire", "reserve"):
            wait = None if step == "reserve" else 0
            grant = await backend.try_acquire(NAME, rng.randint(1, RATE), wait)
            if isinstance(grant, Grant):
                schedule.add(grant)
        elif step == "settle":  # a grant that has started, settled for fewer
            started = [
                member
                for member, (start, _) in schedule.grants.items()
                if start <= now and member not in schedule.settled
            ]
            if started:
                member = rng.choice(started)
                await schedule.settle(member, rng.randint(0, schedule.grants[member][1]))
        else:
            await advance(store, clock, rng.choice([1, 3, 6, 20, 45]))
    return schedule.starts()


async def test_settles_behind_reservations_keep_every_span_within_the_bucket(store: Any) -> None:
    for seed in range(SEEDS):
        starts = await random_schedule(store, seed)
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
