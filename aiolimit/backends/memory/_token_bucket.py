"""The token bucket (token_bucket.lua, step for step): per rate the time at which its bucket
is full again (GCRA's theoretical arrival time), exactly: ``a`` us and ``b``/permits of one."""

from __future__ import annotations

import math
from dataclasses import replace

from ..._types import Rate
from .._protocol import MAX_EXACT
from ._counters import Counters


def cost(rate: Rate, permits: int) -> tuple[int, int]:
    """The refill ``permits`` tokens cost, in whole microseconds and the rest in 1/permits of
    one (computed in doubles, as Lua does)."""
    interval, count = rate.interval_us, rate.permits
    q = math.floor(interval / count)
    rest = float(permits) * float(interval - q * count)
    if rest >= MAX_EXACT:
        return permits * q + math.ceil(rest / count), 0
    whole = math.floor(rest / count)
    return permits * q + whole, int(rest - whole * count)


def refilled(rate: Rate, us: int, frac: int, start: int, permits: int) -> tuple[int, int]:
    """A bucket's full time moved on by ``permits`` tokens, from no earlier than ``start``."""
    if us < start or (us == start and frac == 0):
        us, frac = start, 0
    whole, rest = cost(rate, permits)
    frac += rest
    if frac >= rate.permits:
        us, frac = us + 1, frac - rate.permits
    return us + whole, frac


def refilled_since(rate: Rate, permits: int, start: int, now: int) -> int:
    """How many of the ``permits`` tokens of a grant that started at ``start`` have come back
    by ``now``, at least: the bucket refills oldest first, a token per interval/permits, and
    the grant's first token comes back no earlier than one such step after its start."""
    if now - start >= rate.interval_us:
        return permits
    back = math.floor(float(now - start) * rate.permits / rate.interval_us)
    if back < permits and cost(rate, back + 1)[0] <= now - start:
        back += 1  # (the product in doubles may round down)
    return min(back, permits)


class TokenBucket(Counters):
    __slots__ = ()

    def loaded(self, rate: Rate, a: int, b: int) -> tuple[int, int] | None:
        if b >= rate.permits:  # a remainder of another rate: a whole us, rounded up
            return a + 1, 0
        return None

    def rate_left(self, rate: Rate, a: int, b: int, now: int) -> int:
        if a < now or (a == now and b == 0):
            return rate.permits
        interval = rate.interval_us
        return math.floor((float(interval - (a - now)) * rate.permits - b) / interval)

    def rate_start(self, rate: Rate, a: int, b: int, permits: int, now: int) -> int:
        tat, frac = refilled(rate, a, b, now, permits)
        return tat - rate.interval_us + (1 if frac > 0 else 0)

    def rate_take(self, rate: Rate, a: int, b: int, permits: int, start: int) -> tuple[int, int]:
        return refilled(rate, a, b, start, permits)

    def rate_tag(self, rate: Rate, a: int, b: int, permits: int, start: int) -> int:
        return a - start  # the bucket's full time after it, from its start

    def rate_until(self, rate: Rate, a: int, b: int) -> int:
        return a + (1 if b > 0 else 0)

    def rate_release(
        self, rate: Rate, a: int, b: int, wanted: int, start: int | None, now: int
    ) -> tuple[int, int, int]:
        # Tokens go back, never above a full bucket.
        if not (a > now or (a == now and b > 0)):
            return 0, a, b
        if start is not None and now > start:
            wanted -= refilled_since(rate, wanted, start, now)
            if wanted <= 0:
                return 0, a, b
        owed = float(a - now) * rate.permits + b
        count = min(wanted, math.ceil(owed / rate.interval_us))
        whole, rest = cost(rate, wanted)
        tat, frac = a - whole, b - rest
        if frac < 0:
            tat, frac = tat - 1, frac + rate.permits
        if tat < now:
            tat, frac = now, 0
        return count, tat, frac


def convert_buckets(bucket: TokenBucket, old: tuple[Rate, ...], now: int) -> None:
    """set_rate with keep_state, an OVERALL bucket (set_rate.lua's ``convert_buckets``):
    each rate keeps the tokens missing from its bucket, refilled at the new rate from
    ``now`` (rounded up to a whole microsecond, in doubles as Lua computes it)."""
    n = list(bucket.state.n)
    for i, rate in enumerate(bucket.config.rates):
        if i >= len(old):
            break
        was = old[i]
        if (was.permits, was.interval_us) == (rate.permits, rate.interval_us):
            continue
        due = n[2 * i] - now + (1 if n[2 * i + 1] > 0 else 0)
        if due > 0:
            ratio = float(due) * was.permits * rate.interval_us
            n[2 * i] = now + math.ceil(ratio / (float(was.interval_us) * rate.permits))
            n[2 * i + 1] = 0
    bucket.state = replace(bucket.state, n=n)
