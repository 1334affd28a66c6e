"""A budget's group and the registry of PER_CLIENT clients: which :class:`~._algorithm.Group`
an algorithm is (``GROUPS``, lib.lua's ``ALGORITHMS``), and the steps the scripts share over
the registry (registered.lua, refresh.lua, retire.lua's promises kept)."""

from __future__ import annotations

from ..._types import Algorithm, RateLimiterConfig, RateType
from ._algorithm import Group
from ._fixed_window import FixedWindow
from ._sliding import SlidingLog
from ._state import FOREVER, Config, Limiter, ms
from ._token_bucket import TokenBucket

__all__ = [
    "GROUPS",
    "extend_registry",
    "group_of",
    "keep_promises",
    "refresh_clients",
    "refresh_group",
    "register",
    "reservations",
    "state_in_config",
]

GROUPS: dict[Algorithm, type[Group]] = {
    Algorithm.SLIDING_WINDOW: SlidingLog,
    Algorithm.TOKEN_BUCKET: TokenBucket,
    Algorithm.FIXED_WINDOW: FixedWindow,
}
"""Each algorithm's group (lib.lua's ``ALGORITHMS``): what it is, where its state lives and
what new rates do to it are the group's, never a branch of the operations."""


def state_in_config(config: RateLimiterConfig) -> bool:
    """The budget's state lives in the config (on Redis the config hash's field ``state``,
    ``STATE_FIELD``), not under keys of its own: lib.lua's ``config.in_hash``."""
    return GROUPS[config.algorithm].state_in_config(config)


def group_of(
    limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool, now: int
) -> Group:
    """The budget ``key``'s group, as it stands at ``now`` (its expired parts dropped)."""
    group = GROUPS[config.algorithm]
    limiter.live(key, now)
    if group.logs_grants:  # (each rate's log under a key of its own)
        for i in range(2, len(config.rates) + 1):
            limiter.live((key, i), now)
    return group(limiter, config, key, write)


def keep_promises(limiter: Limiter, cleared: dict[str, int], now: int) -> None:
    """A PER_CLIENT reset (retire.lua): each client of the registry it cleared whose latest
    grant lies ahead starts its new budget with a grant of the new rate at that start."""
    stored = limiter.config
    assert stored is not None
    config = stored.config
    for client, latest in cleared.items():
        if latest > now:
            group = group_of(limiter, config, client, True, now)
            group.commit(config.max_permits, latest)
            ttl = group.save(limiter, now)
            limiter.register(client, latest)
            extend_registry(limiter, now + ttl + ms(config.longest_us), stored.deadline)


def reservations(limiter: Limiter, now: int) -> tuple[int, int] | None:
    """An OVERALL budget's reservations that have not started: (permits, latest start)."""
    assert limiter.config is not None
    config = limiter.config.config
    if config.rate_type is not RateType.OVERALL:
        return None
    if limiter.config.clock is not None:
        now = max(now, limiter.config.clock)
    return group_of(limiter, config, None, False, now).queued(now)


def extend_registry(limiter: Limiter, until: float, deadline: int | None) -> None:
    """The registry lives at least ``until``, never past ``deadline``."""
    if deadline is not None:
        until = min(until, deadline)
    if limiter.registry_expires_at == FOREVER or limiter.registry_expires_at < until:
        limiter.registry_expires_at = until


def register(limiter: Limiter, key: str | None, now: int, ttl: int) -> None:
    """registered.lua: a PER_CLIENT client whose state settle or sync wrote (``ttl`` > 0)
    is noted in the registry, as a grant at ``now``."""
    stored = limiter.config
    if key is None or ttl <= 0 or stored is None:
        return
    longest = stored.config.longest_us
    limiter.register(key, now)
    limiter.unregister_before(now - 2 * longest)
    extend_registry(limiter, now + ttl + ms(longest), stored.deadline)


def refresh_group(limiter: Limiter, key: str | None, now: int) -> int:
    """refresh_group: one budget's keys get the TTLs the config gives them; the longest, in
    us (0: no state, or state kept in the config, which lives as long)."""
    assert limiter.config is not None
    if state_in_config(limiter.config.config):
        return 0
    group = group_of(limiter, limiter.config.config, key, True, now)
    if group.fresh:
        return 0
    group.keep()
    return group.save(limiter, now)


def refresh_clients(limiter: Limiter, stored: Config, now: int) -> None:
    """refresh.lua over every client of the registry: TTLs as the config gives them."""
    longest = stored.config.longest_us
    for client in list(limiter.registry):
        ttl = refresh_group(limiter, client, now)
        if ttl:
            extend_registry(limiter, now + ttl + ms(longest), stored.deadline)
