"""A ``ShardedRateLimiter`` as ``aiolimit inspect`` and ``list`` read it: each shard read as
a limiter of its own (``reading.inspect_limiter``), and what adds up summed over the shards:
the rates, the permits available, the grants and reservations of a log, the memory.

>>> found = (await limiters(backend, "search"))[0]       # glob.py: a Found, sharded
>>> snapshot = await inspect_sharded(backend, found)
>>> snapshot.config, snapshot.available                  # the shards' summed
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..._types import Rate, RateLimiterConfig
from ...backends.redis import RedisBackend
from .glob import Found
from .reading import Budget, Snapshot, add_reservations, budget_json, config_json, inspect_limiter

__all__ = ["ShardedSnapshot", "inspect_sharded", "summed"]


def summed(configs: Sequence[RateLimiterConfig]) -> RateLimiterConfig | None:
    """The config the shards' configs make together: each rate's permits (and the
    ``max_debt``) summed, as ``ShardedRateLimiter`` split them; None when they differ in
    anything else (a change applied to some shards only)."""
    first = configs[0]
    shape = _shape(first)
    if any(_shape(config) != shape for config in configs[1:]):
        return None
    rates = tuple(
        Rate(sum(config.rates[i].permits for config in configs), rate.interval)
        for i, rate in enumerate(first.rates)
    )
    debts = [config.max_debt for config in configs]
    debt = None if None in debts else sum(d for d in debts if d is not None)
    return replace(first, rates=rates, max_debt=debt)


def _shape(config: RateLimiterConfig) -> tuple[Any, ...]:
    """What every shard's config shares: all but the permits of each rate and the debt."""
    return (
        config.rate_type,
        config.algorithm,
        config.keep_alive,
        config.min_spacing,
        tuple(rate.interval for rate in config.rates),
    )


@dataclass
class ShardedSnapshot:
    """What ``inspect`` shows of a sharded limiter: its shards that have a config."""

    name: str
    shards: list[Snapshot]
    config: RateLimiterConfig | None
    """The shards' configs summed (:func:`summed`); None when they differ."""

    @property
    def available(self) -> int | None:
        """Permits available, summed over the shards (though one request is served by one
        shard); None for PER_CLIENT (each client its own)."""
        each = [shard.available for shard in self.shards]
        return None if None in each else sum(a for a in each if a is not None)

    @property
    def blocked_s(self) -> float | None:
        """The longest block left of a shard (None: none is blocked)."""
        return max((s.blocked_s for s in self.shards if s.blocked_s is not None), default=None)

    @property
    def budget(self) -> Budget:
        """The shards' grants and reservations, summed."""
        total = Budget()
        for shard in self.shards:
            total.grants += shard.budget.grants
            add_reservations(total.reservations, shard.budget.reservations)
        return total

    @property
    def keeps_a_log(self) -> bool:
        return all(shard.keeps_a_log for shard in self.shards)

    @property
    def memory(self) -> tuple[int | None, int]:
        """MEMORY USAGE summed over every shard's keys read, and how many (None: refused)."""
        used = [shard.memory_bytes for shard in self.shards]
        keys = sum(shard.memory_keys for shard in self.shards)
        return (None if None in used else sum(u for u in used if u is not None)), keys

    def as_json(self) -> dict[str, Any]:
        """What ``inspect --json`` prints: the sums, then each shard as a limiter."""
        config = self.config
        shown_json: dict[str, Any] = {
            "name": self.name,
            "config": None if config is None else config_json(config),
            "available": self.available,
            "blocked_s": self.blocked_s,
        }
        if self.keeps_a_log:
            shown_json.update(budget_json(self.budget))
        memory, keys = self.memory
        shown_json["memory"] = {"bytes": memory, "keys": keys}
        shown_json["shards"] = [shard.as_json() for shard in self.shards]
        return shown_json


async def inspect_sharded(backend: RedisBackend, found: Found) -> ShardedSnapshot | None:
    """Every shard of ``found`` read; None when none has a config any more."""
    read = await asyncio.gather(*(inspect_limiter(backend, stored) for stored in found.stored))
    shards = [shard for shard in read if shard is not None]
    if not shards:
        return None
    return ShardedSnapshot(found.name, shards, summed([shard.config for shard in shards]))
