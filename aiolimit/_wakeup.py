"""How a caller sleeps out its reservation: to the grant's start on the limiter's clock,
mapped to the loop's through its backend's map of that limiter's clock (``clock_map``,
``backends/_clock.py``: never early), rather than ``starts_in`` from the moment it read the
reply, which wakes it late by however long the reply took to reach it, and by a different
amount for each caller: a partner that counts arrivals in its own window then sees late
ones bunch with on-time ones. On the way it asks whether a ``block()`` came meanwhile, a
little before the start (``BLOCK_LEAD``), so that the read's round trip does not make it
late either.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ._observe import Observer
from ._request import seconds
from .backends._margin import STALE_SLACK_US, note_late

if TYPE_CHECKING:
    from .backends.base import Backend, Grant

__all__ = ["BLOCK_LEAD", "MAX_BLOCK_LEAD", "Sleeper", "note_read", "note_sent", "sleep_out"]


class Sleeper(Protocol):
    """A limiter as a sleeper sees it: its name on its backend."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend: ...


BLOCK_LEAD = 0.005
"""The least seconds before a reservation's start its sleeper asks whether a ``block()``
came meanwhile, so that the read's round trip does not make it late: twice the time such
reads took lately, up to ``MAX_BLOCK_LEAD`` (a block set in that last moment before the
start is obeyed from the next grant on)."""
MAX_BLOCK_LEAD = 0.05

_read_took = 0.0  # how long block reads took lately (a maximum that decays)


async def sleep_out(
    grants: Sequence[tuple[Sleeper, Grant]],
    starts_in: int,
    observer: Observer | None,
    names: Sequence[str],
) -> bool:
    """Sleeps until the last reserved grant starts, on the limiter's clock mapped to the
    loop's (``_wakeup``: never early, and no later than ``starts_in`` from now), asking on
    the way whether a block came meanwhile; returns whether the grants are to be asked
    again: a block came, or it woke later than a limiter's measured margin covers. A
    cancelled sleeper hands its grants back. The observer sees each limiter's caller
    waiting meanwhile, and how late it woke."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    wake = now + seconds(starts_in)
    mapped = -math.inf
    for limiter, grant in grants:
        if grant.starts_in > 0:
            clock_map = limiter.backend.clock_map(limiter.name)
            clock_map.observe(grant.starts_at - grant.starts_in, now)
            local = clock_map.local(grant.starts_at)
            mapped = max(mapped, wake if local is None else local)
    wake = min(wake, mapped)
    margins = _margins_of(grants)
    if observer is not None:
        for name in names:
            observer.queued(name, 1)
    try:
        try:
            lead = min(max(BLOCK_LEAD, 2 * _read_took), MAX_BLOCK_LEAD)
            await asyncio.sleep(max(wake - lead - now, 0.0))
        except asyncio.CancelledError:
            for limiter, grant in grants:
                limiter.backend.hand_back(limiter.name, grant.member)
            raise
        blocked = await _blocked_meanwhile(grants)  # (hands the grants back if it fails)
        wake += _grown_since(grants, margins)
        try:
            rest = wake - loop.time()
            if rest > 0:
                await asyncio.sleep(rest)
        except asyncio.CancelledError:
            for limiter, grant in grants:
                limiter.backend.hand_back(limiter.name, grant.member)
            raise
        late = loop.time() - wake
        stale = False
        for limiter, grant in grants:
            if grant.starts_in > 0:
                note_late(limiter.backend, limiter.name, late)  # (the fleet's margin)
                stale = stale or _past_margin(limiter, late)
        if observer is not None:
            for name in names:
                observer.late(name, late)
        return blocked or stale
    finally:
        if observer is not None:
            for name in names:
                observer.queued(name, -1)


def _margins_of(grants: Sequence[tuple[Sleeper, Grant]]) -> list[int | None]:
    """The fleet's measured margin of each grant's limiter, as this process last heard it."""
    return [limiter.backend.context.margins.margin(limiter.name) for limiter, _ in grants]


def _grown_since(grants: Sequence[tuple[Sleeper, Grant]], before: list[int | None]) -> float:
    """How much (seconds) a limiter's measured margin grew since ``before``: a reservation
    booked under the smaller one starts that much later, as one booked now would."""
    grown = 0
    for (limiter, _), was in zip(grants, before, strict=True):
        now = limiter.backend.context.margins.margin(limiter.name)
        if was is not None and now is not None and now > was:
            grown = max(grown, now - was)
    return seconds(grown)


def _past_margin(limiter: Sleeper, late: float, unmeasured: bool = False) -> bool:
    """Whether a caller that woke ``late`` seconds after its grant's start is later than
    the fleet's measured margin of ``limiter`` covers (a process the machine did not run):
    sent now, its request would land among the next slots' and be one too many for a
    partner that counts arrivals, so the grant goes back and the caller asks again. (A
    limiter without a measured margin: ``unmeasured``.)"""
    margin = limiter.backend.context.margins.margin(limiter.name)
    if margin is None:
        return unmeasured
    return late > seconds(margin + STALE_SLACK_US)


def note_read(grants: Sequence[tuple[Sleeper, Grant]]) -> None:
    """Grants that started at once are read now, by a caller that settles them (a paced
    acquisition, ``reserve()``): how late after each one's start (on its limiter's clock,
    mapped to the loop's) is kept for the fleet's margin, as a reservation's wake is
    (:func:`sleep_out`): the reply's way back and the event loop's other work, which a
    partner counting arrivals sees too. The engine's last sight of a caller that sends
    the request itself; the HTTP clients measure again as they send (:func:`note_sent`)."""
    now = asyncio.get_running_loop().time()
    for limiter, grant in grants:
        clock_map = limiter.backend.clock_map(limiter.name)
        clock_map.observe(grant.starts_at - grant.starts_in, now)  # (a bound: never early)
        local = clock_map.local(grant.starts_at)
        if local is not None:
            note_late(limiter.backend, limiter.name, now - local)


def note_sent(grants: Sequence[tuple[Sleeper, Grant]], unmeasured: bool = False) -> bool:
    """A call that holds ``grants`` is being sent now: how late after each grant's start
    (on its limiter's clock, mapped to the loop's) is kept for the fleet's margin
    (``backends/_margin.py``); returns whether one is later than that margin covers
    (``unmeasured``: where the limiter keeps no measured margin). A clock not mapped yet
    tells nothing."""
    now = asyncio.get_running_loop().time()
    stale = False
    for limiter, grant in grants:
        local = limiter.backend.clock_map(limiter.name).local(grant.starts_at)
        if local is not None:
            note_late(limiter.backend, limiter.name, now - local)
            stale = stale or _past_margin(limiter, now - local, unmeasured)
        else:
            stale = stale or unmeasured
    return stale


async def _blocked_meanwhile(grants: Sequence[tuple[Sleeper, Grant]]) -> bool:
    """After sleeping out reservations: whether a ``block()`` (from any process) came on a
    limiter whose grant was a reservation (a block ending after the grant's start); one read
    each, sent together."""
    global _read_took
    reserved = [(limiter, grant) for limiter, grant in grants if grant.starts_in > 0]
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        ends = await asyncio.gather(
            *(limiter.backend.blocked_until(limiter.name) for limiter, _ in reserved)
        )
    except BaseException:  # unknown: the grants go back rather than risk passing a block
        for limiter, grant in grants:
            limiter.backend.hand_back(limiter.name, grant.member)
        raise
    _read_took = max(loop.time() - began, _read_took * 0.9)
    return any(
        end is not None and end > grant.starts_at
        for end, (_, grant) in zip(ends, reserved, strict=True)
    )
