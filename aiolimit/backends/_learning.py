"""What both stores do when a limiter learns its rate from a partner's answers: the law, in
Python (the memory twin runs it; ``lua/learn.lua`` is the same, step for step), the values a
learn call passes (:class:`Law`) and what it answers (:class:`Learned`).

The limiter's config (the code's rate) is the *ceiling*: the most the learned rate may be.
The rate in force is the config's rates, each the ceiling's scaled by ``permits / C`` (``C``
the ceiling's first rate; ``permits`` the learned permits of that rate), rewritten with
``keep_state`` semantics whenever it changes: grants made stay counted, nothing over-admits.
The learned state (``LearnState``) is kept beside the config (Redis: ``<tag>:learn``), so
every process of a fleet shares one decision:

- **refused** (a ``429``/``503``): one decision per episode for the whole fleet. A refusal
  of a call decided before the last cut belongs to that cut's episode and changes nothing
  (one reported without its call: within a quarter interval of the cut). A refused *probe*
  (a level above the last one that held) goes back to that level (*good*), and the level
  that failed (*bad*) waits before it is tried again: ``max_hold``; below a *peak*, twice as
  long each time, at most ``RECOVER_HOLDS`` intervals: one ``429`` per probe, rarer above
  every level that held. A refused level in force that had held goes one ``step`` down (a
  call that arrived late: a caller stalled past the margin); one that had not held is cut to
  ``decrease`` of itself. Where it fell from is remembered (*peak*, with the level that
  failed above it and that level's wait). An episode whose refusals pass a quarter of the
  level that held (besides a probe's own overshoot) is a fall, whatever its first refusal
  said: the limit fell under a window of calls, and the rate is cut to ``decrease`` of that
  level at once (never below the floor).
- **succeeded**: a level is proven once a call granted at least one interval of the
  ceiling's first rate after it was raised succeeds (a probe's extra call is refused only
  when the partner's window holds the new level in full, an interval on), and while the
  rate is used (an OVERALL budget with at most a quarter of it left when the success is
  told). Then the next level is probed, once per interval: below a *bad* level, one
  ``step`` at a time, the bad level itself only after its wait; below a *peak*, a
  ``step`` that doubles while it holds (a fall's first probe is small, a mistaken cut is
  climbed back in a few intervals); a bad level that holds means the limit rose: straight
  back to the peak, where the level above it waits as it did before the fall; past all
  that, ``step`` more, doubling while probes hold, up to an eighth of the rate (a probe too
  high costs as many refusals per window as it overshoots).
- **stated**: a partner that states its limit (``q`` per ``w``) is taken at its word,
  scaled to the ceiling's first interval, capped by the ceiling and the floor; growth stops
  there from then on.

A store that lost the learned state (or whose config another writer replaced) starts again
at ``start`` of the ceiling, or the config's rate where that is lower: never at zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from .._types import Rate
from .._values import US

__all__ = [
    "EVENTS",
    "FOREVER_HOLD",
    "LEARN_TTL",
    "MILLION",
    "RECOVER_HOLDS",
    "Event",
    "Law",
    "LearnState",
    "Learned",
    "decide",
    "fresh",
    "rates_of",
]

MILLION = 1_000_000
LEARN_TTL = 86_400_000_000
"""How long a learned state outlives its last learn call (µs): a day; then learning starts
again (at ``start`` of the ceiling, or the config's rate where lower)."""
RECOVER_HOLDS = 4
"""The longest wait (in intervals of the ceiling's first rate) before a level below where
the limit fell from is probed again: a rise back is found within about this long."""
FOREVER_HOLD = 3600 * US
"""The longest ``max_hold`` (µs)."""

Event = Literal["read", "refused", "succeeded", "stated"]
EVENTS: tuple[Event, ...] = ("read", "refused", "succeeded", "stated")


class Law(NamedTuple):
    """The knobs a learn call carries (shares in millionths, times in µs)."""

    floor: int
    """The fewest permits, as a share of the ceiling (at least 1 permit)."""
    start: int
    """Where learning starts (and starts again), as a share of the ceiling."""
    decrease: int
    """The share of a level kept when a level that held is refused."""
    step: int
    """The first increase, as a share of the ceiling (at least 1 permit)."""
    max_hold: int
    """The longest wait before a level that failed is probed again (µs)."""


class Learned(NamedTuple):
    """The learned rate, as a learn call leaves it."""

    permits: int
    """The rate in force: permits of the ceiling's first rate, per ``interval_us``."""
    ceiling: int
    """The ceiling's first rate's permits."""
    interval_us: int
    """The interval of both."""
    changed: bool
    """Whether this call changed the rate in force."""
    cut_at: int
    """When the fleet last cut the rate (limiter's clock, µs; 0: never)."""
    good: int
    """The highest level known to hold (0: none since the last cut)."""
    bad: int
    """The lowest level known to fail (0: none)."""
    hold_us: int
    """How long the bad level waits before it is probed again."""
    stated: int
    """The limit the partner last stated, scaled to the first rate (0: none)."""
    grown_at: int
    """When the rate in force last changed (limiter's clock, µs): a success proves it for a
    call granted an interval later or more."""


@dataclass
class LearnState:
    """The ``<tag>:learn`` hash: the ceiling's rates and the law's state."""

    ceiling: tuple[Rate, ...]
    permits: int
    good: int = 0
    bad: int = 0
    peak: int = 0
    peak_bad: int = 0
    peak_hold: int = 0
    step: int = 1
    hold: int = 0
    cut_at: int = 0
    grown_at: int = 0
    stated: int = 0
    refusals: int = 0
    level: int = 0
    expires_at: int = 0


def rates_of(ceiling: tuple[Rate, ...], permits: int) -> tuple[Rate, ...]:
    """The rates in force when the first rate has ``permits``: each of the ceiling's scaled
    alike (at least 1 permit each)."""
    first = ceiling[0].permits
    return tuple(Rate(max(1, rate.permits * permits // first), rate.interval) for rate in ceiling)


def _share(ceiling: int, share: int) -> int:
    return max(1, ceiling * share // MILLION)


def fresh(ceiling: tuple[Rate, ...], config_permits: int, law: Law, now: int) -> LearnState:
    """A state where none is (or where the config was replaced): at ``start`` of the ceiling,
    or the config's rate where lower, never below the floor."""
    top = ceiling[0].permits
    floor = _share(top, law.floor)
    permits = max(floor, min(config_permits, _share(top, law.start), top))
    hold = ceiling[0].interval_us
    return LearnState(ceiling, permits, step=_share(top, law.step), hold=hold, grown_at=now)


def decide(
    state: LearnState,
    event: Event,
    value: int | None,
    per: int | None,
    law: Law,
    now: int,
    left: int | None = None,
) -> bool:
    """Applies ``event`` to ``state`` at ``now``; whether the rate in force changed.
    ``value``: refused, succeeded: when the call's grant was decided (None: unknown); stated:
    the stated quota, per ``per`` µs. ``left``: succeeded: the permits the (OVERALL) budget
    has left now; a rate a quarter unused is not proven by the calls that succeed under it
    (None: not known, as for PER_CLIENT)."""
    before = state.permits
    if event == "refused":
        _refused(state, value, law, now)
    elif event == "succeeded" and (left is None or 4 * left <= state.permits):
        _succeeded(state, law, now, now if value is None else min(value, now))
    elif event == "stated" and value is not None and per:
        _stated(state, value, per, law, now)
    return state.permits != before


def _refused(state: LearnState, decided: int | None, law: Law, now: int) -> None:
    interval = state.ceiling[0].interval_us
    # (no grant to tell by: the refusals within a quarter interval of a cut are its)
    quarter = now < state.cut_at + interval // 4
    episode = decided <= state.cut_at if decided is not None else quarter
    top = state.ceiling[0].permits
    floor = _share(top, law.floor)
    first = not (state.cut_at and episode)
    if not first:  # the cut made answers it, unless the episode is a fall
        state.refusals += 1
    elif 0 < state.good < state.permits:  # a probe failed: back to what held, wait longer
        state.bad, state.permits, state.level = state.permits, state.good, state.good
        state.hold = _next_hold(state, law, interval)
        state.refusals = 1 - (state.bad - state.good)  # (its overshoot's refusals are its own)
    else:  # a level in force refused: a late arrival, a step down; a fall, halved
        level, held = state.permits, state.good > 0
        step = _share(top, law.step) if held else level - level * law.decrease // MILLION
        _fell(state, level, max(floor, level - step), interval, held)
        state.refusals, state.level = 1, level
    deep = max(floor, state.level * law.decrease // MILLION)
    fall = state.refusals > state.level // 4 and state.permits > deep  # a window refused
    if fall:
        _fell(state, state.level, deep, interval, True)
    if fall or first:
        state.step = _share(top, law.step)
        state.cut_at = state.grown_at = now


def _next_hold(state: LearnState, law: Law, interval: int) -> int:
    """How long the level that just failed waits before it is tried again. Below where the
    limit fell from (the peak), the limit may come back at any time: the wait doubles up to
    ``RECOVER_HOLDS`` intervals, so a rise back is found within about that long. Above every
    level that held, a rise is a new limit, and every probe there costs a ``429``: a level
    that failed waits ``max_hold`` (a caller's late arrival that failed it costs at most one
    ``step`` of the rate meanwhile; a second try soon would cost a ``429`` every time the
    limit is found)."""
    if state.peak > state.bad:
        return min(2 * state.hold, max(min(law.max_hold, RECOVER_HOLDS * interval), interval))
    return max(law.max_hold, interval)


def _fell(state: LearnState, level: int, permits: int, interval: int, held: bool) -> None:
    """The limit fell below ``level``: the rate is cut to ``permits``; where it fell from is
    kept (unless a higher level it fell from is, or this episode kept it already), with
    what failed above it and its wait."""
    if state.peak != level and (held or state.peak < level):
        above = state.bad > level
        state.peak = level
        state.peak_bad = state.bad if above else 0
        state.peak_hold = state.hold if above else interval
    state.permits = permits
    state.good = state.bad = 0
    state.hold = interval


def _succeeded(state: LearnState, law: Law, now: int, decided: int) -> None:
    interval = state.ceiling[0].interval_us
    if decided - state.grown_at < interval:
        return  # (a probe's extra call fails an interval after the raise: not proven before)
    state.good = state.permits  # it held an interval
    if state.bad and state.permits >= state.bad:  # the bad level held: the limit rose
        state.bad, state.hold = 0, interval
        if state.peak > state.permits:  # back to where it fell from, at once
            state.step = max(state.step, state.peak - state.permits)
    top = state.ceiling[0].permits
    cap = min(top, state.stated) if state.stated else top
    if state.peak <= state.permits:
        state.peak = 0
    target = state.permits + state.step
    if state.bad:  # a level known to fail: crept up to, itself tried after the hold
        target = min(target, state.bad)
    elif state.peak:  # below where the limit fell from: never past it
        target = min(target, state.peak)
    target = min(target, cap)
    if target <= state.permits:
        return
    wait = state.hold if state.bad and target >= state.bad else interval
    if now - state.grown_at < wait:
        return
    if state.peak and target >= state.peak:  # back: what failed above it fails as before
        state.bad, state.hold, state.peak = state.peak_bad, state.peak_hold, 0
        state.step = _share(top, law.step)
    elif state.peak:  # (a fall's first step is small, then doubling: a rise found fast)
        state.step *= 2
    elif not state.bad:  # (a step overshoots by as much: an eighth at most)
        state.step = max(_share(top, law.step), min(2 * state.step, target // 8))
    state.permits, state.grown_at = target, now


def _stated(state: LearnState, quota: int, per: int, law: Law, now: int) -> None:
    first = state.ceiling[0]
    stated = quota * first.interval_us // per
    if stated < 1:
        return  # a limit that allows nothing is no limit we believe
    top = first.permits
    stated = max(_share(top, law.floor), min(stated, top))
    state.stated = stated
    if stated < state.permits:
        state.cut_at = now
    if stated != state.permits:
        state.permits, state.good, state.bad, state.grown_at = stated, 0, 0, now
