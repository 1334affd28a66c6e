"""The header fields of draft-ietf-httpapi-ratelimit-headers, and the legacy X-RateLimit ones.

``RateLimit-Policy: "api-per-client";q=10;w=1`` and ``RateLimit: "api-per-client";r=0;t=1``:
what every rule that applied to a request says about it, gathered in the request's scope so a
middleware and any dependencies inside it write one set of fields together.

A rule with several rates has a policy per rate (``"burst-1s"``, ``"burst-60s"``); its
``RateLimit`` item names the one that binds, with that policy's reset. The store says the
fewest permits left under any rate, which rate has them (``Grant.binding``) and, on a
refusal, the wait. A grant that leaves permits names that rate's policy, with its window. A
grant that leaves none reads the wait for the next permit (its reset), and a refusal has its
wait: the rate the store named binds if the wait fits in its window (a rate never holds a
request back longer than its window); else (several rates have none left, and a longer one
holds the request back) the one with the shortest window that the wait fits in.

A response reports at most ``MAX_FIELD_ITEMS`` (8) rules: with more, the tightest (fewest
permits left, then latest reset), tightest first.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

from .._limiter import RateLimiter
from .._values import micros_up
from ..backends.base import Grant
from ..errors import LimiterError
from ._rules import Rule, whole_seconds, window
from ._types import Message, Scope

__all__ = [
    "Item",
    "granted_item",
    "granted_items",
    "header_fields",
    "items_of",
    "read_granted_items",
    "refused_item",
    "with_fields",
]

# Where the rate limit items of a request gather.
_SCOPE_KEY = "aiolimit.rate_limits"


class Item(NamedTuple):
    """What a request's response says about one rule."""

    rule: Rule
    remaining: int
    reset: int  # whole seconds
    policy: int = 0  # which of the rule's policies (rates) binds


def binding_policy(rule: Rule, wait_us: int) -> int:
    """The rate of ``rule`` that explains a wait of ``wait_us``: the one with the shortest
    window the wait fits in, else the longest."""
    indexed = list(enumerate(rule.rates))
    fits = [(rate.interval_us, i) for i, rate in indexed if rate.interval_us >= wait_us]
    if fits:
        return min(fits)[1]
    return max((rate.interval_us, i) for i, rate in indexed)[1]


def fewest_left(rule: Rule, binding: int) -> int:
    """The rule's rate the store named as the one with the fewest permits left (the first,
    for a store that names one the rule does not have)."""
    return binding if 0 <= binding < len(rule.rates) else 0


def waiting_policy(rule: Rule, binding: int, wait_us: int) -> int:
    """The rate of ``rule`` that holds the next request back for ``wait_us``: the one with
    the fewest permits left (``binding``, as the store says) if the wait fits in its window,
    else the one :func:`binding_policy` finds."""
    binding = fewest_left(rule, binding)
    if rule.rates[binding].interval_us >= wait_us:
        return binding
    return binding_policy(rule, wait_us)


# Item(...) without the Python frame of a named tuple's __new__ (every field given).
_new_item = functools.partial(tuple.__new__, Item)


def granted_item(rule: Rule, left: int, binding: int) -> Item:
    """The item of a rule that granted a request and has ``left`` permits left under the rate
    ``binding``: that rate's policy, with its window."""
    if not 0 <= binding < len(rule.rates):  # (fewest_left, inline: once per rule and request)
        binding = 0
    return _new_item((rule, left if left > 0 else 0, rule.windows[binding], binding))


def refused_item(rule: Rule, retry_in_us: int, binding: int) -> Item:
    """The item of a rule that refused a request for ``retry_in_us``."""
    return Item(rule, 0, whole_seconds(retry_in_us), waiting_policy(rule, binding, retry_in_us))


def granted_items(
    requests: Sequence[tuple[Rule, RateLimiter, int]], grants: Sequence[Grant]
) -> list[Item] | None:
    """The items of the rules that granted a request: ``(rule, its limiter as the request's
    client sees it, permits)`` each, and its grant; None when a rule with several rates has
    none left, whose reset is read by :func:`read_granted_items` (a rule with one rate, or
    permits left, costs no read)."""
    items = []
    for (rule, _, _), grant in zip(requests, grants, strict=True):
        if grant.left <= 0 and len(rule.rates) > 1:
            return None
        items.append(granted_item(rule, grant.left, grant.binding))
    return items


async def read_granted_items(
    requests: Sequence[tuple[Rule, RateLimiter, int]], grants: Sequence[Grant]
) -> list[Item]:
    """:func:`granted_items`, reading when the next permit frees for each rule with several
    rates and none left: its reset."""
    items = [
        granted_item(rule, grant.left, grant.binding)
        for (rule, _, _), grant in zip(requests, grants, strict=True)
    ]
    asks = [
        (i, rule, limiter)
        for i, ((rule, limiter, _), grant) in enumerate(zip(requests, grants, strict=True))
        if grant.left <= 0 and len(rule.rates) > 1
    ]
    if asks:
        waits = await asyncio.gather(
            *(limiter.wait_time(1) for _, _, limiter in asks), return_exceptions=True
        )
        for (i, rule, _), wait in zip(asks, waits, strict=True):
            if isinstance(wait, float):  # a failed read: the fields are advice, keep them
                wait_us = micros_up(wait)
                policy = waiting_policy(rule, items[i].policy, wait_us)
                items[i] = Item(rule, 0, whole_seconds(wait_us), policy)
            elif not isinstance(wait, LimiterError):
                raise wait
    return items


def _sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 8941); rule names are printable ASCII."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.lru_cache(maxsize=1024)
def _policy_of(rule: Rule) -> tuple[bytes, tuple[str, ...]]:
    """A rule's ``RateLimit-Policy`` items, and its policies' names, as sent (the same for
    every response: worked out once per rule)."""
    named = rule.policies()
    policy = ", ".join(
        f"{_sf_string(name)};q={rate.permits};w={window(rate)}" for name, rate in named
    )
    return policy.encode(), tuple(_sf_string(name) for name, _ in named)


MAX_FIELD_ITEMS = 8
"""The most rules a response's RateLimit fields report: past it, the tightest (see
:func:`_tightness`), tightest first, so that many rules do not put kilobytes on every
response."""


def _tightness(item: Item) -> tuple[int, int]:
    """The most constraining rule sorts first: the fewest permits left, then the latest reset."""
    return (item.remaining, -item.reset)


def header_fields(items: Sequence[Item], legacy: bool) -> list[tuple[bytes, bytes]]:
    """The RateLimit fields for ``items`` (one per rule; the last one per rule counts), at
    most ``MAX_FIELD_ITEMS`` rules."""
    if not items:
        return []
    if len(items) > 1:
        by_rule = {}
        for item in items:
            by_rule[item.rule.name] = item
        if len(by_rule) < len(items):  # a rule twice: its place is its first, its item the last
            items = list(by_rule.values())
        if len(items) > MAX_FIELD_ITEMS:
            items = sorted(items, key=_tightness)[:MAX_FIELD_ITEMS]
    policies = []
    limits = []
    for rule, remaining, reset, policy in items:
        policy_field, names = _policy_of(rule)
        policies.append(policy_field)
        limits.append(f"{names[policy]};r={remaining};t={reset}")
    fields = [
        (b"ratelimit-policy", b", ".join(policies)),
        (b"ratelimit", ", ".join(limits).encode()),
    ]
    if legacy:  # the most constraining rule
        fields += _legacy_fields(min(items, key=_tightness))
    return fields


def _legacy_fields(tight: Item) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-ratelimit-limit", str(tight.rule.rates[tight.policy].permits).encode()),
        (b"x-ratelimit-remaining", str(tight.remaining).encode()),
        (b"x-ratelimit-reset", str(math.ceil(time.time()) + tight.reset).encode()),
    ]


def items_of(scope: Scope) -> list[Item]:
    items: list[Item] = scope.setdefault(_SCOPE_KEY, [])
    return items


# The names of the fields, as header_fields writes them.
_OURS = frozenset(
    (b"ratelimit-policy", b"ratelimit", b"x-ratelimit-limit", b"x-ratelimit-remaining",
     b"x-ratelimit-reset")
)  # fmt: skip


# The names of the draft's fields alone (header_fields without the legacy ones).
_DRAFT = frozenset((b"ratelimit-policy", b"ratelimit"))


def with_fields(message: Message, fields: list[tuple[bytes, bytes]]) -> Message:
    """The response start with our fields, and none of the same names the app set."""
    if not fields:
        return message
    ours = _OURS if len(fields) > 2 else _DRAFT
    kept = []
    for k, v in message.get("headers", ()):  # (a loop: no comprehension's frame to make)
        if k.lower() not in ours:
            kept.append((k, v))
    kept += fields
    return {**message, "headers": kept}
