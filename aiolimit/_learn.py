"""Learning a partner's quota: one adaptive rate, kept in the store, shared by every process.

>>> limiter = RateLimiter("partner-api", backend, rate="20/second")   # the ceiling
>>> learner = Learner(limiter)
>>> response = await call_partner()
>>> if response.status == 429:
...     await learner.refused(acquired)        # one cut per episode, for the whole fleet
... else:
...     await learner.succeeded(acquired)       # an increase, at most once per interval
>>> await learner.stated(12, 1)                 # the partner says: 12 per second

The limiter's rate from code (``rate=``, or ``ceiling=``) is the ceiling: the most the
learned rate will ever be. The rate in force is the limiter's stored config, rewritten by
the store (``backends._learning`` states the law) with the state kept: grants made stay
counted. Every process that learns the same limiter shares one learned rate; its callers
take permits from the limiter as usual. The HTTP clients do all of this with ``learn=True``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Mapping

from . import _observe
from ._acquire import Acquired, Outcome, outcome_of
from ._limiter import RateLimiter
from ._quota_headers import stated_limit
from ._request import Request, deadline_in, left_of, micros, seconds
from ._types import Duration, Rate, Rates, rates_of, shown, to_micros
from ._values import US
from .backends._learning import FOREVER_HOLD, MILLION, Event, Law, Learned
from .backends.base import Grant
from .errors import InvalidArgumentError, LimiterError

__all__ = ["HORIZON", "REFUSALS", "CallLearning", "Learned", "Learner", "call_learning"]

log = logging.getLogger("aiolimit")

HORIZON = 0.02
"""How far ahead (seconds) a learning HTTP client's call reserves: a cut or an increase
takes effect for every caller within this long (reservations made under the old rate keep
their slots)."""


def _share(value: float, what: str, low: float, high: float) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidArgumentError(f"{what} must be a number, not {shown(value)}")
    if not low < value <= high:
        raise InvalidArgumentError(f"{what} must be above {low} and at most {high}, not {value}")
    return round(value * MILLION)


class Learner:
    """Learns ``limiter``'s rate from a partner's answers (see the module).

    ``ceiling``: the most the rate may be (an int with ``interval``, a rate string, or
    rates); default: the limiter's ``rate=``, else the ceiling stored by an earlier
    learner, else the stored config. ``start`` (0.5): where learning starts, and starts
    again when the store lost the learned state, as a share of the ceiling (or the stored
    rate, where lower). ``floor`` (0.05): the least it goes to, as a share of the ceiling
    (at least one permit per interval; for a tokens limiter keep it above your largest
    call). ``decrease`` (0.5): the share kept when a rate that held is refused.
    ``step`` (0.05): the first increase, as a share of the ceiling; it doubles while
    increases hold. ``max_hold`` (16 intervals of the ceiling's first rate): the longest a
    level that failed waits before it is tried again: longer means fewer ``429``s while the
    partner's limit stays put
    (one per probe: about ``1 / (rate x max_hold)`` of the calls), and a later find when
    it rises. Below where the limit fell from, the wait is at most 4 intervals (or
    ``max_hold``, if shorter): a limit that came back is found soon.
    """

    __slots__ = (
        "_begun",
        "_ceiling",
        "_law",
        "_next_report",
        "_reported",
        "_seen",
        "_told_for",
        "limiter",
    )

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        ceiling: Rates | None = None,
        interval: Duration | None = None,
        start: float = 0.5,
        floor: float = 0.05,
        decrease: float = 0.5,
        step: float = 0.05,
        max_hold: Duration | None = None,
    ) -> None:
        if not isinstance(limiter, RateLimiter):
            raise InvalidArgumentError(
                f"a Learner learns a RateLimiter's rate (a ShardedRateLimiter's shards cannot "
                f"share one), not {limiter!r}"
            )
        self.limiter = limiter
        given = limiter.rate_in_code.config
        if ceiling is not None:
            self._ceiling: tuple[Rate, ...] | None = rates_of(ceiling, interval)
        elif interval is not None:
            raise InvalidArgumentError("interval goes with ceiling=, which is missing")
        else:
            self._ceiling = None if given is None else given.rates
        hold = None if max_hold is None else to_micros(max_hold, "max_hold")
        if hold is not None and not 0 < hold <= FOREVER_HOLD:
            raise InvalidArgumentError(f"max_hold must be positive, at most 1 hour: {max_hold!r}")
        if hold is None:
            first = self._ceiling[0].interval_us if self._ceiling else US
            hold = min(16 * first, FOREVER_HOLD)
        self._law = Law(
            floor=_share(floor, "floor", 0, 1),
            start=_share(start, "start", 0, 1),
            decrease=_share(decrease, "decrease", 0, 0.999),
            step=_share(step, "step", 0, 1),
            max_hold=hold,
        )
        self._seen: tuple[int, int] | None = None  # (permits, ceiling) last reported
        self._reported: Learned | None = None
        self._next_report = -math.inf  # (loop time) when a success is worth reporting
        self._told_for = -1  # the level (its grown_at) a success that can prove it was told for
        self._begun: asyncio.Future[None] | None = None

    async def begin(self) -> None:
        """Once per learner (concurrent callers wait for one): makes the code's config the
        stored one where none is, and reads the learned rate, so that a client's first
        calls already go at it, not at the ceiling."""
        if self._begun is None:
            self._begun = asyncio.ensure_future(self._begin())
        try:
            await asyncio.shield(self._begun)
        except LimiterError:
            self._begun = None  # (tried again by the next call)
            raise

    async def _begin(self) -> None:
        await self.limiter.rate_in_code.store()  # (the code's rate, where none is stored)
        await self.read()

    @property
    def learned(self) -> Learned | None:
        """What this process last heard of the learned rate (None: nothing yet)."""
        return self._reported

    async def read(self) -> Learned:
        """The learned rate, as the store holds it (starting learning where none is)."""
        return await self._learn("read", None, None)

    async def refused(self, acquired: Acquired | None = None) -> Learned:
        """The partner refused a call (``429``, or ``503``): the fleet cuts its rate, once per
        episode. ``acquired``: the call's acquisition (a refusal of a call granted before
        the last cut is that cut's; without it, refusals within a quarter interval of a cut
        are)."""
        return await self._learn("refused", _decided_at(acquired), None)

    async def succeeded(self, acquired: Acquired | None = None) -> Learned | None:
        """The partner served a call: the fleet may increase its rate (at most once per
        interval). ``acquired``: the call's acquisition (a level is proven by a call granted
        at least an interval after it was raised; without it, by one told that late).
        Reported to the store at most four times per interval per learner, and not at all
        while it cannot prove the level in force, but the first that can is reported at
        once; None when this one was not."""
        now = asyncio.get_running_loop().time()
        decided, known = _decided_at(acquired), self._reported
        if known is not None and decided is not None:
            if decided < known.grown_at + known.interval_us:
                return None  # granted before the level in force could be proven
            first = known.grown_at != self._told_for
            self._told_for = known.grown_at
            if not first and now < self._next_report:
                return None  # (the first that can prove a level is told at once)
        elif now < self._next_report:
            return None
        interval = known.interval_us if known else US
        self._next_report = now + interval / 4e6
        return await self._learn("succeeded", decided, None)

    async def stated(self, quota: int, window: Duration) -> Learned:
        """The partner states its limit: ``quota`` per ``window`` (seconds or a
        timedelta), taken at once, scaled to the ceiling's interval, at most the ceiling
        and at least the floor."""
        if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
            raise InvalidArgumentError(f"quota must be an int >= 0, not {shown(quota)}")
        per = to_micros(window, "window")
        if per <= 0:
            raise InvalidArgumentError(f"window must be positive, not {window!r}")
        return await self._learn("stated", quota, per)

    async def _learn(self, event: Event, value: int | None, per: int | None) -> Learned:
        limiter = self.limiter
        learned = await limiter.breaker.guard(
            limiter.backend.learn(limiter.name, event, value, per, self._ceiling, self._law)
        )
        self._reported = learned
        seen = (learned.permits, learned.ceiling)
        if seen != self._seen:
            self._seen = seen
            observer = _observe.current
            if observer is not None:
                observer.learned(
                    limiter.name, learned.permits, learned.ceiling, seconds(learned.interval_us)
                )
        return learned


def _decided_at(acquired: Acquired | None) -> int | None:
    """When ``acquired``'s grants were decided (limiter's clock, µs): the latest."""
    if acquired is None:
        return None
    decided = [a.starts_at - a.starts_in for a in acquired.attempts if isinstance(a, Grant)]
    return max(decided, default=None)


async def _paced(request: Request, lock: asyncio.Lock, raised: asyncio.Event) -> Outcome:
    """``request`` asked as a learning client asks: reserving at most ``HORIZON`` ahead,
    this process's callers one at a time and in order (``lock``), so that a rate the store
    changes holds for the next call already; asleep until its slot, or until this process
    raised the rate (``raised``: the new permit is taken at once)."""
    left = left_of(request.deadline)
    try:
        await asyncio.wait_for(lock.acquire(), None if left is None else seconds(left))
    except TimeoutError:
        return await outcome_of(request.until(deadline_in(0)))  # (one last ask)
    try:
        while True:
            left = left_of(request.deadline)
            ahead = micros(HORIZON) if left is None else min(micros(HORIZON), left)
            outcome = await outcome_of(request.until(deadline_in(ahead)))
            if outcome.granted or (left is not None and outcome.retry_in > left):
                return outcome
            raised.clear()
            asleep = max(seconds(outcome.retry_in) - HORIZON / 2, 0.001)
            with contextlib.suppress(asyncio.TimeoutError):  # (3.10: not the builtin one)
                await asyncio.wait_for(raised.wait(), asleep)
    finally:
        lock.release()


class CallLearning:
    """What a learning HTTP client (``learn=True``) does around each call: takes permits
    no further ahead than ``HORIZON``, and tells the learners what the partner answered
    (a ``429``/``503``: refused; another answer below 500: succeeded; a stated limit)."""

    __slots__ = ("_paces", "requests", "tokens")

    def __init__(self, requests: Learner, tokens: Learner | None) -> None:
        self.requests, self.tokens = requests, tokens
        # per event loop: its callers' turn, and the wake-up of the one asleep in it
        self._paces: dict[asyncio.AbstractEventLoop, tuple[asyncio.Lock, asyncio.Event]] = {}
        for learner in (requests, tokens):  # (a learned rate: no measured margin beside it)
            if learner is not None:
                limiter = learner.limiter
                limiter.backend.context.margins.begun.add(limiter.name)

    def paced(self, request: Request) -> Awaitable[Outcome]:
        """How a learning client's call takes its permits (the engine's rate step, for
        ``take(request, learning.paced)``): the learners begun, then ``request`` asked no
        further ahead than ``HORIZON``, one caller of this process at a time."""
        return self._begin_then(_paced(request, *self._pace()))

    def _pace(self) -> tuple[asyncio.Lock, asyncio.Event]:
        loop = asyncio.get_running_loop()
        pace = self._paces.get(loop)
        if pace is None:
            self._paces = {k: v for k, v in self._paces.items() if not k.is_closed()}
            pace = self._paces[loop] = (asyncio.Lock(), asyncio.Event())
        return pace

    async def _begin_then(self, taking: Awaitable[Outcome]) -> Outcome:
        try:
            for learner in (self.requests, self.tokens):
                if learner is not None:
                    await learner.begin()
        except LimiterError as exc:  # (the permit says what is wrong, if it is)
            log.warning("limiter %r: not learning yet: %s", self.requests.limiter.name, exc)
        return await taking

    def short_pause(self) -> float:
        """The longest ``Retry-After`` (seconds) that holds back only its own call: one
        interval of the learned rate; a longer one pauses every caller."""
        learned = self.requests.learned
        return 1.0 if learned is None else seconds(learned.interval_us)

    async def after(self, status: int, headers: Mapping[str, str], acquired: Acquired) -> None:
        """Tells the learners what the partner answered; a failure is logged."""
        for learner, kind in ((self.requests, "requests"), (self.tokens, "tokens")):
            if learner is None:
                continue
            try:
                if status in REFUSALS:
                    await learner.refused(acquired)
                elif status < 500:
                    learned = await learner.succeeded(acquired)
                    if learned is not None and learned.changed:  # raised: take it at once
                        self._pace()[1].set()
                limit = stated_limit(headers, kind)
                if limit is not None:
                    await learner.stated(*limit)
            except LimiterError as exc:
                log.warning(
                    "limiter %r: not learned from the answer: %s", learner.limiter.name, exc
                )


REFUSALS = frozenset({429, 503})
"""The statuses a learner takes as the partner's refusal."""


def call_learning(
    learn: bool | Learner, limiter: object, tokens: RateLimiter | None
) -> CallLearning | None:
    """An HTTP client's learning for its ``learn=`` (None: off): ``True`` learns the
    request limiter's rate (and the tokens limiter's, with ``tokens=``) with the defaults; a
    :class:`Learner` of the request limiter, its own knobs."""
    if learn is False:
        return None
    if isinstance(learn, Learner):
        if learn.limiter is not limiter:
            raise InvalidArgumentError("learn= must be a Learner of the client's own limiter")
        requests = learn
    elif learn is True:
        if not isinstance(limiter, RateLimiter):
            raise InvalidArgumentError(
                f"learn=True learns a RateLimiter's rate (a ShardedRateLimiter's shards cannot "
                f"share one), not {limiter!r}"
            )
        requests = Learner(limiter)
    else:
        raise InvalidArgumentError(f"learn must be True, False or a Learner, not {shown(learn)}")
    return CallLearning(requests, None if tokens is None else Learner(tokens))
