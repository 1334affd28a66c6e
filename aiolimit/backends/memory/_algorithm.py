"""The one protocol every algorithm of the memory backend follows (lib.lua's ``ALGORITHMS``
table in the scripts): a :class:`Group` is one budget's state under every rate of its
config, loaded for one operation. The operations (``MemoryBackend``) call only these
methods, so adding an algorithm is one module with a ``Group`` subclass, registered in
``GROUPS`` (``_budgets.py``), and its Lua file."""

from __future__ import annotations

import abc
from typing import ClassVar

from ..._types import RateLimiterConfig, RateType
from ._state import Config, Limiter


class Group(abc.ABC):
    """One budget (the whole limiter for OVERALL, one client for PER_CLIENT) under every rate.

    Made with ``write`` for operations that change the state; without it nothing stored is
    changed (``reclaim`` counts what has left the window as gone without removing it)."""

    __slots__ = ("blocked_until", "config", "fresh", "key", "write")

    idempotent: ClassVar[bool] = False
    """Handing back one grant twice returns it once by the state alone (no receipt needed)."""
    in_hash: ClassVar[bool] = False
    """An OVERALL budget keeps its state in its config (on Redis the config hash's field
    ``state``: lib.lua's ``in_hash``), not under keys of its own."""
    fixed_edges: ClassVar[bool] = False
    """Its windows start at fixed edges, which a measured margin would move: it keeps none
    (``_margin.py``; margin.lua)."""
    logs_grants: ClassVar[bool] = False
    """The budget is a log of grants per rate, each rate's under a key of its own (on Redis a
    value key and a permits ZSET per rate), whose grants and reservations can be counted;
    else a few numbers in one value."""

    def __init__(
        self, limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool
    ) -> None:
        assert limiter.config is not None
        self.config, self.key, self.write = config, key, write
        self.blocked_until = limiter.config.blocked_until
        self.fresh = True
        """No state is stored for the budget: every rate allows its full count."""

    @classmethod
    def state_in_config(cls, config: RateLimiterConfig) -> bool:
        """The budget's state lives in the config (``config.in_hash`` in lib.lua)."""
        return cls.in_hash and config.rate_type is RateType.OVERALL

    def rates_changed(self, limiter: Limiter, old: Config, now: int) -> bool:
        """set_rate with keep_state, once reclaimed: what the new rates do to the state kept
        (``old``: the config replaced); whether every PER_CLIENT client's state must now
        live longer than its TTL says, though no interval grew (refresh.lua gives them the
        TTLs the new config gives). Nothing by default: the state follows the new rates at
        its next grant, and lives as long."""
        return False

    @abc.abstractmethod
    def reclaim(self, now: int) -> None:
        """Forgets the grants that no longer count at ``now`` (a sliding window's expired log
        entries; the counters have none). Called before the other methods."""

    @abc.abstractmethod
    def left(self, now: int) -> tuple[int, int]:
        """Permits a request could take at ``now`` (negative while reservations are queued),
        and the rate that has the fewest left (its place in the config's rates; the first of
        several such)."""

    @abc.abstractmethod
    def start(self, permits: int, now: int) -> int | None:
        """The earliest time at which every rate allows ``permits`` (spacing and blocks
        aside); None when the log would hold more than ``MAX_EXACT`` permits."""

    @abc.abstractmethod
    def latest(self) -> int | None:
        """The latest grant's start, where a spacing or several rates need it (None: none)."""

    @abc.abstractmethod
    def commit(self, permits: int, start: int) -> str:
        """Takes ``permits`` at ``start`` in every rate; returns the grant's member."""

    @abc.abstractmethod
    def keep(self) -> None:
        """Marks every stored part as changed, so that ``save`` writes it back with the TTL
        the current config gives it."""

    @abc.abstractmethod
    def save(self, limiter: Limiter, now: int) -> int:
        """Writes back what changed; returns the longest TTL given, in us (0: gone)."""

    @abc.abstractmethod
    def release(self, wanted: int, member: str | None, now: int) -> int:
        """Hands back ``wanted`` permits (or exactly the grant ``member``); returns how many."""

    @abc.abstractmethod
    def queued(self, now: int) -> tuple[int, int] | None:
        """The permits reserved to start after ``now`` (at least; of the rate that has the
        most) and the latest such start, or None: what a reset must not forget."""

    def earliest(self, permits: int, now: int) -> int | None:
        """The earliest start (>= now) at which every rate, the spacing and any block allow
        ``permits``; None as for ``start``."""
        start = self.start(permits, now)
        if start is None:
            return None
        last = self.latest()
        if last is not None:
            start = max(start, last + self.config.min_spacing_us)
        if self.blocked_until is not None:
            start = max(start, self.blocked_until)
        return start

    # -- settle and sync (settle.lua, sync.lua); a group that lacks them cannot settle --------

    def shrink(self, member: str, wanted: int, now: int) -> tuple[int, str]:
        """The grant ``member`` counts ``wanted`` permits fewer: what of them still counts
        goes back. ``(permits handed back, the grant's member from now on)``."""
        raise NotImplementedError(f"{type(self).__name__} cannot settle a grant")

    def room(self, now: int) -> int:
        """The fewest permits left under any rate, less every permit reserved ahead: what a
        debt is measured from."""
        return self.left(now)[0]

    def charge(self, member: str, extra: int, now: int) -> str:
        """The grant ``member`` counts ``extra`` permits more, taken at ``now`` whatever is
        free (the caller bounds the debt); the grant's member from now on."""
        raise NotImplementedError(f"{type(self).__name__} cannot settle a grant")

    def sync(self, remaining: int, reset_us: int, now: int) -> None:
        """From ``now`` until ``now + reset_us`` every rate allows at most ``remaining`` more
        permits (a sliding window and fixed windows: for at most one interval)."""
        raise NotImplementedError(f"{type(self).__name__} cannot sync")
