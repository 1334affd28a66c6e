"""Learning a limiter's rate in memory: learn.lua, step for step, in Python (the law itself is
``backends._learning``, which both follow)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Protocol

from ..._types import Rate, RateLimiterConfig, RateType
from ...errors import InvalidArgumentError, NotConfiguredError
from .._learning import (
    LEARN_TTL,
    Event,
    Law,
    Learned,
    LearnState,
    decide,
    fresh,
    rates_of,
)
from .._margin import widened_rates
from ._budgets import group_of
from ._state import Limiter

__all__ = ["LearnTable", "MemoryLearning", "rerate"]


@dataclass(eq=False)
class LearnTable:
    """The learned states by limiter name (the ``<tag>:learn`` hashes). Like Redis's, they
    outlive a deleted limiter; a config replaced meanwhile starts learning again."""

    states: dict[str, LearnState] = field(default_factory=dict)


class HoldsLearning(Protocol):
    """Where a store keeps its learned states and limiters (``_store.Store``)."""

    learning: LearnTable

    def limiter(self, name: str, now: int) -> Limiter | None: ...


class MemoryLearning:
    """The learn operation of :class:`~aiolimit.MemoryBackend`."""

    __slots__ = ()

    _shared: HoldsLearning  # (MemoryBackend's store)

    def _now(self) -> int:
        raise NotImplementedError  # (MemoryBackend's clock)

    async def learn(
        self,
        name: str,
        event: Event,
        value: int | None,
        per: int | None,
        ceiling: tuple[Rate, ...] | None,
        law: Law,
    ) -> Learned:
        now = self._now()
        limiter = self._shared.limiter(name, now)
        if limiter is None or limiter.config is None:
            raise NotConfiguredError(name)
        stored = limiter.config
        if stored.clock is not None and now < stored.clock:
            now = stored.clock
        config = stored.exact or stored.config  # (as stored: before the fleet's margin)
        states = self._shared.learning.states
        state = states.get(name)
        if state is not None and state.expires_at <= now:
            state = None
        top = ceiling or (state.ceiling if state is not None else config.rates)
        _check_shape(top, config.rates)
        if state is None or state.ceiling != top or rates_of(top, state.permits) != config.rates:
            state = fresh(top, config.rates[0].permits, law, now)
        changed = decide(state, event, value, per, law, now, _left(limiter, event, now))
        state.expires_at = now + LEARN_TTL
        states[name] = state
        wanted = rates_of(top, state.permits)
        if wanted != config.rates:
            relearn(limiter, config, wanted, now)
            changed = True
        return Learned(
            state.permits,
            top[0].permits,
            top[0].interval_us,
            changed,
            state.cut_at,
            state.good,
            state.bad,
            state.hold,
            state.stated,
            state.grown_at,
        )

    async def learned(self, name: str) -> tuple[Rate, ...] | None:
        """The ceiling of the limiter's learned state (None: none)."""
        state = self._shared.learning.states.get(name)
        if state is None or state.expires_at <= self._now():
            return None
        return state.ceiling


def _left(limiter: Limiter, event: Event, now: int) -> int | None:
    """What an OVERALL budget has left now, for a success (None: not needed, or PER_CLIENT)."""
    stored = limiter.config
    assert stored is not None
    if event != "succeeded" or stored.config.rate_type is not RateType.OVERALL:
        return None
    group = group_of(limiter, stored.config, None, False, now)
    group.reclaim(now)
    return group.left(now)[0]


def _check_shape(ceiling: tuple[Rate, ...], rates: tuple[Rate, ...]) -> None:
    if [r.interval for r in ceiling] != [r.interval for r in rates]:
        raise InvalidArgumentError(
            f"the ceiling's intervals ({', '.join(map(str, ceiling))}) are not the stored "
            f"config's ({', '.join(map(str, rates))}): set the rate to the ceiling first"
        )


def relearn(limiter: Limiter, exact: RateLimiterConfig, rates: tuple[Rate, ...], now: int) -> None:
    """The learned ``rates`` in force: the exact config's rates, read widened by the fleet's
    margin where it has one (memory/_margin.py), as the rates they replace were."""
    stored = limiter.config
    assert stored is not None
    if stored.margin is None:
        rerate(limiter, rates, now)
        return
    stored.exact = _with_rates(exact, rates)
    rerate(limiter, widened_rates(rates, stored.margin), now)


def _with_rates(config: RateLimiterConfig, rates: tuple[Rate, ...]) -> RateLimiterConfig:
    return RateLimiterConfig(
        config.rate_type,
        keep_alive=config.keep_alive,
        rates=rates,
        algorithm=config.algorithm,
        min_spacing=config.min_spacing,
        max_debt=config.max_debt,
    )


def rerate(limiter: Limiter, rates: tuple[Rate, ...], now: int) -> None:
    """The config's rates rewritten as ``set_rate(..., keep_state=True)`` would, its other
    fields (a block, a TTL, the clock) kept: grants made stay counted."""
    stored = limiter.config
    assert stored is not None
    old = copy.copy(stored)
    config = stored.config = _with_rates(stored.config, rates)
    if stored.clock is None or stored.clock < now:
        stored.clock = now
    group = group_of(limiter, config, None, True, now)
    group.reclaim(now)
    group.rates_changed(limiter, old, now)
    group.keep()
    if not group.fresh:
        group.save(limiter, now)
