"""Asking the store, for the engine (``_acquire``): one attempt per limiter through its
breaker, a request's attempts sent together, and grants handed back by member.

>>> attempts = await ask([everyone, per_user], [1, 1], max_wait)   # [Grant, Refusal]
>>> await release_grants(grants_of([everyone, per_user], attempts))

A store found without a limiter's config (``NotConfiguredError``) gets the rate the limiter's
code gives written again, once for every caller that found it lost, and the limiters are
asked again (``_code_config``); for a limiter whose code gives none, the error is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, cast

from ._breaker import charge, enter_all
from ._code_config import asked_again
from ._settling import Limited
from .backends._protocol import parse_grant
from .backends.base import Attempt, Grant, Started, hand_backs_failed
from .errors import BackendError, NotConfiguredError

__all__ = ["ask", "attempt_all", "attempt_one", "grants_of", "release_grants"]


async def ask(
    limiters: Sequence[Limited],
    permits: Sequence[int],
    max_wait: int | None,
    lost: NotConfiguredError | None = None,
) -> list[Attempt]:
    """The limiters' answers, all asked at once; after ``lost`` (the store was found without
    a limiter's config), the rate its code gives is written first (one write for every caller
    that found it lost)."""
    if lost is not None:
        owners = [(limiter.name, limiter.rate_in_code) for limiter in limiters]
        return await asked_again(lost, owners, lambda: ask(limiters, permits, max_wait))
    if len(limiters) == 1:
        return [await attempt_one(limiters[0], permits[0], max_wait)]
    return await attempt_all(limiters, permits, max_wait)


def attempt_one(
    limiter: Limited, permits: int, max_wait: int | None
) -> Coroutine[Any, Any, Attempt]:
    """One limiter's attempt, through its breaker (:meth:`Breaker.guard`). (A coroutine
    function in all but name: one frame fewer per call.)"""
    return limiter.breaker.guard(limiter.backend.try_acquire(limiter.name, permits, max_wait))


async def attempt_all(
    limiters: Sequence[Limited], permits: Sequence[int], max_wait: int | None
) -> list[Attempt]:
    """One attempt per limiter (two or more), every request made before any answer is
    awaited (on Redis they go in one round trip), without a task each
    (``Backend.start_acquire``); if any fails, the others' grants go back and the first error
    is raised. Calls fail at once while a limiter's breaker is open; each breaker is charged
    with its own limiters' answers alone (:func:`charge`). If this task is cancelled
    meanwhile, the attempts not yet answered are cancelled (their grants go back), and so are
    grants made."""
    try:
        breakers = enter_all([limiter.breaker for limiter in limiters])
    except BackendError:
        await asyncio.sleep(0)  # failing fast still yields, as Breaker.guard does
        raise
    started: list[Started | Exception] = []
    outcomes: list[Attempt | Exception] = []
    try:
        for limiter, count in zip(limiters, permits, strict=True):
            try:
                started.append(limiter.backend.start_acquire(limiter.name, count, max_wait))
            except Exception as exc:
                started.append(exc)
        for attempt in started:
            try:
                outcomes.append(attempt if isinstance(attempt, Exception) else await attempt)
            except Exception as exc:
                outcomes.append(exc)
    except BaseException:  # this task cancelled meanwhile
        for attempt in started[len(outcomes) :]:
            if not isinstance(attempt, Exception):
                attempt.cancel()
        for limiter, outcome in zip(limiters, outcomes, strict=False):
            if isinstance(outcome, Grant):
                limiter.backend.hand_back(limiter.name, outcome.member)
        for breaker in breakers:
            breaker.left()
        raise
    failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if failures:
        try:
            await release_grants(grants_of(limiters, outcomes))
        finally:
            charge([limiter.breaker for limiter in limiters], outcomes)
        raise failures[0]
    for breaker in breakers:
        breaker.answered()
    return cast("list[Attempt]", outcomes)


def grants_of(
    limiters: Sequence[Limited], attempts: Sequence[object]
) -> list[tuple[Limited, Grant]]:
    """The grants among ``attempts``, each with its limiter."""
    return [
        (limiter, attempt)
        for limiter, attempt in zip(limiters, attempts, strict=True)
        if isinstance(attempt, Grant)
    ]


async def release_grants(grants: Sequence[tuple[Limited, Grant]]) -> None:
    """Hands back exactly these grants, each by its member (a refusal elsewhere, a block);
    a grant settled for nothing holds nothing."""
    grants = [pair for pair in grants if parse_grant(pair[1].member)[0] > 0]
    if not grants:
        return
    releases = asyncio.gather(
        *(
            limiter.backend.release(limiter.name, parse_grant(grant.member)[0], grant.member)
            for limiter, grant in grants
        ),
        return_exceptions=True,
    )
    outcomes = await asyncio.shield(releases)  # a caller cancelled meanwhile: they go on
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    for outcome in failures:
        if not isinstance(outcome, Exception):
            raise outcome
    if failures:
        hand_backs_failed(failures[0], len(failures))  # one warning with the count, soon
