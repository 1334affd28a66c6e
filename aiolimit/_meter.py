"""The HTTP clients' second meter: what a call costs in tokens, reserved with its request and
settled once the response says what it really cost (``CallGuard(..., tokens=...)``).

>>> meter = TokenMeter(tokens, estimate=estimate_tokens, usage=usage_tokens)
>>> acquired = await meter.take(requests, 1, deadline, body)   # both, all or nothing
>>> ...                                                          # the call
>>> await meter.settle(acquired, response)                      # usage: fewer or more

The request's permit and the estimate are taken in one request to the engine, all or
nothing: a call that cannot have both takes neither. A process's calls ask one at a time, in
order, and reserve no further ahead than ``HORIZON``, else ask again after a short while: an
estimate is a worst case, and reservations queued far ahead would keep the places their
settled calls no longer need (a reservation is placed on what the store knew when it was
made, and is not moved earlier by later refunds). After the response is read,
``usage(response)`` (an int, None, or an awaitable of either) settles the tokens' grant;
None leaves the estimate standing.
A provider's rate-limit headers (``_quota_headers``) are taken as floors for both limiters
(:meth:`RateLimiter.sync`). Nothing here raises once the call is made: a failure to settle or
sync is logged (logger ``aiolimit``), and the response is the caller's.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ._acquire import Acquired, Outcome, outcome_of, take
from ._limiter import RateLimiter
from ._quota_headers import quota
from ._request import Leasing, Request, deadline_in, left_of, micros, seconds
from ._settling import check_settle_permits
from ._sharded import ShardedRateLimiter
from ._types import MAX_RATE, shown
from .backends.base import Refusal
from .errors import InvalidArgumentError, LimiterError

__all__ = [
    "MAX_BODY",
    "TokenMeter",
    "UsageTail",
    "estimate_tokens",
    "meter_of",
    "sync_from",
    "usage_tokens",
]

log = logging.getLogger("aiolimit")

MAX_BODY = 4 * 1024 * 1024
"""The most of a response body kept to read its usage from (a longer one: the estimate
stands)."""

HORIZON = 0.01
"""How far ahead (seconds) a metered call reserves: further, and it asks again after at most
this long, then twice as long each time, up to ``MAX_ASK_EVERY`` (a call of its process
handing tokens back wakes it at once, and starts it over)."""

MAX_ASK_EVERY = 0.08
"""The longest a metered call waits between two asks: how late, at most, it sees tokens
handed back in another process. Every process's first waiting call asks at least this
often while tokens bind, so a fleet of N processes asks N / MAX_ASK_EVERY times a second."""

_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")

Estimate = Callable[[Any], int]
Usage = Callable[[Any], "int | Awaitable[int | None] | None"]


def estimate_tokens(body: bytes) -> int:
    """A request body's tokens, over-estimated: a token per 4 bytes of the whole body (the
    prompt and its JSON around it), plus the ``max_tokens`` (``max_completion_tokens``,
    ``max_output_tokens``) it asks for; at least 1."""
    tokens = len(body) // 4 + 1
    try:
        fields = json.loads(body) if body else None
    except ValueError:
        return tokens
    if isinstance(fields, dict):
        for name in _MAX_TOKEN_FIELDS:
            value = fields.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return min(tokens + value, MAX_RATE)
    return min(tokens, MAX_RATE)


def usage_tokens(body: bytes | None) -> int | None:
    """The tokens a response says it used: a JSON body's ``usage.total_tokens`` (OpenAI), or
    ``usage.input_tokens + usage.output_tokens`` (Anthropic); for an event stream, the last
    ``data:`` event that carries a usage. None when it does not say."""
    if not body:
        return None
    try:
        return _usage(json.loads(body))
    except ValueError:
        pass
    for line in reversed(body.splitlines()):  # server-sent events: the last usage wins
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                found = _usage(json.loads(line[5:]))
            except ValueError:
                continue
            if found is not None:
                return found
    return None


class UsageTail:
    """The usage an event stream reports, read from its bytes as they pass (``feed``), in
    bounded memory: the usage of the last ``data:`` line that carries one, and the line not
    yet ended (a line longer than ``MAX_BODY`` is skipped).

    >>> tail = UsageTail()
    >>> tail.feed(b'data: {"usage": {"total_tokens": 42}}\n\ndata: [DONE]\n\n')
    >>> tail.finish()
    42
    """

    __slots__ = ("_line", "_skipping", "tokens")

    def __init__(self) -> None:
        self._line = bytearray()
        self._skipping = False  # inside a line longer than MAX_BODY
        self.tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        *ended, rest = chunk.split(b"\n")
        for part in ended:
            if self._skipping:
                self._skipping = False
            else:
                self._seen(bytes(self._line) + part)
            self._line.clear()
        if self._skipping or len(self._line) + len(rest) > MAX_BODY:
            self._skipping = True
            self._line.clear()
        else:
            self._line += rest

    def finish(self) -> int | None:
        """The usage, once the stream has ended (its last line may have no line end)."""
        if not self._skipping and self._line:
            self._seen(bytes(self._line))
            self._line.clear()
        return self.tokens

    def _seen(self, line: bytes) -> None:
        if line.startswith(b"data:") and b'"usage"' in line:
            found = usage_tokens(line.rstrip(b"\r"))
            if found is not None:
                self.tokens = found


def _usage(document: object) -> int | None:
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None
    total = _count(usage.get("total_tokens"))
    if total is not None:
        return min(total, MAX_RATE)
    parts = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    if None not in parts:
        return min(sum(part for part in parts if part is not None), MAX_RATE)
    return None


def _count(value: object) -> int | None:
    """``value`` when it is a count of tokens (an int >= 0)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


class TokenMeter:
    """A token limiter beside a client's request limiter; see the module."""

    __slots__ = ("_turns", "estimate", "tokens", "usage")

    def __init__(
        self,
        tokens: object,
        requests: RateLimiter | ShardedRateLimiter,
        estimate: object,
        usage: object,
    ) -> None:
        if not isinstance(tokens, RateLimiter):
            raise InvalidArgumentError(f"tokens must be a RateLimiter, not {tokens!r}")
        if not isinstance(requests, RateLimiter):
            raise InvalidArgumentError(
                "with tokens=, the request limiter must be a RateLimiter (a ShardedRateLimiter "
                "serves a request from one shard, and cannot join an all-or-nothing acquire)"
            )
        if (tokens.name, tokens.backend.store_id) == (requests.name, requests.backend.store_id):
            raise InvalidArgumentError("tokens= must be another limiter than the requests'")
        for what, given in (("estimate", estimate), ("usage", usage)):
            if not callable(given):
                raise InvalidArgumentError(f"{what} must be callable, not {given!r}")
        self.tokens = tokens
        self.estimate: Estimate = estimate  # type: ignore[assignment]
        self.usage: Usage = usage  # type: ignore[assignment]
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = (
            weakref.WeakKeyDictionary()
        )

    async def take(
        self,
        requests: RateLimiter,
        permits: int,
        deadline: int | None,
        request: object,
        slots: tuple[tuple[Leasing, int], ...] = (),
    ) -> Acquired:
        """The request's permits and its estimated tokens, all or nothing, within
        ``deadline`` (µs on the loop's clock), after ``slots`` (an estimate of 0: the
        request's permits only, nothing to settle)."""
        estimate = self.estimate(request)
        if isinstance(estimate, bool) or not isinstance(estimate, int) or estimate < 0:
            raise InvalidArgumentError(f"estimate() must give an int >= 0, not {shown(estimate)}")
        if estimate == 0:
            return await take(Request((requests,), (permits,), deadline, slots))
        both = Request((requests, self.tokens), (permits, estimate), deadline, slots)
        return await take(both, lambda asked: self._paced(asked, requests))

    async def _paced(self, request: Request, requests: RateLimiter) -> Outcome:
        """``request`` asked in this process's turn, reserving no further ahead than
        ``HORIZON``: asked again until granted, or until what it waits for would pass its
        deadline."""
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = _Turns()
        if not await turns.wait(request.deadline):  # (the deadline came first: one last ask)
            return await outcome_of(request.until(deadline_in(0)))
        pause = HORIZON
        try:
            while True:
                left = left_of(request.deadline)
                ahead = micros(HORIZON) if left is None else min(micros(HORIZON), left)
                outcome = await outcome_of(request.until(deadline_in(ahead)))
                if outcome.granted or (left is not None and outcome.retry_in > left):
                    return outcome
                held_by = outcome.answer_of(requests)
                if isinstance(held_by, Refusal):  # a refund of tokens would not help
                    await asyncio.sleep(seconds(held_by.retry_in))
                else:
                    woken = await turns.pause(min(seconds(outcome.retry_in), pause))
                    pause = HORIZON if woken else min(pause * 2, MAX_ASK_EVERY)
        finally:
            turns.next()

    async def settle(
        self, acquired: Acquired, response: object, headers: Mapping[str, str]
    ) -> None:
        """The tokens' grant settled as ``usage(response)`` says (None: the estimate stands),
        then the provider's count of tokens left (``headers``) taken as a floor: it counts
        this call already, so it is synced after the settle, lest a refund loosen it."""
        if response is not None:  # (None: a body not read, the estimate stands)
            await self._settle(acquired, response)
        await sync_from(headers, self.tokens, "tokens")

    async def _settle(self, acquired: Acquired, response: object) -> None:
        if self.tokens not in acquired.owners:
            return  # an estimate of 0: no tokens taken
        try:
            used = self.usage(response)
            if inspect.isawaitable(used):
                used = await used
        except (LimiterError, ValueError, TypeError) as exc:
            log.warning("limiter %r: the call's usage was not settled: %s", self.tokens.name, exc)
            return
        await self.settle_used(acquired, used)

    async def settle_used(self, acquired: Acquired, used: object) -> None:
        """The tokens' grant settled as ``used`` (None: the estimate stands): a response's
        usage, or an event stream's, read as it passed (its response's rate-limit headers
        were taken when it came)."""
        if used is None or self.tokens not in acquired.owners:
            return  # (an estimate of 0: no tokens taken)
        try:
            settled = await acquired.settle(check_settle_permits(used), limiter=self.tokens)
        except (LimiterError, ValueError, TypeError) as exc:
            log.warning("limiter %r: the call's usage was not settled: %s", self.tokens.name, exc)
            return
        if settled.handed_back:
            self._wake()

    def _wake(self) -> None:
        """Tokens came back: the call of this process asking next may have them now."""
        turns = self._turns.get(asyncio.get_running_loop())
        if turns is not None:
            turns.wake()

    async def unsent(self, acquired: Acquired) -> None:
        """The call never reached the provider (no connection was made): its permit and
        its tokens go back, exactly this call's grants; the call of this process asking
        next asks again at once."""
        await acquired.release()
        if self.tokens in acquired.owners:
            self._wake()

    async def unused(self, acquired: Acquired, headers: Mapping[str, str]) -> None:
        """The provider refused the call (a ``429`` to retry): its tokens go back, then the
        provider's count is taken as a floor."""
        if self.tokens in acquired.owners:
            try:
                if (await acquired.settle(0, limiter=self.tokens)).handed_back:
                    self._wake()
            except LimiterError as exc:
                log.warning("limiter %r: tokens not handed back: %s", self.tokens.name, exc)
        await sync_from(headers, self.tokens, "tokens")


def meter_of(
    tokens: object | None,
    requests: RateLimiter | ShardedRateLimiter,
    estimate: object | None,
    usage: object | None,
    defaults: tuple[Estimate, Usage],
) -> TokenMeter | None:
    """An HTTP client's meter for its ``tokens=`` (None without one), the client's own
    ``defaults`` (estimate, usage) standing in for what is not given; ``estimate=`` or
    ``usage=`` without ``tokens=``: InvalidArgumentError."""
    if tokens is None:
        if estimate is not None or usage is not None:
            raise InvalidArgumentError("estimate= and usage= go with tokens=, which is missing")
        return None
    return TokenMeter(tokens, requests, estimate or defaults[0], usage or defaults[1])


class _Turns:
    """An event loop's callers, one at a time, in the order they came."""

    __slots__ = ("_busy", "_paused", "_waiting")

    def __init__(self) -> None:
        self._busy = False
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._paused: asyncio.Future[None] | None = None

    async def pause(self, seconds: float) -> bool:
        """The caller whose turn it is sleeps ``seconds``, or until :meth:`wake` (True)."""
        paused = self._paused = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((paused,), timeout=seconds)
            return paused.done() and not paused.cancelled()
        finally:
            self._paused = None
            paused.cancel()

    def wake(self) -> None:
        """Ends a :meth:`pause` (permits came back in this process)."""
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    async def wait(self, deadline: int | None) -> bool:
        """Waits for this caller's turn until ``deadline`` (µs on the loop's clock; None: for
        as long as it takes); whether it came (then :meth:`next` passes it on)."""
        if not self._busy:
            self._busy = True
            return True
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        left = left_of(deadline)
        timeout = None if left is None else seconds(left)
        try:
            await asyncio.wait((turn,), timeout=timeout)
        except BaseException:  # (cancelled: a turn that came meanwhile is passed on)
            if turn.done():
                self.next()
            else:
                turn.cancel()
                self._waiting.remove(turn)
            raise
        if not turn.done():  # (timed out)
            turn.cancel()
            self._waiting.remove(turn)
            return False
        return True

    def next(self) -> None:
        """The turn passes to the next caller waiting, if any."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._busy = False


async def sync_from(
    headers: Mapping[str, str], limiter: RateLimiter | ShardedRateLimiter, kind: str
) -> None:
    """A provider's rate-limit headers for ``kind``, when present, taken as a floor by
    ``limiter``; a failure is logged."""
    left = quota(headers, kind)
    if left is None:
        return
    try:
        await limiter.sync(remaining=left.remaining, reset=left.reset)
    except LimiterError as exc:
        log.warning("limiter %r: the provider's %s not synced: %s", limiter.name, kind, exc)
