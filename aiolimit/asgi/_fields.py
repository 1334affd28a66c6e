"""The header fields of draft-ietf-httpapi-ratelimit-headers, and the legacy X-RateLimit ones.

``RateLimit-Policy: "api-per-client";q=10;w=1`` and ``RateLimit: "api-per-client";r=0;t=1``:
what every rule that applied to a request says about it, gathered in the request's scope so a
middleware and any dependencies inside it write one set of fields together.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

from ._rules import Rule, window
from ._types import Message, Scope

__all__ = ["Item", "header_fields", "items_of", "with_fields"]

# Where the rate limit items of a request gather.
_SCOPE_KEY = "aiolimit.rate_limits"


class Item(NamedTuple):
    """What a request's response says about one rule."""

    rule: Rule
    remaining: int
    reset: int  # whole seconds


def _sf_string(text: str) -> str:
    """``text`` as a Structured Field string (RFC 8941); rule names are printable ASCII."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@functools.lru_cache(maxsize=1024)
def _policy_of(rule: Rule) -> tuple[str, str]:
    """A rule's ``RateLimit-Policy`` items, and its first policy's name, as sent (the same
    for every response: worked out once per rule)."""
    named = rule.policies()
    policy = ", ".join(
        f"{_sf_string(name)};q={rate.permits};w={window(rate)}" for name, rate in named
    )
    return policy, _sf_string(named[0][0])


def header_fields(items: Sequence[Item], legacy: bool) -> list[tuple[bytes, bytes]]:
    """The RateLimit fields for ``items`` (one per rule; the last one per rule counts)."""
    by_rule = {item.rule.name: item for item in items}
    if not by_rule:
        return []
    policies = []
    limits = []
    for item in by_rule.values():
        policy, first = _policy_of(item.rule)
        policies.append(policy)
        limits.append(f"{first};r={item.remaining};t={item.reset}")
    fields = [
        (b"ratelimit-policy", ", ".join(policies).encode()),
        (b"ratelimit", ", ".join(limits).encode()),
    ]
    if legacy:  # the most constraining rule: the fewest permits left, then the latest reset
        tight = min(by_rule.values(), key=lambda item: (item.remaining, -item.reset))
        fields += [
            (b"x-ratelimit-limit", str(tight.rule.rates[0].permits).encode()),
            (b"x-ratelimit-remaining", str(tight.remaining).encode()),
            (b"x-ratelimit-reset", str(math.ceil(time.time()) + tight.reset).encode()),
        ]
    return fields


def items_of(scope: Scope) -> list[Item]:
    items: list[Item] = scope.setdefault(_SCOPE_KEY, [])
    return items


def with_fields(message: Message, fields: list[tuple[bytes, bytes]]) -> Message:
    """The response start with our fields, and none of the same names the app set."""
    if not fields:
        return message
    ours = {name for name, _ in fields}
    kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in ours]
    return {**message, "headers": [*kept, *fields]}
