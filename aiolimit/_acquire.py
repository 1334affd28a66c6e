"""The engine: every way of taking permits comes through here, once.

>>> acquired = await take(Request((everyone, per_user), (1, 1), deadline_in(max_wait)))
>>> if not acquired:
...     raise TooBusy(retry_after=acquired.retry_after)

One value in (:class:`~aiolimit._request.Request`: the limiters, their permits, a deadline on
the loop's clock, the concurrency slots), one result out (:class:`Acquired`, or an
:class:`InFlight` that holds the slots), built here once. One attempt per limiter, all sent
together (one round trip on Redis: the backend's coalescer batches them), all or nothing:
when one refuses, the others' grants go back, each by its member. When every limiter grants,
reservations are slept out on the event loop's timer; a limiter that was blocked meanwhile
(``block()`` from any process) moves the whole request behind its block. Each limiter is
reported to the observer. After the store failed, calls fail at once for a short, growing
back-off (:class:`~aiolimit.Breaker`) while one call probes.

A leaf: it knows a limiter only as :class:`Limited` (a name, a backend, a breaker, the rate
its code gives: written at first use, and again when the store lost it), and one with a
``serve(request)`` of its own as serving the request itself (a ``ShardedRateLimiter``: from
one of its shards); it imports nothing of the limiters and surfaces above it, whose arguments
are checked there (``_checks``). It asks the store through ``_attempts``, takes slots through
``_inflight``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import cast

from . import _observe
from ._acquired import Acquired, Outcome
from ._attempts import ask, attempt_all, attempt_one, grants_of, release_grants
from ._inflight import InFlight, in_flight
from ._observe import Observer
from ._pacing import Foresight, turns_of
from ._request import Request, deadline_in, left_of, micros, now_us, seconds
from ._settling import Limited
from ._wakeup import note_read, sleep_out
from .backends.base import Attempt, Grant, Refusal
from .errors import LimiterError, NotConfiguredError

__all__ = [
    "Acquired",
    "InFlight",
    "Limited",
    "Outcome",
    "Rates",
    "begin_margins",
    "give_back",
    "outcome_of",
    "paced",
    "take",
    "try_one",
]

Rates = Callable[[Request], Awaitable[Outcome]]
"""How a request's rate permits are taken: :func:`outcome_of`, a metered call's pacing."""


async def take(request: Request, rates: Rates | None = None) -> Acquired:
    """The path every acquisition takes (its arguments checked already): the rate in code
    of each limiter written first where this process has not yet, ``request``'s slots taken
    (an :class:`InFlight`), then its rate permits by ``rates`` (by default: each limiter's
    store is asked, or a limiter with a ``serve`` of its own serves it), reported to the
    observer."""
    limiters = request.limiters
    for limiter in limiters:
        if not limiter.rate_in_code.stored:  # a rate given at construction, not stored yet
            await asyncio.gather(*(each.rate_in_code.store() for each in limiters))
            break
    if request.deadline is None or request.deadline > now_us():  # its callers may wait
        await begin_margins(limiters)
    if rates is None:
        rates = paced if request.paced else _rates_of(limiters)
    observer = _observe.current
    if request.slots:
        return await in_flight(request, lambda: _reported(request, rates, observer))
    outcome = await _reported(request, rates, observer)
    owners = request.owners or limiters
    waited = seconds(outcome.waited)
    return Acquired(outcome.limiters, request.permits, outcome.attempts, waited, owners)


async def try_one(limiter: Limited, permits: int, max_wait: int | None) -> bool:
    """Whether one limiter grants ``permits`` within ``max_wait`` µs (None: any wait): the
    path of ``RateLimiter.try_acquire``, and the fast one. Without an observer, a grant at
    once or a refusal is decided here, with no request made; a reservation is slept out as
    :func:`take` does."""
    if _observe.current is not None:
        return (await take(Request((limiter,), (permits,), deadline_in(max_wait)))).granted
    try:  # (attempt_one's call, without its frame: this is the hot path)
        attempt = await limiter.breaker.guard(
            limiter.backend.try_acquire(limiter.name, permits, max_wait)
        )
    except NotConfiguredError as lost:
        attempts = await ask([limiter], [permits], max_wait, lost)
        request = Request((limiter,), (permits,), deadline_in(max_wait))
        return (await _slept_out(request, attempts)).granted
    if not isinstance(attempt, Grant):
        return False
    if attempt.starts_in <= 0:
        return True
    request = Request((limiter,), (permits,), deadline_in(max_wait))
    return (await _slept_out(request, [attempt])).granted


# Its coroutine is what RateLimiter.try_acquire returns: a caller that forgets to await it
# is warned of the method it called (set once here, not on each call: the hot path).
try_one.__qualname__ = "RateLimiter.try_acquire"


async def outcome_of(request: Request) -> Outcome:
    """What the limiters of ``request`` answer, all or nothing, its reservations slept out
    (and asked again behind a block that came meanwhile), within what is left of its
    deadline; not reported. The rate step of every acquisition but a metered call's."""
    limiters = request.limiters
    permits = request.permits
    max_wait = left_of(request.deadline)
    try:
        if len(limiters) == 1:
            attempt = await attempt_one(limiters[0], permits[0], max_wait)
            if attempt.__class__ is Grant and attempt.starts_in <= 0:  # the common case
                return Outcome(limiters, (attempt,), 0)
            attempts: list[Attempt] = [attempt]
        else:
            attempts = await attempt_all(limiters, permits, max_wait)
    except NotConfiguredError as lost:
        attempts = await ask(limiters, permits, max_wait, lost)
    return await _slept_out(request, attempts)


async def paced(request: Request) -> Outcome:
    """What the limiters of ``request`` answer, asked in this process's turn (``_pacing``)
    and no further ahead than ``HORIZON`` (``DUE_HORIZON`` when it asks at the time the store
    said it could grant), again after each pause until granted or past its
    deadline; the turn passes on once the store granted, before the reservation is slept
    out. A refusal by a limiter whose grant is not to be settled (a request limiter beside
    the tokens', a pause) is slept out: a refund would not end it. ``waited``: from the
    call to the grant's start (0: granted at once, on the first ask)."""
    began = now_us()
    turns = turns_of(request.paced)
    if not await turns.wait(request.deadline, _foreseeable(request)):
        return await outcome_of(request.until(deadline_in(0)))  # (its deadline came: asked)
    foreseen = turns.foreseen()
    holding, asked, turned = True, 0, now_us()
    try:
        while True:
            left = left_of(request.deadline)
            horizon = micros(turns.horizon)  # (further when asked at the store's time)
            ahead = horizon if left is None else min(horizon, left)
            told = None if foreseen is None else _told(request, foreseen, ahead)
            if told is not None:  # refused, the store foresaw: no need to ask
                (answered, attempts), after = told, None
            else:
                answered, attempts, after = await _paced_answers(request, ahead, turns.behind())
            foreseen = None
            asked += 1
            outcome = Outcome(answered.limiters, attempts, 0)
            if outcome.granted:  # (all of the request answered)
                holding = False
                turns.next(after)
                outcome = await _slept_out(request, attempts)
                if outcome.granted and not outcome.waited:  # (read at once: how late)
                    note_read(grants_of(outcome.limiters, outcome.attempts))
                if not outcome.granted or (asked == 1 and turned == began):
                    return outcome  # (refused behind a block; or its own wait only)
                return Outcome(outcome.limiters, outcome.attempts, now_us() - began)
            await release_grants(grants_of(answered.limiters, attempts))  # (all or nothing)
            if left is not None and outcome.retry_in > left:
                return _refused(request, answered, attempts)
            held = [
                answer.retry_in
                for limiter, answer in zip(answered.limiters, attempts, strict=True)
                if isinstance(answer, Refusal) and limiter not in request.paced
            ]
            if held:  # a refund would not help
                await turns.hold(seconds(max(held)))
            else:  # until a refund of this process, a while, or when the store can grant
                # What it lacks: its permits less what is left, counted as none when less
                # than none. A store counts grants booked just ahead of now (another
                # process's, told the same time) before they start, and places each where
                # the window makes room for it: once they have started, within
                # DUE_HORIZON, none of that deficit is left, and a refund of what it asks
                # must wake it then, not its next poll. (Behind a plain waiter's
                # reservation booked far ahead, it so asks once per refund of its ask.)
                lacking = [
                    (limiter, permits - max(answer.left, 0))
                    for limiter, permits, answer in zip(
                        answered.limiters, answered.permits, attempts, strict=True
                    )
                    if isinstance(answer, Refusal)
                ]
                await turns.pause(seconds(outcome.retry_in), lacking)
    finally:
        if holding:
            turns.next()


async def _paced_answers(
    request: Request, max_wait: int, behind: int | None
) -> tuple[Request, list[Attempt], Foresight | None]:
    """The answers to ``request`` within ``max_wait`` µs, the request they answer, and what
    the store foresaw for the caller next in line, who asks ``behind`` permits of the one
    paced limiter (None: no foresight). With limiters beside the paced ones (a request
    limiter beside the tokens'), the paced ones are asked alone first, the others once
    those grant: a refusal of the paced ones, the common one while the limit binds, then
    costs one call and leaves no grant to hand back."""
    paced = request.paced
    if len(paced) == len(request.limiters):
        answers, after = await _answers(request, max_wait, behind)
        return request, answers, after
    first = _part(request, True)
    answers, after = await _answers(first, max_wait, behind)
    if not all(isinstance(answer, Grant) for answer in answers):
        return first, answers, None
    rest = _part(request, False)
    others = iter((await _answers(rest, max_wait, None))[0])
    mine = iter(answers)
    merged = [next(mine if limiter in paced else others) for limiter in request.limiters]
    return request, merged, after


def _foreseeable(request: Request) -> int | None:
    """The permits a foresight for this paced caller asks: of its one paced limiter (None:
    it has several)."""
    if len(request.paced) != 1:
        return None
    return request.permits[request.limiters.index(request.paced[0])]


def _told(
    request: Request, foreseen: Foresight, ahead: int
) -> tuple[Request, list[Attempt]] | None:
    """The refusal an ask of ``request``'s paced limiter within ``ahead`` µs would get now,
    from what the store foresaw for it (the part of the request it answers); None when it
    may be granted: it asks."""
    refusal, heard = foreseen
    retry_in = refusal.retry_in - (now_us() - heard)
    if retry_in <= ahead:
        return None
    answered = request if len(request.paced) == len(request.limiters) else _part(request, True)
    return answered, [refusal._replace(retry_in=retry_in)]


def _part(request: Request, paced: bool) -> Request:
    """``request`` with only its paced limiters (``paced``), or only the others."""
    kept = [
        (limiter, permits)
        for limiter, permits in zip(request.limiters, request.permits, strict=True)
        if (limiter in request.paced) is paced
    ]
    limiters = tuple(limiter for limiter, _ in kept)
    return replace(request, limiters=limiters, permits=tuple(n for _, n in kept), owners=())


def _refused(request: Request, answered: Request, attempts: list[Attempt]) -> Outcome:
    """A refusal of ``answered`` (a part of ``request``) as the whole request's: a limiter
    not asked is answered as refusing with no wait of its own."""
    by_limiter = dict(zip(answered.limiters, attempts, strict=True))
    whole = [
        by_limiter.get(limiter) or Refusal(0, 0, permits)
        for limiter, permits in zip(request.limiters, request.permits, strict=True)
    ]
    return Outcome(request.limiters, whole, 0)


async def _answers(
    request: Request, max_wait: int, behind: int | None
) -> tuple[list[Attempt], Foresight | None]:
    """The limiters' answers to ``request`` within ``max_wait`` µs, not slept out, and for
    one limiter that grants, a foresight of ``behind`` more permits (None: none asked)."""
    limiters, permits = request.limiters, request.permits
    try:
        if len(limiters) == 1:
            if behind is not None and not limiters[0].breaker.is_open:
                return await _with_foresight(limiters[0], permits[0], max_wait, behind)
            return [await attempt_one(limiters[0], permits[0], max_wait)], None
        return await attempt_all(limiters, permits, max_wait), None
    except NotConfiguredError as lost:
        return await ask(limiters, permits, max_wait, lost), None


async def _with_foresight(
    limiter: Limited, permits: int, max_wait: int, behind: int
) -> tuple[list[Attempt], Foresight | None]:
    """``limiter``'s answer to ``permits`` within ``max_wait`` µs, through its breaker, and
    when it grants, what the store foresees for ``behind`` more (``Backend.start_foresee``:
    in the same call on Redis; None: the store foresees nothing, or the foresight failed)."""
    backend, name = limiter.backend, limiter.name
    asking = backend.start_acquire(name, permits, max_wait)
    seeing = backend.start_foresee(name, behind)
    try:
        attempt = await limiter.breaker.guard(asking)
    except BaseException:
        asking.cancel()  # (cancelled meanwhile: a grant made goes back)
        if seeing is not None:
            seeing.cancel()
        raise
    if seeing is None or not isinstance(attempt, Grant):
        if seeing is not None:
            seeing.cancel()
        return [attempt], None
    try:
        seen = await seeing
    except Exception:  # (a foresight lost: the caller behind asks)
        return [attempt], None
    except BaseException:  # (cancelled meanwhile: its grant goes back)
        backend.hand_back(name, attempt.member)
        raise
    return [attempt], (seen, now_us()) if isinstance(seen, Refusal) else None


async def begin_margins(limiters: Sequence[Limited]) -> None:
    """Before this process's first call that may wait for a slot on a limiter whose code
    gives no fixed margin: the fleet's measured margin begun where none is
    (``backends/_margin.py``), so that the first calls already go at it."""
    for limiter in limiters:
        margins = limiter.backend.context.margins
        if limiter.name in margins.begun:
            continue
        config = limiter.rate_in_code.config
        fixed = config is not None and config.margin is not None
        if fixed or getattr(limiter, "serve", None) is not None:
            margins.begun.add(limiter.name)  # (a fixed margin, or shards: nothing to begin)
        else:
            await margins.begin(limiter.name, limiter.backend.margin)


async def give_back(limiter: Limited, permits: int) -> int:
    """Hands back ``permits`` of ``limiter``'s most recent grants, through its breaker;
    returns how many were."""
    return await limiter.breaker.guard(limiter.backend.release(limiter.name, permits))


def _rates_of(limiters: Sequence[Limited]) -> Rates:
    """How a request on ``limiters`` is asked: a limiter that serves requests itself (a
    sharded limiter's ``serve``) serves it, else the stores answer."""
    if len(limiters) == 1:
        serve = getattr(limiters[0], "serve", None)
        if serve is not None:
            return cast("Rates", serve)
    return outcome_of


def _reported(request: Request, rates: Rates, observer: Observer | None) -> Awaitable[Outcome]:
    """``rates(request)``, reported to ``observer`` under the names of the request's
    owners: granted (with the seconds waited), refused, or failed (the error)."""
    if observer is None:
        return rates(request)
    return _observed(rates(request), request.names(), request.permits, observer)


async def _observed(
    asking: Awaitable[Outcome],
    names: Sequence[str],
    permits: Sequence[int],
    observer: Observer,
) -> Outcome:
    try:
        outcome = await asking
    except LimiterError as exc:
        for name, count in zip(names, permits, strict=True):
            observer.failed(name, count, exc)
        raise
    for name, count in zip(names, permits, strict=True):
        if outcome.granted:
            observer.granted(name, count, seconds(outcome.waited))
        else:
            observer.refused(name, count)
    return outcome


async def _slept_out(request: Request, attempts: list[Attempt]) -> Outcome:
    """After the limiters' first answers: a refusal hands the others' grants back; grants
    that are reservations are slept out, and asked again behind a block that came
    meanwhile, with what is left of the deadline."""
    limiters = request.limiters
    began = now_us()
    waited = 0  # (granted at once: 0, not the round trip)
    while True:
        grants = grants_of(limiters, attempts)
        if len(grants) < len(attempts):  # one refused: nothing is taken
            await release_grants(grants)
            return Outcome(limiters, attempts, 0)
        starts_in = 0
        for _, grant in grants:  # (the latest start: a loop, no generator to make)
            if grant.starts_in > starts_in:
                starts_in = grant.starts_in
        if starts_in <= 0:
            return Outcome(limiters, attempts, waited)
        observer = _observe.current
        names = request.names() if observer is not None else ()
        again = await sleep_out(grants, starts_in, observer, names)
        waited = now_us() - began
        if not again:
            return Outcome(limiters, attempts, waited)
        await release_grants(grants)  # behind a block, or woken too late: ask again
        attempts = await ask(limiters, request.permits, left_of(request.deadline))
