"""The fleet's measured margin in memory: margin.lua, step for step, in Python (the law
itself is ``backends._margin``, which both follow)."""

from __future__ import annotations

from typing import Protocol

from ..._types import RateType
from ...errors import NotConfiguredError
from .. import _margin
from .._margin import next_margin, widened_rates
from ._budgets import GROUPS
from ._learn import rerate
from ._state import Limiter

__all__ = ["MemoryMargin"]


class HoldsLimiters(Protocol):
    """Where a store keeps its limiters (``_store.Store``)."""

    def limiter(self, name: str, now: int) -> Limiter | None: ...


class MemoryMargin:
    """The margin operation of :class:`~aiolimit.MemoryBackend`."""

    __slots__ = ()

    _shared: HoldsLimiters  # (MemoryBackend's store)

    def _now(self) -> int:
        raise NotImplementedError  # (MemoryBackend's clock)

    async def margin(self, name: str, late_us: int | None) -> int:
        now = self._now()
        limiter = self._shared.limiter(name, now)
        if limiter is None or limiter.config is None:
            raise NotConfiguredError(name)
        stored = limiter.config
        if stored.clock is not None and now < stored.clock:
            now = stored.clock
        exact = stored.exact or stored.config
        if exact.rate_type is not RateType.OVERALL or GROUPS[exact.algorithm].fixed_edges:
            return 0  # (a client's budget, or windows that would move: none kept)
        margin, at = next_margin(
            stored.margin, stored.margin_at, late_us, now, exact.rates, _margin.LAW
        )
        if stored.margin is None and margin == 0:
            return 0  # (none, and none to keep: nothing written)
        before = stored.margin or 0
        stored.margin, stored.margin_at, stored.exact = margin, at, exact
        if margin != before:
            rerate(limiter, widened_rates(exact.rates, margin), now)
        return margin
