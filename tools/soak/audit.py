"""The soak's audit: what the grants the workers recorded say about each bound.

**The audit trusts nothing the limiter stores.** Every worker records each grant it was given
(see :mod:`tools.soak.worker`): its own wall clock just before and just after the script
call that granted, and the limiter's grant time (``Attempt.time``: Redis ``TIME`` by default).
The parent then checks, per budget (the whole limiter for ``overall``, each process for
``per-client``):

* *limiter-time windows*: for every grant g, the permits granted in ``(t_g - interval, t_g]``,
  where t is the limiter's grant time (exactly the window the Lua script enforces). Any sum
  above the rate is over-admission. With ``--clock client`` t is the worker's clock, corrected
  for the skew the tool injected.
* *wall-clock windows* (independent of any clock the limiter read): a grant's true time lies
  between its ``sent`` and ``received`` stamps; grants whose stamps all fit in less than one
  interval certainly shared a window. The largest such sum above the rate is over-admission
  even if the limiter's clock were lying.

Both are :func:`tools.audit.busiest_window`, over times and over spans.

With ``--rates`` (several rates, all of which must allow a grant), ``--algorithm`` and
``--min-spacing``, each rate is checked against its own bound, per budget:

* ``sliding_window``: the two checks above, with that rate's permits and interval.
* ``fixed_window``: at most ``permits`` in each window aligned to a multiple of the interval
  since the Unix epoch, on the limiter's clock (the grant times the workers recorded are on
  it), :func:`~tools.audit.busiest_fixed_window`. The wall clock cannot see that
  alignment; its check is the boundary burst: at most ``2 * permits`` in any one interval.
* ``token_bucket``: for every pair of grants i <= j (limiter time), the permits granted in
  ``[t_i, t_j]`` are at most ``permits + permits * (t_j - t_i) / interval``
  (:func:`~tools.audit.fullest_bucket`, exact, O(n log n)); the figure shown is the
  largest ``permits in the span - refill in the span``, at most ``permits``. The wall-clock
  check: at most ``2 * permits - 1`` in any one interval.
* ``--min-spacing``: the starts of consecutive grants (limiter time) are at least the spacing
  apart (:func:`~tools.audit.closest_grants`); on the wall clock, no two grants
  whose stamps all fit in less than the spacing.

The new checks allow ``TOLERANCE_US`` (1 µs) of rounding: grant times and the config are whole
microseconds and the limiter rounds a refill up, so an honest limiter never needs it.

Other figures:

* utilisation = permits granted during the run (limiter time, mapped from the run's wall
  clock start and end) / what the rate allows in a run of D seconds, ``rate * ceil(D /
  interval)`` per budget (a saturated limiter grants ``rate`` at once, then ``rate`` more
  each interval). With several rates or another algorithm: against the tightest rate, the
  one allowing the fewest permits in the run (sliding window as above; fixed window:
  ``permits`` per aligned window the run touches; token bucket: ``permits + permits * D /
  interval``).
* per-process share, and Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` over the
  permits x of each process (1.0 = equal shares, 1/n = one process got everything).
* waiter lateness: for a grant g of p permits at limiter time t_g, ``free(g)`` is the earliest
  time from which, counting only the grants the audit saw before g, the window ending at t_g
  had room for p more permits: walk back from g summing the permits of earlier grants; at
  the first grant k that makes the sum exceed ``rate - p``, ``free(g) = t_k + interval`` (the
  moment k left the window; from then on the grants after k, all of them still before g,
  leave room for p). The request's time is mapped to
  limiter time with the process's clock offset (median of ``t - (sent + replied) / 2`` over
  grants decided while their script call was in flight: their caller returned at once
  rather than sleeping until a reserved slot).
  A grant *waited* if ``free(g)`` is later than its request; its lateness is
  ``t_g - free(g)``: how long enough permits sat free before this waiter took them. p50/p99
  are over waiters only. With several rates ``free(g)`` is the latest of each rate's; a token
  bucket's is when the bucket, replayed over the earlier grants, held p tokens; a fixed
  window's is the start of the run of windows up to g's that had room for p; the spacing's
  is the previous grant's time plus the spacing.
* Redis commands per granted permit, from ``INFO commandstats`` deltas (summed across
  restarts), leaving out the commands the tool itself sends (``info``, ``script|flush``,
  ``client|list``, ``client|kill``).
* errors surfaced to callers, by exception type. A refused ``try_acquire`` is not an error.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiolimit import Rate

from ..audit import Window, busiest_window, closest_grants
from .algorithms import BOUNDS, TOLERANCE_US
from .limits import Limits, rate_label
from .worker import Grant

__all__ = ["audit_grants", "clock_offsets", "jain", "lateness", "percentile"]


def clock_offsets(grants: Sequence[Grant]) -> dict[int, float]:
    """Per process: microseconds to add to its wall clock to get the limiter's clock.

    The median of ``t - (sent + replied) / 2`` over the grants decided while their script
    call was in flight: those whose caller returned at once (within ``_IN_FLIGHT`` s of the
    reply), not a reserved future slot it then slept until. A process with none of those
    gets the least ``t - sent``: every grant starts no earlier than its call reached the
    limiter, so that is the offset plus at most one call's latency."""
    in_flight: dict[int, list[float]] = defaultdict(list)
    earliest: dict[int, float] = {}
    for g in grants:
        if g.received - g.replied <= _IN_FLIGHT:
            in_flight[g.process].append(g.limiter_time - (g.sent + g.replied) / 2 * 1e6)
        ahead = g.limiter_time - g.sent * 1e6
        earliest[g.process] = min(earliest.get(g.process, ahead), ahead)
    return {
        process: statistics.median(in_flight[process]) if in_flight[process] else ahead
        for process, ahead in earliest.items()
    }


_IN_FLIGHT = 0.002
"""Seconds between a grant's reply and its caller's return within which it was not a wait."""


def lateness(grants: Sequence[Grant], limits: Limits) -> list[float]:
    """Seconds each waiter's permits sat free before it got them (see the module docstring)."""
    offsets = clock_offsets(grants)
    ordered = sorted(grants, key=lambda g: g.limiter_time)
    requested = [g.requested * 1e6 + offsets[g.process] for g in ordered]
    free = [-math.inf] * len(ordered)
    for rate in limits.rates:
        found = BOUNDS[limits.algorithm].free(ordered, rate, requested)
        free = [max(a, b) for a, b in zip(free, found, strict=True)]
    spacing_us = round(limits.min_spacing * 1e6)
    if spacing_us:
        for index in range(1, len(ordered)):
            free[index] = max(free[index], ordered[index - 1].limiter_time + spacing_us)
    return [
        max(0.0, grant.limiter_time - at) / 1e6
        for grant, at, asked in zip(ordered, free, requested, strict=True)
        if at > asked
    ]


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def audit_grants(
    grants: Sequence[Grant],
    limits: Limits,
    per_client: bool,
    run: tuple[float, float],
) -> dict[str, Any]:
    """Each rate's bound, the spacing, utilisation and lateness per budget, from the grant
    records alone."""
    budgets: dict[int, list[Grant]] = defaultdict(list)
    for grant in grants:
        budgets[grant.process if per_client else 0].append(grant)
    checks = [_RateCheck(rate) for rate in limits.rates]
    spacing = _SpacingCheck(limits.min_spacing)
    begin, end = run
    allowed = in_run = 0
    late: list[float] = []
    for budget in budgets.values():
        offset = statistics.median(clock_offsets(budget).values())
        first, last = begin * 1e6 + offset, end * 1e6 + offset
        for check in checks:
            check.add(budget, limits)
        spacing.add(budget)
        in_run += sum(g.permits for g in budget if first <= g.limiter_time < last)
        allowed += min(BOUNDS[limits.algorithm].allowed(rate, first, last) for rate in limits.rates)
        late += lateness(budget, limits)
    rates = [check.report(limits) for check in checks]
    tightest = min(
        limits.rates, key=lambda r: BOUNDS[limits.algorithm].allowed(r, begin * 1e6, end * 1e6)
    )
    return {
        "grants": len(grants),
        "permits": sum(g.permits for g in grants),
        # The first rate's busiest window of its interval, limiter time and wall clock; and
        # every bound exceeded, over all rates and the spacing.
        "most_in_window": rates[0]["most_in_interval"],
        "windows_over_rate": sum(r["over"] for r in rates) + spacing.too_close,
        "most_in_window_wall": rates[0]["most_wall"],
        "windows_over_rate_wall": sum(r["over_wall"] for r in rates) + spacing.too_close_wall,
        "per_rate": rates,
        "spacing": spacing.report(),
        "utilisation": in_run / allowed if allowed else 0.0,
        "utilisation_against": rate_label(tightest),
        "waiters": len(late),
        "lateness_p50_ms": _ms(percentile(late, 0.50)),
        "lateness_p99_ms": _ms(percentile(late, 0.99)),
    }


@dataclass
class _SpacingCheck:
    """The spacing between consecutive grants over every budget (limiter time), and on the
    wall clock: two grants whose [sent, received] stamps all fit within the spacing."""

    min_spacing: float
    closest: float | None = None
    too_close: int = 0
    too_close_wall: int = 0

    def add(self, budget: Sequence[Grant]) -> None:
        spacing_us = round(self.min_spacing * 1e6)
        if not spacing_us:
            return
        times = [(g.limiter_time, g.permits) for g in budget]
        spaced = closest_grants(times, spacing_us, slack=TOLERANCE_US)
        if spaced.closest is not None and (self.closest is None or spaced.closest < self.closest):
            self.closest = spaced.closest
        self.too_close += spaced.too_close
        spans = [(g.sent, g.received, 1) for g in budget]
        self.too_close_wall += busiest_window(spans, self.min_spacing, rate=1).over

    def report(self) -> dict[str, Any] | None:
        if not round(self.min_spacing * 1e6):
            return None
        return {
            "min_spacing_s": self.min_spacing,
            "closest_s": None if self.closest is None else round(self.closest / 1e6, 6),
            "too_close": self.too_close,
            "too_close_wall": self.too_close_wall,
        }


@dataclass
class _RateCheck:
    """One rate's bound over every budget: the algorithm's own check on limiter time, the
    busiest window of its interval (limiter time), and the wall-clock check."""

    rate: Rate
    worst: float = 0.0
    over: int = 0
    interval: Window = field(default_factory=lambda: Window(0))
    wall: Window = field(default_factory=lambda: Window(0))

    def add(self, budget: Sequence[Grant], limits: Limits) -> None:
        interval_us = self.rate.interval_us
        times = [(g.limiter_time, g.limiter_time, g.permits) for g in budget]
        bound = limits.interval_bound(self.rate)
        # Permits in (t - interval, t] for every limiter grant time t.
        busiest = busiest_window(times, interval_us, rate=bound)
        self.interval = _worst(self.interval, busiest)
        timed = [(g.limiter_time, g.permits) for g in budget]
        worst, over = BOUNDS[limits.algorithm].audit(timed, self.rate, busiest)
        self.worst = max(self.worst, worst)
        self.over += over
        # The most permits whose [sent, received] wall-clock stamps all fit within less than
        # one interval: independent of any clock the limiter read.
        spans = [(g.sent, g.received, g.permits) for g in budget]
        self.wall = _worst(self.wall, busiest_window(spans, interval_us / 1e6, rate=bound))

    def report(self, limits: Limits) -> dict[str, Any]:
        return {
            "rate": rate_label(self.rate),
            "permits": self.rate.permits,
            "interval_s": self.rate.interval_us / 1e6,
            "check": BOUNDS[limits.algorithm].check,
            "worst": round(self.worst, 3),
            "bound": self.rate.permits,
            "over": self.over,
            "most_in_interval": self.interval.most,
            "interval_bound": limits.interval_bound(self.rate),
            "most_wall": self.wall.most,
            "over_wall": self.wall.over,
        }


def _worst(total: Window, budget: Window) -> Window:
    """The windows of every budget so far: the busiest, and all those over the rate."""
    busiest = budget if budget.most > total.most else total
    return Window(busiest.most, total.over + budget.over, busiest.end)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
