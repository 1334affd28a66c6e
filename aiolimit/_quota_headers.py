"""What a provider's rate-limit headers say is left of its quota, read defensively.

OpenAI answers ``x-ratelimit-remaining-requests`` / ``-tokens`` with their
``x-ratelimit-reset-requests`` / ``-tokens`` as durations (``6m0s``, ``1.5s``, ``20ms``);
Anthropic ``anthropic-ratelimit-requests-remaining`` / ``-tokens-remaining`` with ``-reset``
as RFC 3339 times, and its input and output tokens apart (``-input-tokens-remaining``,
``-output-tokens-remaining``). A value that cannot be read is ignored, never raised: a partner that
answers absurd values (a negative count, a reset in the year 9999, 400 digits) must not stop
or confuse the callers, so counts are bounded by ``MAX_RATE`` and resets by ``max_reset``.

>>> quota(headers, "tokens")
Quota(remaining=29_000, reset=0.12)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import NamedTuple

from ._types import MAX_RATE

__all__ = ["KINDS", "Quota", "duration_seconds", "quota", "stated_limit"]

KINDS = ("requests", "tokens", "input-tokens", "output-tokens")
"""What a provider meters: requests, and tokens (Anthropic: its input and output tokens
apart too)."""

# (remaining, reset) header names per kind, per provider; the first pair found is read.
_NAMES = {
    kind: (
        (f"x-ratelimit-remaining-{kind}", f"x-ratelimit-reset-{kind}"),
        (f"anthropic-ratelimit-{kind}-remaining", f"anthropic-ratelimit-{kind}-reset"),
    )
    for kind in ("requests", "tokens")
} | {
    kind: ((f"anthropic-ratelimit-{kind}-remaining", f"anthropic-ratelimit-{kind}-reset"),)
    for kind in ("input-tokens", "output-tokens")  # (Anthropic's alone)
}

# Go-style durations as OpenAI writes them: a sequence of <number><unit>, e.g. 1h2m3.5s, 20ms.
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|us|µs|ns|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_COUNT = re.compile(r"[0-9]{1,20}")


class Quota(NamedTuple):
    """What is left of a provider's quota, and in how many seconds its count resets."""

    remaining: int
    reset: float


def duration_seconds(text: str) -> float | None:
    """A Go-style duration (``6m0s``, ``1.5s``, ``20ms``; a bare number is seconds) in
    seconds; None when it cannot be read (empty, negative, garbage, not finite)."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        seconds = float(text)
    else:
        position, seconds = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != position:
                return None
            seconds += float(match.group(1)) * _UNIT[match.group(2)]
            position = match.end()
        if position != len(text):
            return None
    return seconds if math.isfinite(seconds) else None


def _reset_seconds(text: str, now: float) -> float | None:
    """A reset written as a duration or as an RFC 3339 time (seconds from ``now``)."""
    seconds = duration_seconds(text)
    if seconds is not None:
        return seconds
    value = text.strip()
    if len(value) > 64:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(when.timestamp() - now, 0.0)


def quota(
    headers: Mapping[str, str] | Callable[[str], str | None],
    kind: str,
    *,
    max_reset: float = 3600.0,
    now: float | None = None,
) -> Quota | None:
    """The provider's ``kind`` (one of ``KINDS``) quota from a response's
    headers (a mapping with case-insensitive lookups, as httpx's and aiohttp's are, or a
    function of a name); None when the headers do not say, or say it unreadably. The reset
    is at most ``max_reset`` seconds away; the count at most ``MAX_RATE``."""
    get = headers if callable(headers) else headers.get
    moment = time.time() if now is None else now
    for remaining_name, reset_name in _NAMES[kind]:
        remaining, reset = get(remaining_name), get(reset_name)
        if remaining is None or reset is None:
            continue
        remaining = remaining.strip()
        if not _COUNT.fullmatch(remaining):
            return None
        seconds = _reset_seconds(reset, moment)
        if seconds is None:
            return None
        return Quota(min(int(remaining), MAX_RATE), min(seconds, max_reset))
    return None


# -- the limit a partner states ---------------------------------------------------------------

_MINUTE = 60.0
# The header that states each kind's limit per minute (OpenAI, Anthropic); the first found.
_LIMIT_NAMES = {
    "requests": ("x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
    "tokens": ("x-ratelimit-limit-tokens", "anthropic-ratelimit-tokens-limit"),
}
_SPLIT_TOKENS = (
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-output-tokens-limit",
)
_LONGEST_WINDOW = 86400 * 366  # seconds: a policy's window longer than a year is not believed
_POLICY_ITEMS = 16  # items of a RateLimit-Policy read, at most
_PARAM = re.compile(r'\s*([a-z][a-z0-9_.*-]*)\s*=\s*("[^"]*"|[^;,\s]*)\s*')


def stated_limit(
    headers: Mapping[str, str] | Callable[[str], str | None], kind: str
) -> tuple[int, float] | None:
    """The limit a partner states for ``kind`` (``"requests"`` or ``"tokens"``): ``(quota,
    window seconds)``; None when its headers do not say, or say it unreadably. Read from
    ``x-ratelimit-limit-*`` (OpenAI) and ``anthropic-ratelimit-*-limit`` (Anthropic; for
    tokens, its input and output limits summed when it states no total), both per minute,
    and for requests from the IETF ``RateLimit-Policy`` field (``"name";q=100;w=60``; of its
    policies counted in requests, the one with the shortest window). Counts are at most
    ``MAX_RATE``.

    >>> stated_limit({"ratelimit-policy": '"burst";q=12;w=1'}, "requests")
    (12, 1.0)
    """
    get = headers if callable(headers) else headers.get
    for name in _LIMIT_NAMES[kind]:
        count = _count_of(get(name))
        if count is not None:
            return count, _MINUTE
    if kind == "tokens":
        parts = [_count_of(get(name)) for name in _SPLIT_TOKENS]
        if None not in parts:
            return min(sum(p for p in parts if p is not None), MAX_RATE), _MINUTE
        return None
    return _policy(get("ratelimit-policy"))


def _count_of(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    return min(int(value), MAX_RATE) if _COUNT.fullmatch(value) else None


def _policy(value: str | None) -> tuple[int, float] | None:
    """The request quota of a ``RateLimit-Policy`` field with the shortest window (the one a
    limiter's interval is most like; the smallest of those), None: none readable."""
    if value is None or len(value) > 4096:
        return None
    tightest: tuple[int, float] | None = None
    for item in value.split(",")[:_POLICY_ITEMS]:
        head, _, rest = item.partition(";")
        params = {m.group(1): m.group(2).strip('"') for m in _PARAM.finditer(rest)}
        if params.get("qu", "requests") != "requests":
            continue
        quota = _count_of(params.get("q") or head)  # (early drafts: the item is the quota)
        window = _count_of(params.get("w"))
        if quota is None or not window or window > _LONGEST_WINDOW:
            continue
        if tightest is None or (window, quota) < (tightest[1], tightest[0]):
            tightest = (quota, float(window))
    return tightest
