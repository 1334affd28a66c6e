"""The token bucket (token_bucket.lua, step for step): per rate the time at which its bucket
is full again (GCRA's theoretical arrival time), exactly: ``a`` us and ``b``/permits of one."""

from __future__ import annotations

import math
from dataclasses import replace

from ..._types import Rate, RateLimiterConfig
from .._protocol import MAX_EXACT
from ._counters import Counters
from ._state import Config, Limiter


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


class TokenBucket(Counters):
    __slots__ = ()

    def __init__(
        self, limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool
    ) -> None:
        super().__init__(limiter, config, key, write)
        stored = limiter.config
        assert stored is not None
        if not self.fresh and not self.state_in_config(config) and self.state.epoch < stored.epoch:
            adopted(self, stored, self.state.epoch)  # a client's state of earlier rates

    def rates_changed(self, limiter: Limiter, old: Config, now: int) -> bool:
        stored = limiter.config
        assert stored is not None
        if not self.state_in_config(self.config):
            next_epoch(stored, old, now)  # each client's bucket is converted at its next call
            # A slower refill: what a client owes takes longer to pay than its TTL says.
            return slower(old.config.rates, self.config.rates)
        if not self.fresh:
            convert_buckets(self, old.config.rates, now)
        return False

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

    def rate_span(self, rate: Rate) -> int:
        return rate.interval_us  # (a grant starts no earlier than one interval before a)

    def rate_queued(self, rate: Rate, a: int, b: int) -> int | None:
        return a - rate.interval_us + (1 if b > 0 else 0)  # (first_start)

    def rate_ahead(self, rate: Rate, a: int, b: int, now: int) -> tuple[int, int]:
        latest = a - rate.interval_us + (1 if b > 0 else 0)
        if latest <= now:
            return 0, latest
        # (a token per interval/rate from now on: the grants that start after now hold them)
        return math.ceil(float(latest - now) * rate.permits / rate.interval_us), latest

    def rate_until(self, rate: Rate, a: int, b: int, now: int) -> int:
        return a + (1 if b > 0 else 0)

    def rate_release(
        self, rate: Rate, a: int, b: int, wanted: int, start: int | None, now: int, held: int
    ) -> tuple[int, int, int]:
        # Tokens go back, never above a full bucket.
        if not (a > now or (a == now and b > 0)):
            return 0, a, b
        whole, rest = cost(rate, wanted)
        if start is not None and now > start:
            # Only the refill still due on the grant's tokens goes back (token_bucket.lua).
            due, due_rest = cost(rate, held)
            due -= now - start
            if due < 0 or (due == 0 and due_rest == 0):
                return 0, a, b
            if (due, due_rest) < (whole, rest):
                whole, rest = due, due_rest
        interval = rate.interval_us
        back = math.ceil((float(whole) * rate.permits + rest) / interval)
        owed = float(a - now) * rate.permits + b
        count = min(wanted, back, math.ceil(owed / interval))
        tat, frac = a - whole, b - rest
        if frac < 0:
            tat, frac = tat - 1, frac + rate.permits
        if tat < now:
            tat, frac = now, 0
        return count, tat, frac

    def rate_charge(self, rate: Rate, a: int, b: int, extra: int, now: int) -> tuple[int, int]:
        return refilled(rate, a, b, now, extra)  # past one interval on: a debt

    def rate_sync(
        self, rate: Rate, a: int, b: int, remaining: int, reset_us: int, now: int
    ) -> tuple[int, int]:
        # Full no earlier than `remaining` tokens' refill before one interval after the reset.
        if reset_us <= 0:
            return a, b
        full = now + reset_us + rate.interval_us - cost(rate, remaining)[0]
        return (full, 0) if a < full else (a, b)


EPOCHS_KEPT = 4
"""Earlier rates a PER_CLIENT token bucket's config keeps (token_bucket.lua)."""


def converted(was: Rate, rate: Rate, tat: int, frac: int, at: int) -> tuple[int, int]:
    """set_rate with keep_state (token_bucket.lua's ``converted``): the tokens missing at the
    change ``at``, written under ``was``, refilled at ``rate`` from then on (rounded up to a
    whole microsecond, in doubles as Lua computes it)."""
    due = tat - at + (1 if frac > 0 else 0)
    if due > 0 and (was.permits, was.interval_us) != (rate.permits, rate.interval_us):
        ratio = float(due) * was.permits * rate.interval_us
        return at + math.ceil(ratio / (float(was.interval_us) * rate.permits)), 0
    return tat, frac


def slower(old: tuple[Rate, ...], rates: tuple[Rate, ...]) -> bool:
    """Whether any rate refills more slowly than the one it replaces (token_bucket.lua's
    ``slower``, in doubles as Lua computes it): a bucket converted to it is full later than
    its old TTL."""
    return any(
        float(was.permits) * rate.interval_us > float(was.interval_us) * rate.permits
        for was, rate in zip(old, rates, strict=False)
    )


def convert_buckets(bucket: TokenBucket, old: tuple[Rate, ...], now: int) -> None:
    """set_rate with keep_state, an OVERALL bucket (token_bucket.lua's ``convert_buckets``)."""
    n = list(bucket.state.n)
    for i, rate in enumerate(bucket.config.rates[: len(old)]):
        n[2 * i], n[2 * i + 1] = converted(old[i], rate, n[2 * i], n[2 * i + 1], now)
    bucket.state = replace(bucket.state, n=n)


def next_epoch(stored: Config, old: Config, now: int) -> None:
    """set_rate with keep_state, a PER_CLIENT bucket (token_bucket.lua's ``next_epoch``): when
    the rates change, the next rates epoch, the old rates kept with the change's time."""
    stored.epoch, stored.epochs = old.epoch, old.epochs

    def pairs(rates: tuple[Rate, ...]) -> list[tuple[int, int]]:
        return [(rate.permits, rate.interval_us) for rate in rates]

    if pairs(old.config.rates) != pairs(stored.config.rates):
        stored.epoch = old.epoch + 1
        stored.epochs = [(old.epoch, now, old.config.rates), *old.epochs][:EPOCHS_KEPT]


def adopted(bucket: TokenBucket, stored: Config, epoch: int) -> None:
    """A client's state of an earlier rates epoch (token_bucket.lua's ``adopt``): each rate's
    numbers converted through every change since, each at its time; an epoch older than
    those kept converts nothing."""
    epochs = {e: (at, rates) for e, at, rates in stored.epochs}
    n = list(bucket.state.n)
    for i in range(len(bucket.config.rates)):
        for e in range(epoch, stored.epoch):
            if e not in epochs:
                break
            at, rates = epochs[e]
            after = epochs[e + 1][1] if e + 1 in epochs else bucket.config.rates
            if i >= len(rates) or i >= len(after):
                n[2 * i], n[2 * i + 1] = 0, 0
                break
            n[2 * i], n[2 * i + 1] = converted(rates[i], after[i], n[2 * i], n[2 * i + 1], at)
    bucket.state = replace(bucket.state, n=n)
