"""The key layout: every key of one limiter, under one hash tag (docs/redis-layout.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from ..._types import RateType
from ..._values import check_text

__all__ = ["Keys", "Recent", "escape_tag"]

_K = TypeVar("_K")
_V = TypeVar("_V")
REMEMBERED = 10_000  # limiters a backend keeps keys and rate types of


class Recent(dict[_K, _V]):
    """A dict that forgets its oldest entry (dicts keep insertion order) once it holds
    REMEMBERED: a process may use any number of limiter names over its life, and what is
    kept per name is only a cache."""

    __slots__ = ()

    def __setitem__(self, key: _K, value: _V) -> None:
        if len(self) >= REMEMBERED and key not in self:
            del self[next(iter(self))]
        super().__setitem__(key, value)


def escape_tag(name: str) -> str:
    """``name`` as it stands inside the hash tag ``{...}``."""
    # Braces would end or nest the hash tag; '%' is escaped so the mapping stays one-to-one.
    # NUL (only in shard names) is escaped to keep keys readable: "{api%00shard0}".
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace("\x00", "%00")


class Keys:
    """Every key of one limiter; all share the hash tag ``{<name>}``, hence one cluster slot."""

    __slots__ = (
        "_budgets",
        "config",
        "learned",
        "permits",
        "receipts",
        "registry",
        "tag",
        "value",
    )

    def __init__(self, prefix: str, name: str) -> None:
        # A name that does not encode fails here, in its caller's call, never in a round trip
        # it would share with others.
        self.tag = f"{prefix}{{{escape_tag(check_text(name, 'name'))}}}"
        self.config = f"{self.tag}:config"
        self.value = f"{self.tag}:value"
        self.permits = f"{self.tag}:permits"
        self.registry = f"{self.tag}:clients"
        self.receipts = f"{self.tag}:released"  # releases that must not run twice
        self.learned = f"{self.tag}:learn"  # the learned rate (learn.lua)
        # Encoded once: the hot path hands redis-py bytes it need not encode again.
        self._budgets: dict[tuple[RateType, str, bool], tuple[bytes, ...]] = {}

    def client_value(self, client_id: str) -> str:
        return f"{self.value}:{client_id}"

    def client_permits(self, client_id: str) -> str:
        return f"{self.permits}:{client_id}"

    def budget(
        self, rate_type: RateType, client_id: str, registry: bool = False
    ) -> tuple[bytes, ...]:
        """The keys of one budget: config, value, permits (and the registry, if asked)."""
        keys = self._budgets.get((rate_type, client_id, registry))
        if keys is None:
            if rate_type is RateType.PER_CLIENT:
                names = [self.config, self.client_value(client_id), self.client_permits(client_id)]
                names += [self.registry] if registry else []
            else:
                names = [self.config, self.value, self.permits]
            keys = tuple(name.encode() for name in names)
            if len(self._budgets) < 8:
                self._budgets[(rate_type, client_id, registry)] = keys
        return keys

    def for_rate(self, key: str, i: int) -> str:
        """The key of rate ``i`` (1: the first) of a sliding window's budget key, as lib.lua's
        ``rate_key`` names it: ``<tag>:value:<client>`` -> ``<tag>:value2:<client>``."""
        if i == 1:
            return key
        base, colon, client = key[len(self.tag) + 1 :].partition(":")
        return f"{self.tag}:{base}{i}{colon}{client}"

    def retired(self, token: str) -> str:
        """Where the clients registry goes when every client's state is cleared."""
        return f"{self.tag}:retired:{token}"

    def clients(self, client_ids: Sequence[str]) -> list[str]:
        """The value key and permits ZSET of each client, in order."""
        keys = []
        for client in client_ids:
            keys += [self.client_value(client), self.client_permits(client)]
        return keys
