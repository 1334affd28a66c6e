"""The set-rate family every limiter has (``try_set_rate``, ``set_rate``, ``ensure_rate``,
``update_rate``, ``get_config``), over a limiter's sub-limiter names: one for
``RateLimiter``, one per shard for ``ShardedRateLimiter`` (``_configs`` splits the config).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import replace
from typing import TypeVar

from ._breaker import Breaker
from ._code_config import CodeConfig
from ._types import Algorithm, Duration, Rate, RateLimiterConfig, Rates, RateType
from .backends.base import Backend, SetMode
from .errors import InvalidArgumentError

__all__ = ["_RateSetting", "gather", "rate_given"]

log = logging.getLogger("aiolimit")

_T = TypeVar("_T")

# Configs try_set_rate found different from the one asked for, each warned about once (the
# most recent few hundred: a process that sets many names does not grow it without end).
_warned: dict[tuple[str, RateLimiterConfig, RateLimiterConfig], None] = {}
_WARNED_MOST = 256


class _RateSetting:
    """The set-rate methods of a limiter with a ``name``, a ``backend``, a ``breaker``, its
    ``rate_in_code`` and its sub-limiter ``_names``."""

    __slots__ = ()

    name: str
    backend: Backend
    breaker: Breaker
    rate_in_code: CodeConfig[RateLimiterConfig]
    _names: list[str]

    # -- configuration -------------------------------------------------------------------------

    def _configs(self, config: RateLimiterConfig) -> list[RateLimiterConfig]:
        """The config of each sub-limiter."""
        return [config]

    async def _set(
        self,
        mode: SetMode,
        config: RateLimiterConfig,
        keep_state: bool,
    ) -> list[bool]:
        configs = self._configs(config)
        return await self.breaker.guard(
            gather(
                self.backend.set_rate(name, sub, mode, keep_state)
                for name, sub in zip(self._names, configs, strict=True)
            )
        )

    async def try_set_rate(
        self,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        margin: Duration | None = None,
        keep_alive: Duration | None = None,
        max_debt: int | None = None,
    ) -> bool:
        """Sets the rate only where the limiter has none; returns whether it did.

        ``rate`` is an int with its ``interval``, or a sequence of :class:`Rate` (every one
        must allow a grant; :meth:`Rate.parse` reads them from text) without one.
        ``min_spacing`` keeps the starts of consecutive grants at least that far apart (a
        :class:`ShardedRateLimiter` refuses it: its shards cannot share one spacing).
        ``max_debt``: how far below zero a settle may charge (default: the smallest rate's
        permits; docs: Token budgets).

        When a stored config differs from the one asked for (another process, or an earlier
        run, set another rate), it stays, and a warning is logged once per process."""
        asked = RateLimiterConfig.build(
            rate_type,
            rate,
            interval,
            keep_alive,
            algorithm=algorithm,
            min_spacing=min_spacing,
            margin=margin,
            max_debt=max_debt,
        )
        written = await self._set("try", asked, True)
        if not all(written):
            stored = await self.get_config()
            if stored is not None and stored != asked and (seen := (self.name, asked, stored)):
                if seen in _warned:
                    return any(written)
                if len(_warned) >= _WARNED_MOST:
                    del _warned[next(iter(_warned))]  # the oldest
                _warned[seen] = None
                log.warning(
                    "try_set_rate(%r): kept the stored config %s, not %s (set_rate replaces it)",
                    self.name,
                    stored,
                    asked,
                )
        return any(written)

    async def set_rate(
        self,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        margin: Duration | None = None,
        keep_alive: Duration | None = None,
        max_debt: int | None = None,
        keep_state: bool = True,
    ) -> None:
        """Sets the rate (as :meth:`try_set_rate` takes it), replacing any config. What was
        granted keeps counting; ``keep_state=False`` restarts every budget full (a change of
        rate type or algorithm always starts afresh)."""
        config = RateLimiterConfig.build(
            rate_type,
            rate,
            interval,
            keep_alive,
            algorithm=algorithm,
            min_spacing=min_spacing,
            margin=margin,
            max_debt=max_debt,
        )
        await self._set("set", config, keep_state)

    async def ensure_rate(
        self,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        margin: Duration | None = None,
        keep_alive: Duration | None = None,
        max_debt: int | None = None,
    ) -> bool:
        """Makes sure the stored config is this one: writes it where there is none, and
        rewrites a stored one that differs, keeping what was granted (as :meth:`set_rate`
        does); returns whether it wrote. For code that owns its limits (the
        ASGI middleware's rules): an unchanged config costs two reads, no write.

        The rate is the code's from then on, as a ``rate=`` given at construction is: when
        a call finds the store without a config (a ``keep_alive`` that ran out, a restart,
        ``FLUSHALL``), this limiter and its views write it again first."""
        asked = RateLimiterConfig.build(
            rate_type,
            rate,
            interval,
            keep_alive,
            algorithm=algorithm,
            min_spacing=min_spacing,
            margin=margin,
            max_debt=max_debt,
        )
        wrote = await self._ensure(asked)
        self.rate_in_code.given(asked)
        return wrote

    async def _ensure(self, asked: RateLimiterConfig) -> bool:
        if all(await self._set("try", asked, True)):
            return True
        stored = await self.get_config()
        if stored == asked or await self._learned_from(asked, stored):
            return False
        log.info("rate limiter %r: writing the config the code gives: %s", self.name, asked)
        await self._set("set", asked, True)
        return True

    async def _learned_from(
        self, asked: RateLimiterConfig, stored: RateLimiterConfig | None
    ) -> bool:
        """Whether ``stored`` is a rate learned under the ceiling ``asked`` (a Learner's):
        then it is the rate in force, which ``ensure_rate`` leaves alone."""
        if stored is None or replace(stored, rates=asked.rates) != asked:
            return False
        ceilings = await gather(self.backend.learned(name) for name in self._names)
        return all(
            ceiling == sub.rates
            for ceiling, sub in zip(ceilings, self._configs(asked), strict=True)
        )

    async def _write_config(self, config: RateLimiterConfig, replace: bool) -> None:
        """The rate in code written (:class:`CodeConfig`'s write): at first use as
        :meth:`ensure_rate` writes it, after a loss only where none is stored."""
        if replace:
            await self._ensure(config)
        else:
            await self._set("try", config, True)

    async def update_rate(
        self,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        margin: Duration | None = None,
        keep_alive: Duration | None = None,
        max_debt: int | None = None,
        keep_state: bool = True,
    ) -> bool:
        """Like :meth:`set_rate` (what was granted keeps counting; ``keep_state=False``
        restarts every budget full), but only when a config exists (returns False otherwise)."""
        config = RateLimiterConfig.build(
            rate_type,
            rate,
            interval,
            keep_alive,
            algorithm=algorithm,
            min_spacing=min_spacing,
            margin=margin,
            max_debt=max_debt,
        )
        return all(await self._set("update", config, keep_state))

    async def get_config(self) -> RateLimiterConfig | None:
        """The limiter's config (for a sharded one, the shards' rates summed); None unless it
        has one."""
        calls = gather(self.backend.get_config(name) for name in self._names)
        configs = await self.breaker.guard(calls)
        if any(config is None for config in configs):
            return None
        first = configs[0]
        assert first is not None
        if len(configs) == 1:
            return first
        rates = tuple(
            Rate(sum(c.rates[i].permits for c in configs if c is not None), rate.interval)
            for i, rate in enumerate(first.rates)
        )
        debts = [c.max_debt for c in configs if c is not None and c.max_debt is not None]
        return replace(first, rates=rates, max_debt=sum(debts) if debts else None)


async def gather(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    """The calls' results, run together."""
    return list(await asyncio.gather(*calls))


def rate_given(
    rate: Rates | None,
    interval: Duration | None,
    rate_type: RateType | str | None,
    algorithm: Algorithm | str | None,
    min_spacing: Duration | None,
    keep_alive: Duration | None,
    margin: Duration | None = None,
    max_debt: int | None = None,
) -> RateLimiterConfig | None:
    """A limiter constructor's rate arguments, checked, as the config they make; None without
    a ``rate``."""
    if rate is None:
        given = {
            "interval": interval,
            "rate_type": rate_type,
            "algorithm": algorithm,
            "min_spacing": min_spacing,
            "keep_alive": keep_alive,
            "margin": margin,
            "max_debt": max_debt,
        }
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise InvalidArgumentError(f"{', '.join(named)} go with rate=, which is missing")
        return None
    return RateLimiterConfig.build(
        RateType.OVERALL if rate_type is None else rate_type,
        rate,
        interval,
        keep_alive,
        algorithm=Algorithm.SLIDING_WINDOW if algorithm is None else algorithm,
        min_spacing=min_spacing,
        margin=margin,
        max_debt=max_debt,
    )
