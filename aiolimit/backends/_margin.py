"""The fleet's measured margin: what both stores do with the lateness a limiter's callers
report (the memory twin runs :func:`next_margin`; ``lua/margin.lua`` is the same, step for
step), and what a process keeps of it (:class:`Margins`).

A partner that counts requests as they *arrive* sees each grant's start plus what the caller
adds before its request lands (waking up, the event loop, the send). Callers late by
different amounts put one request more into some partner window; intervals longer by that
spread (the *margin*) keep the partner at its quota. The store keeps one margin per limiter,
beside its config (Redis: the config hash's fields ``margin`` and ``margin_at``), and every
script widens each of the config's intervals by it when it reads the config: every process
of the fleet goes at the one margin.

- **begin** (a process's first call that may wait): where no margin is, :data:`START_US`
  (what connection set-up and first calls add before anything is measured).
- **a report** of the lateness a process saw (the most, since its last report): above the
  margin, the margin becomes it at once; below, the margin shrinks towards it by the share
  of :data:`SHRINK_INTERVALS` intervals (the first rate's) that passed since it last
  changed, so a quiet spell does not undo what a busy one needed; a change smaller than
  :data:`QUANTUM_US` waits (its time keeps counting).
- never more than :data:`CAP_SHARE` of the shortest interval (a lateness of hours does not
  stop the limiter), nor less than :data:`FLOOR_SHARE` of it or :data:`FLOOR_US`, whichever
  is less (what a caller adds after its last measured moment, its own send, is not seen: a
  quiet spell does not shrink the margin below it); ``PER_CLIENT`` limiters and fixed
  windows (whose windows would move with each change) keep none.

A change is a change of the config's rates, made as ``set_rate(..., keep_state=True)``
makes one: grants made stay counted. ``set_rate`` starts a config without a margin.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import NamedTuple, Protocol

from .._rates import Rate
from .._values import micros_up
from ._learning import MILLION

__all__ = [
    "CAP_SHARE",
    "FLOOR_SHARE",
    "FLOOR_US",
    "LAW",
    "QUANTUM_US",
    "REPORT_EVERY",
    "SHRINK_INTERVALS",
    "STALE_SLACK_US",
    "START_US",
    "MarginLaw",
    "Margins",
    "cap_of",
    "floor_of",
    "next_margin",
    "note_late",
    "widened_rates",
]

log = logging.getLogger("aiolimit")

START_US = 100_000
"""The margin a limiter starts with, before its callers' lateness is measured (µs)."""
CAP_SHARE = 100_000
"""The most a margin may be: this many millionths (``MILLION``, a learned share's scale) of
the shortest interval: a tenth."""
FLOOR_SHARE = 10_000
"""The least a margin may be: this many millionths of the shortest interval, a hundredth
(10 ms of a second: what a caller's send adds after its wake, which no one measures, on a
machine kept busy; it costs a hundredth of the quota), and no more than :data:`FLOOR_US`."""
FLOOR_US = 10_000
"""The most the floor may be (µs): what a caller's send adds after its last measured moment
takes as long whatever the interval, so a minute's floor is no longer than a second's."""
SHRINK_INTERVALS = 5
"""Over how many intervals of the first rate a margin shrinks to a lower lateness."""
QUANTUM_US = 500
"""The least change a shrink writes (µs)."""
STALE_SLACK_US = 1_000
"""How much later than the margin a caller may wake and still use its grant (µs): later,
it hands the grant back and asks again (``aiolimit._wakeup``)."""
REMEMBERED = 4096
"""Limiters a process keeps the margins of (as many as clock maps: ``_clock.REMEMBERED``)."""
REPORT_EVERY = 2.0
"""Seconds between a process's reports of a lateness no higher than the margin."""


class MarginLaw(NamedTuple):
    """What a margin call carries (µs; the cap and the floor in millionths of the shortest
    interval; the floor's most in µs)."""

    start: int
    cap: int
    shrink: int
    quantum: int
    floor: int
    floor_most: int


LAW = MarginLaw(START_US, CAP_SHARE, SHRINK_INTERVALS, QUANTUM_US, FLOOR_SHARE, FLOOR_US)


def cap_of(rates: tuple[Rate, ...], law: MarginLaw = LAW) -> int:
    """The most a margin may be for ``rates`` (µs)."""
    return min(r.interval_us for r in rates) * law.cap // MILLION


def floor_of(rates: tuple[Rate, ...], law: MarginLaw = LAW) -> int:
    """The least a margin may be for ``rates`` (µs; never above the cap)."""
    share = min(r.interval_us for r in rates) * law.floor // MILLION
    return min(share, law.floor_most, cap_of(rates, law))


def next_margin(
    margin: int | None,
    at: int,
    late: int | None,
    now: int,
    rates: tuple[Rate, ...],
    law: MarginLaw = LAW,
) -> tuple[int, int]:
    """The margin and when it last changed, after a begin (``late`` None) or a report of
    ``late`` µs at ``now``, from ``margin`` (None: none yet) changed at ``at``, for the
    exact ``rates``."""
    cap, least = cap_of(rates, law), floor_of(rates, law)
    if margin is None:
        margin, at = law.start, now
    margin = min(max(margin, least), cap)
    if late is None:
        return margin, at
    late = min(max(late, least), cap)
    if late > margin:
        return late, now
    shrink_time = max(law.shrink * rates[0].interval_us, 1)
    elapsed = min(max(now - at, 0), shrink_time)
    target = margin - (margin - late) * elapsed // shrink_time
    if margin - target < law.quantum:
        return margin, at
    return target, now


def widened_rates(rates: tuple[Rate, ...], margin: int) -> tuple[Rate, ...]:
    """``rates`` with every interval longer by ``margin`` µs (the rates scripts act on)."""
    if margin <= 0:
        return rates
    return tuple(Rate(r.permits, r.interval + timedelta(microseconds=margin)) for r in rates)


Report = Callable[[str, "int | None"], Awaitable[int]]
"""A store's margin operation, for one limiter: (name, lateness µs or None to begin) ->
the margin in force (µs)."""


class Margins:
    """What this process keeps of its limiters' margins (one per store, in its context):
    which have begun, the margin each last had, and the most lateness seen since the last
    report. A report goes in the background (``spawn``), at once when the lateness is above
    the margin last heard, else at most every :data:`REPORT_EVERY` seconds."""

    __slots__ = ("_beginning", "_heard", "_next", "_sending", "_worst", "begun")

    def __init__(self) -> None:
        self.begun: set[str] = set()  # (read on a waiting caller's path: a set, no call)
        self._beginning: dict[str, asyncio.Future[None]] = {}
        self._heard: dict[str, int] = {}  # the margin last heard, µs
        self._worst: dict[str, int] = {}  # the most lateness since the last report, µs
        self._next: dict[str, float] = {}  # loop time of the next report of less
        self._sending: set[str] = set()

    def margin(self, name: str) -> int | None:
        """The margin last heard for ``name`` (µs; None: none heard, or none kept)."""
        return self._heard.get(name)

    async def begin(self, name: str, report: Report) -> None:
        """``name``'s margin begun where none is: once per process, its callers meanwhile
        waiting for that one call (a failure is logged; the next call tries again)."""
        beginning = self._beginning.get(name)
        if beginning is None or beginning.get_loop() is not asyncio.get_running_loop():
            beginning = asyncio.ensure_future(self._begin(name, report))
            self._beginning[name] = beginning
        await asyncio.shield(beginning)

    def _heard_of(self, name: str, margin: int) -> None:
        if len(self._heard) >= REMEMBERED and name not in self._heard:
            for forgotten in list(self._heard)[: REMEMBERED // 2]:  # the oldest half
                del self._heard[forgotten]
                self._worst.pop(forgotten, None)
                self._next.pop(forgotten, None)
        if margin > 0:
            self._heard[name] = margin
        else:  # (a store that keeps none for this limiter: nothing to report, nothing late)
            self._heard.pop(name, None)

    async def _begin(self, name: str, report: Report) -> None:
        try:
            self._heard_of(name, await report(name, None))
            if len(self.begun) >= REMEMBERED:  # (bounded: the others begin again, once each)
                self.begun.clear()
            self.begun.add(name)
        except Exception as exc:  # (the call itself says what is wrong, if anything is)
            log.debug("limiter %r: no margin begun: %s", name, exc)
        finally:
            self._beginning.pop(name, None)

    def late(
        self,
        name: str,
        after: float,
        report: Report,
        spawn: Callable[[Awaitable[None]], object],
    ) -> None:
        """A caller of ``name`` was ``after`` seconds late after its grant's start (reported
        only for a limiter whose margin this process began: one measured)."""
        if name not in self._heard or not (after >= 0) or math.isinf(after):
            return
        late = micros_up(after)
        worst = self._worst.get(name, -1)
        if late > worst:
            self._worst[name] = worst = late
        if name in self._sending:
            return
        now = asyncio.get_running_loop().time()
        heard = self._heard.get(name, 0)
        if worst <= heard and now < self._next.get(name, 0.0):
            return
        self._sending.add(name)
        self._next[name] = now + REPORT_EVERY
        del self._worst[name]
        spawn(self._report(name, worst, report))

    async def _report(self, name: str, late: int, report: Report) -> None:
        try:
            self._heard_of(name, await report(name, late))
        except Exception as exc:  # (a lost report: the next one tells the store)
            log.debug("limiter %r: lateness not reported: %s", name, exc)
        finally:
            self._sending.discard(name)


class _Reporting(Protocol):
    """A store as a lateness report needs it (a ``Backend``)."""

    @property
    def context(self) -> _HasMargins: ...

    async def margin(self, name: str, late_us: int | None) -> int: ...


class _HasMargins(Protocol):
    @property
    def margins(self) -> Margins: ...

    @property
    def tasks(self) -> _Spawns: ...


class _Spawns(Protocol):
    def spawn(self, work: Awaitable[None], what: str) -> object: ...


def note_late(backend: _Reporting, name: str, seconds: float) -> None:
    """A caller of limiter ``name`` on ``backend`` was ``seconds`` late after its grant's
    start: kept for the fleet's margin, reported in the store's background."""
    context = backend.context
    context.margins.late(
        name, seconds, backend.margin, lambda work: context.tasks.spawn(work, "a lateness report")
    )
