"""The HTTP clients' second meter: what a call costs in tokens, reserved with its request and
settled once the response says what it really cost (``CallGuard(..., tokens=...)``).

>>> meter = TokenMeter(tokens, estimate=estimate_tokens, usage=usage_tokens)
>>> acquired = await meter.take(call, body)     # the call's request and its tokens, or none
>>> ...                                                          # the call
>>> await meter.settle(acquired, response)                      # usage: fewer or more

The request's permit and the estimate are taken in one request to the engine, all or
nothing: a call that cannot have both takes neither. The estimate is a grant to be settled:
the engine paces it as it paces ``reserve()`` (``_pacing``: a process's calls ask in turn
and reserve no further ahead than ``HORIZON``; a settle that hands tokens back wakes the
next). After the response is read,
``usage(response)`` (an int, None, or an awaitable of either) settles the tokens' grant;
None leaves the estimate standing.
A provider's rate-limit headers (``_quota_headers``) cap what both limiters have left
(:meth:`RateLimiter.cap_remaining`). Nothing here raises once the call is made: a failure to
settle or cap is logged (logger ``aiolimit``), and the response is the caller's.
``tokens={"input": itpm, "output": otpm}`` (Anthropic's separate limits) makes a
:class:`KindsMeter`: a call's input and its output tokens, each on a limiter of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from ._acquire import Acquired, take
from ._limiter import RateLimiter
from ._quota_headers import Quota, quota, stated_limit
from ._request import Request
from ._settling import check_settle_permits
from ._sharded import ShardedRateLimiter
from ._types import MAX_RATE, shown
from .errors import InvalidArgumentError, LimiterError

__all__ = [
    "CAP_EVERY",
    "KINDS",
    "MAX_BODY",
    "Caps",
    "KindsMeter",
    "TokenMeter",
    "UsageTail",
    "Used",
    "cap_at",
    "capping",
    "estimate_by_kind",
    "estimate_tokens",
    "meter_of",
    "sync_from",
    "usage_by_kind",
    "usage_tokens",
]

log = logging.getLogger("aiolimit")

MAX_BODY = 4 * 1024 * 1024
"""The most of a response body kept to read its usage from (a longer one: the estimate
stands)."""

_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")

Estimate = Callable[[Any], Any]
Usage = Callable[[Any], Any]
Used: TypeAlias = "int | Mapping[str, int | None] | None"
"""What a call used: its tokens (one limiter), its tokens per kind (:class:`KindsMeter`), or
None (not said: the estimate stands)."""


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
    bounded memory: the usage of the last ``data:`` line that carries one (``read`` by
    :func:`usage_by_kind`: each kind's last), and the line not yet ended (a line longer than
    ``MAX_BODY`` is skipped).

    >>> tail = UsageTail()
    >>> tail.feed(b'data: {"usage": {"total_tokens": 42}}\n\ndata: [DONE]\n\n')
    >>> tail.finish()
    42
    """

    __slots__ = ("_line", "_read", "_skipping", "tokens")

    def __init__(self, read: Callable[[bytes], Used] = usage_tokens) -> None:
        self._line = bytearray()
        self._read = read  # a line's usage (usage_by_kind: the kinds a line says are kept)
        self._skipping = False  # inside a line longer than MAX_BODY
        self.tokens: Used = None

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

    def finish(self) -> Used:
        """The usage, once the stream has ended (its last line may have no line end)."""
        if not self._skipping and self._line:
            self._seen(bytes(self._line))
            self._line.clear()
        return self.tokens

    def _seen(self, line: bytes) -> None:
        if line.startswith(b"data:") and b'"usage"' in line:
            found = self._read(line.rstrip(b"\r"))
            if found is not None:
                self.tokens = _later(self.tokens, found)


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

    __slots__ = ("caps", "estimate", "tokens", "usage")

    def __init__(
        self,
        tokens: object,
        requests: RateLimiter | ShardedRateLimiter,
        estimate: object,
        usage: object,
    ) -> None:
        tokens = _tokens_beside(tokens, requests)
        for what, given in (("estimate", estimate), ("usage", usage)):
            if not callable(given):
                raise InvalidArgumentError(f"{what} must be callable, not {given!r}")
        self.tokens = tokens
        self.caps = Caps()
        self.estimate: Estimate = estimate  # type: ignore[assignment]
        self.usage: Usage = usage  # type: ignore[assignment]

    async def take(self, call: Request, request: object) -> Acquired:
        """``call`` (the request's permits, its slots) and its estimated tokens, all or
        nothing (an estimate of 0: the request's permits only, nothing to settle)."""
        tokens = self.wanted(self.estimate(request))
        if not tokens:
            return await take(call)
        return await take(call.adding(tokens, paced=True))

    def wanted(self, estimate: object) -> list[tuple[RateLimiter, int]]:
        """The token limiters a call asks, with its ``estimate`` (an estimate of 0: none)."""
        if isinstance(estimate, bool) or not isinstance(estimate, int) or estimate < 0:
            raise InvalidArgumentError(f"estimate() must give an int >= 0, not {shown(estimate)}")
        return [(self.tokens, estimate)] if estimate else []

    @property
    def learns(self) -> RateLimiter | None:
        """The token limiter that ``learn=True`` learns beside the request limiter."""
        return self.tokens

    def tail(self) -> UsageTail:
        """What reads the usage of an event stream as it passes."""
        return UsageTail()

    async def cap(self, headers: Mapping[str, str], came: float | None = None) -> None:
        """What the limiter has left capped by the provider's count, when its headers say
        (``came``: when they came, on the loop's clock; None: now)."""
        await sync_from(headers, self.tokens, "tokens", self.caps, came)

    async def settle(
        self,
        acquired: Acquired,
        response: object,
        headers: Mapping[str, str],
        came: float | None = None,
    ) -> None:
        """The tokens' grant settled as ``usage(response)`` says (None: the estimate stands),
        then the provider's count of tokens left (``headers``, which came at ``came`` on
        the loop's clock) taken as a floor: it counts this call already, so it is synced
        after the settle, lest a refund loosen it; both in one call to the store."""
        used = None if response is None else await self._used(acquired, response)
        await self.settle_used(acquired, used, capping(headers, "tokens", self.caps, came))

    async def _used(self, acquired: Acquired, response: object) -> object:
        """What ``usage(response)`` says the call used (None: not said, not read, or no
        tokens taken)."""
        if not self._took_tokens(acquired):
            return None  # an estimate of 0: no tokens taken
        try:
            used = self.usage(response)
            if inspect.isawaitable(used):
                used = await used
        except (LimiterError, ValueError, TypeError) as exc:
            log.warning("limiter %r: the call's usage was not settled: %s", self.tokens.name, exc)
            return None
        return used

    def _took_tokens(self, acquired: Acquired) -> bool:
        """Whether ``acquired`` holds tokens of this meter's (an estimate of 0: none)."""
        return self.tokens in acquired.owners

    async def settle_used(
        self, acquired: Acquired, used: object, floor: Quota | None = None
    ) -> None:
        """The tokens' grant settled as ``used`` (None: the estimate stands): a response's
        usage, or an event stream's, read as it passed (its response's rate-limit headers
        were taken when it came); then ``floor`` (a provider's count, :func:`capping`)
        taken, in the same call when there is a settle to make."""
        if used is not None and self._took_tokens(acquired):  # (an estimate of 0: none)
            try:
                await acquired.settle(check_settle_permits(used), limiter=self.tokens, cap=floor)
                return
            except (LimiterError, ValueError, TypeError) as exc:
                log.warning(
                    "limiter %r: the call's usage was not settled: %s", self.tokens.name, exc
                )
        if floor is not None:
            await cap_at(self.tokens, floor, "tokens")

    async def unsent(self, acquired: Acquired) -> None:
        """The call never reached the provider (no connection was made): its permit and
        its tokens go back, exactly this call's grants; the call of this process asking
        next asks again at once."""
        await acquired.release()

    async def unused(self, acquired: Acquired, headers: Mapping[str, str]) -> None:
        """The provider refused the call (a ``429`` to retry): its tokens go back, then the
        provider's count is taken as a floor."""
        if self._took_tokens(acquired):
            try:
                await acquired.settle(0, limiter=self.tokens)
            except LimiterError as exc:
                log.warning("limiter %r: tokens not handed back: %s", self.tokens.name, exc)
        await sync_from(headers, self.tokens, "tokens")


def _tokens_beside(tokens: object, requests: object) -> RateLimiter:
    """``tokens``, checked: a RateLimiter other than ``requests``, itself a RateLimiter."""
    if not isinstance(tokens, RateLimiter):
        raise InvalidArgumentError(f"tokens must be a RateLimiter, not {tokens!r}")
    if not isinstance(requests, RateLimiter):
        raise InvalidArgumentError(
            "with tokens=, the request limiter must be a RateLimiter (a ShardedRateLimiter "
            "serves a request from one shard, and cannot join an all-or-nothing acquire)"
        )
    if (tokens.name, tokens.backend.store_id) == (requests.name, requests.backend.store_id):
        raise InvalidArgumentError("tokens= must be another limiter than the requests'")
    return tokens


def meter_of(
    tokens: object | None,
    requests: RateLimiter | ShardedRateLimiter,
    estimate: object | None,
    usage: object | None,
    defaults: tuple[Estimate, Usage],
    kinds_defaults: tuple[Estimate, Usage],
) -> TokenMeter | None:
    """An HTTP client's meter for its ``tokens=`` (None without one), the client's own
    ``defaults`` (estimate, usage) standing in for what is not given, ``kinds_defaults``
    for a mapping of kinds to limiters; ``estimate=`` or ``usage=`` without ``tokens=``:
    InvalidArgumentError."""
    if tokens is None:
        if estimate is not None or usage is not None:
            raise InvalidArgumentError("estimate= and usage= go with tokens=, which is missing")
        return None
    if isinstance(tokens, Mapping):
        estimate, usage = estimate or kinds_defaults[0], usage or kinds_defaults[1]
        return KindsMeter(tokens, requests, estimate, usage)
    return TokenMeter(tokens, requests, estimate or defaults[0], usage or defaults[1])


async def sync_from(
    headers: Mapping[str, str],
    limiter: RateLimiter | ShardedRateLimiter,
    kind: str,
    caps: Caps | None = None,
    came: float | None = None,
) -> None:
    """A provider's rate-limit headers for ``kind``, when :func:`capping` says to, taken as
    a floor by ``limiter``."""
    floor = capping(headers, kind, caps, came)
    if floor is not None:
        await cap_at(limiter, floor, kind)


def capping(
    headers: Mapping[str, str], kind: str, caps: Caps | None = None, came: float | None = None
) -> Quota | None:
    """The provider's count of ``kind`` left (a floor to take), when its headers say and
    it is due: at most once per ``CAP_EVERY`` by a client (its ``caps``; None: every
    time, as after a 429). Not while the provider says it has half or more of the quota it
    states left (``x-ratelimit-limit-*``): its count matters as it nears its quota, and
    until then each response saves a call. The count's reset runs from when the headers
    came (``came``, on the event loop's clock; None: now), not from when the floor reaches
    the store: a body read or settled meanwhile does not hold the limiter longer than the
    provider holds its count (one that has reset since: no floor)."""
    left = quota(headers, kind)
    if left is None:
        return None
    stated = stated_limit(headers, kind) if kind in _STATED else None
    if stated is not None and 2 * left.remaining >= stated[0]:
        return None
    reset = left.reset
    if came is not None:
        reset -= asyncio.get_running_loop().time() - came
        if reset <= 0:
            return None  # (the provider's count has started over since: nothing to hold)
    if caps is not None and not caps.due(kind):
        return None
    return Quota(left.remaining, reset)


async def cap_at(limiter: RateLimiter | ShardedRateLimiter, floor: Quota, kind: str) -> None:
    """``floor`` taken by ``limiter`` (``cap_remaining``); a failure is logged."""
    try:
        await limiter.cap_remaining(floor.remaining, reset=floor.reset)
    except LimiterError as exc:
        log.warning("limiter %r: the provider's %s not synced: %s", limiter.name, kind, exc)


_STATED = ("requests", "tokens")
"""The kinds whose stated limit :func:`sync_from` reads."""

CAP_EVERY = 0.25
"""The least seconds between two caps of one limiter by a process (:func:`sync_from`). A
provider's count reaches the store a little after the provider sent it, by when some of
what it counted may have left the limiter's window, and a cap holds what looks like more
until the provider's reset: capping after every response held a share of the quota back
(benchmarks/reserve.py: 2 points, and a script call per response). A provider counting
more than the limiter does (another client of its quota) is still taken up within this."""


class Caps:
    """When a client last capped its limiters by a provider's count, by kind
    (:func:`sync_from`): again only ``CAP_EVERY`` later."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def due(self, kind: str) -> bool:
        """Whether ``kind`` is capped now (it is then not again for ``CAP_EVERY``)."""
        now = asyncio.get_running_loop().time()
        if now < self._at.get(kind, -math.inf) + CAP_EVERY:
            return False
        self._at[kind] = now
        return True


# -- a call's tokens by kind: Anthropic's input and output limits ----------------------------

KINDS = ("input", "output")
"""The kinds of tokens a provider may limit apart: the prompt, and what the model writes."""

_USAGE_FIELDS = {
    # (Anthropic counts cache writes against the input limit, and cache reads not; OpenAI
    # names them prompt and completion tokens)
    "input": (("input_tokens", "cache_creation_input_tokens"), ("prompt_tokens",)),
    "output": (("output_tokens",), ("completion_tokens",)),
}


def estimate_by_kind(body: bytes) -> dict[str, int]:
    """A request body's tokens by kind, over-estimated: its input a token per 4 bytes of the
    whole body (at least 1), its output the ``max_tokens`` it asks for (0 when it asks none)."""
    whole = estimate_tokens(body)
    prompt = min(len(body) // 4 + 1, MAX_RATE)
    return {"input": prompt, "output": whole - prompt if whole > prompt else 0}


def usage_by_kind(body: bytes | None) -> dict[str, int | None] | None:
    """The tokens a response says it used, by kind: ``input_tokens`` (with
    ``cache_creation_input_tokens``) and ``output_tokens`` (Anthropic), or ``prompt_tokens``
    and ``completion_tokens`` (OpenAI); for an event stream, each kind as its last ``data:``
    event that says it (Anthropic's ``message_start`` holds the input, in its ``message``,
    and ``message_delta`` the output). None when it says neither."""
    if not body:
        return None
    try:
        return _kinds(json.loads(body))
    except ValueError:
        pass
    found: dict[str, int | None] | None = None
    for line in body.splitlines():  # server-sent events: each kind's last count wins
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                said = _kinds(json.loads(line[5:]))
            except ValueError:
                continue
            if said is not None:
                found = said if found is None else _merged(found, said)
    return found


def _kinds(document: object) -> dict[str, int | None] | None:
    if isinstance(document, dict) and "usage" not in document:
        document = document.get("message")  # (Anthropic's message_start event)
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None
    counts: dict[str, int | None] = {}
    for kind, spellings in _USAGE_FIELDS.items():
        counts[kind] = None
        for main, *extra in spellings:
            count = _count(usage.get(main))
            if count is not None:
                more = sum(_count(usage.get(name)) or 0 for name in extra)
                counts[kind] = min(count + more, MAX_RATE)
                break
    return None if all(count is None for count in counts.values()) else counts


def _later(before: Used, after: Used) -> Used:
    """A stream's usage so far, then a later event's: the later one (by kind, what it says)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        return _merged(before, after)
    return after


def _merged(
    before: Mapping[str, int | None], after: Mapping[str, int | None]
) -> dict[str, int | None]:
    return {**before, **{kind: n for kind, n in after.items() if n is not None}}


class KindsMeter(TokenMeter):
    """A call's tokens by kind, each on a limiter of its own: ``{"input": itpm, "output":
    otpm}`` (either alone too). ``estimate(request)`` and ``usage(response)`` give a count per
    kind (a mapping; a kind the usage leaves out, or None: that kind's estimate stands); each
    limiter is capped by its own headers (``anthropic-ratelimit-input-tokens-*``,
    ``-output-tokens-*``). ``learn=True`` learns the request limiter's rate only."""

    __slots__ = ("kinds",)

    def __init__(
        self,
        tokens: object,
        requests: RateLimiter | ShardedRateLimiter,
        estimate: object,
        usage: object,
    ) -> None:
        if not isinstance(tokens, Mapping) or not tokens or set(tokens) - set(KINDS):
            raise InvalidArgumentError(
                f"tokens= takes a RateLimiter, or a mapping of {' and/or '.join(KINDS)} to "
                f"RateLimiters; not {shown(tokens)}"
            )
        kinds = {kind: _tokens_beside(tokens[kind], requests) for kind in KINDS if kind in tokens}
        if len({(each.name, each.backend.store_id) for each in kinds.values()}) < len(kinds):
            raise InvalidArgumentError("tokens= must name another limiter for each kind")
        super().__init__(next(iter(kinds.values())), requests, estimate, usage)
        self.kinds: dict[str, RateLimiter] = kinds

    def wanted(self, estimate: object) -> list[tuple[RateLimiter, int]]:
        if not isinstance(estimate, Mapping) or any(
            isinstance(estimate.get(kind), bool)
            or not isinstance(estimate.get(kind), int)
            or estimate[kind] < 0
            for kind in self.kinds
        ):
            raise InvalidArgumentError(
                f"estimate() must give an int >= 0 for each of {', '.join(self.kinds)}, not "
                f"{shown(estimate)}"
            )
        return [(limiter, estimate[kind]) for kind, limiter in self.kinds.items() if estimate[kind]]

    @property
    def learns(self) -> RateLimiter | None:
        return None

    def _took_tokens(self, acquired: Acquired) -> bool:
        return any(limiter in acquired.owners for limiter in self.kinds.values())

    def tail(self) -> UsageTail:
        return UsageTail(usage_by_kind)

    async def cap(self, headers: Mapping[str, str], came: float | None = None) -> None:
        for kind, limiter in self.kinds.items():
            await sync_from(headers, limiter, f"{kind}-tokens", self.caps, came)

    async def settle(
        self,
        acquired: Acquired,
        response: object,
        headers: Mapping[str, str],
        came: float | None = None,
    ) -> None:
        used = None if response is None else await self._used(acquired, response)
        await self.settle_used(acquired, used)
        await self.cap(headers, came)  # (each kind's limiter by its own headers)

    async def settle_used(
        self, acquired: Acquired, used: object, floor: Quota | None = None
    ) -> None:
        if not isinstance(used, Mapping):
            if used is not None:  # (None: every estimate stands)
                log.warning(
                    "the call's usage was not settled: usage() must give a count per kind "
                    "(%s), not %s",
                    ", ".join(self.kinds),
                    shown(used),
                )
            return
        for kind, limiter in self.kinds.items():
            count = used.get(kind)
            if count is None or limiter not in acquired.owners:
                continue  # (not said, or an estimate of 0: nothing taken)
            try:
                await acquired.settle(check_settle_permits(count), limiter=limiter)
            except (LimiterError, ValueError, TypeError) as exc:
                log.warning("limiter %r: the call's usage was not settled: %s", limiter.name, exc)

    async def unused(self, acquired: Acquired, headers: Mapping[str, str]) -> None:
        await self.settle_used(acquired, dict.fromkeys(self.kinds, 0))
        await self.cap(headers)
