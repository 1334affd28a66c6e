"""The set-rate family every limiter has (``try_set_rate``, ``set_rate``, ``ensure_rate``,
``update_rate``, ``get_config``), over a limiter's sub-limiter names: one for
``RateLimiter``, one per shard for ``ShardedRateLimiter`` (``_configs`` splits the config).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from ._breaker import Breaker
from ._code_config import CodeConfig
from ._deprecated import deprecated
from ._types import Rate, RateLimiterConfig, RateType, shown
from .backends.base import Backend, SetMode
from .errors import InvalidArgumentError

__all__ = ["_RateSetting", "config_of", "config_value", "gather", "rate_in_code"]

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
        self, config: RateLimiterConfig | str, *legacy: Any, **legacy_options: Any
    ) -> bool:
        """Sets the rate only where the limiter has none; returns whether it did.

        >>> await limiter.try_set_rate("10/second; 100/minute")
        >>> await limiter.try_set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, "5/second"))

        ``config`` is a :class:`RateLimiterConfig` or its text (:meth:`RateLimiterConfig.parse`:
        the rates, every one of which must allow a grant, and the rate type, algorithm,
        ``min_spacing``, ``keep_alive``, ``margin`` and ``max_debt`` where not the default).
        A :class:`ShardedRateLimiter` refuses a ``min_spacing``: its shards cannot share one.

        When a stored config differs from the one asked for (another process, or an earlier
        run, set another rate), it stays, and a warning is logged once per process.

        The loose arguments of earlier releases (``rate_type, rate, interval``,
        ``algorithm=``, ...) still work, with a DeprecationWarning: give
        ``RateLimiterConfig.build(rate_type, rate, interval, ...)`` instead."""
        asked = config_of(config, legacy, legacy_options, "try_set_rate")
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
                    "try_set_rate(%r): kept the stored config %r, not %r (set_rate replaces it)",
                    self.name,
                    str(stored),
                    str(asked),
                )
        return any(written)

    async def set_rate(
        self,
        config: RateLimiterConfig | str,
        *legacy: Any,
        keep_state: bool = True,
        **legacy_options: Any,
    ) -> None:
        """Sets the rate (``config`` as :meth:`try_set_rate` takes it), replacing any config.
        What was granted keeps counting; ``keep_state=False`` restarts every budget full (a
        change of rate type or algorithm always starts afresh)."""
        await self._set("set", config_of(config, legacy, legacy_options, "set_rate"), keep_state)

    async def ensure_rate(
        self, config: RateLimiterConfig | str, *legacy: Any, **legacy_options: Any
    ) -> bool:
        """Makes sure the stored config is ``config`` (as :meth:`try_set_rate` takes it):
        writes it where there is none, and rewrites a stored one that differs, keeping what
        was granted (as :meth:`set_rate` does); returns whether it wrote. For code that owns
        its limits (the ASGI middleware's rules): an unchanged config costs two reads, no
        write.

        The rate is the code's from then on, as a ``rate=`` given at construction is: when
        a call finds the store without a config (a ``keep_alive`` that ran out, a restart,
        ``FLUSHALL``), this limiter and its views write it again first."""
        asked = config_of(config, legacy, legacy_options, "ensure_rate")
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
        config: RateLimiterConfig | str,
        *legacy: Any,
        keep_state: bool = True,
        **legacy_options: Any,
    ) -> bool:
        """Like :meth:`set_rate` (what was granted keeps counting; ``keep_state=False``
        restarts every budget full), but only when a config exists (returns False otherwise)."""
        asked = config_of(config, legacy, legacy_options, "update_rate")
        return all(await self._set("update", asked, keep_state))

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


def config_of(
    config: Any, legacy: tuple[Any, ...], options: dict[str, Any], method: str
) -> RateLimiterConfig:
    """The config a set-rate call gives: ``config`` (a :class:`RateLimiterConfig`, or its
    text). With ``legacy`` arguments or ``options``, ``config`` is a rate type and they the
    loose arguments of earlier releases (``rate, interval``, ``algorithm=``, ...): the config
    they make, with a DeprecationWarning at the caller's line (two frames up)."""
    if not legacy and not options:
        return config_value(config, "config")
    _check_names(method, options)
    if isinstance(config, RateLimiterConfig) or len(legacy) > 2:
        raise TypeError(
            f"{method}() takes a RateLimiterConfig (or its text), and keep_state where it "
            f"has one: not {', '.join(map(shown, (config, *legacy, *options)))}"
        )
    deprecated(
        f"{method}(rate_type, rate, ...)",
        f"{method}(RateLimiterConfig.build(rate_type, rate, ...)) or its text",
        2,
    )
    return RateLimiterConfig.build(config, *legacy, **options)


def rate_in_code(rate: Any, options: dict[str, Any], limiter: str) -> RateLimiterConfig | None:
    """A limiter constructor's ``rate`` (a :class:`RateLimiterConfig`, or its text), checked;
    None without one. With ``options`` (``interval=``, ``rate_type=``, ``algorithm=``, ...;
    None: not given) or any other ``rate`` (an int, a :class:`Rate`), the loose arguments of
    earlier releases: the config they make, with a DeprecationWarning at the caller's line
    (two frames up)."""
    _check_names(limiter, options)
    options = {name: value for name, value in options.items() if value is not None}
    if not options and (rate is None or isinstance(rate, (RateLimiterConfig, str))):
        return None if rate is None else config_value(rate, "rate")
    if rate is None:
        raise InvalidArgumentError(f"{', '.join(options)} go with rate=, which is missing")
    if isinstance(rate, RateLimiterConfig):
        raise InvalidArgumentError(
            f"a RateLimiterConfig holds its settings: give rate= alone, not with "
            f"{', '.join(options)}"
        )
    deprecated(
        f"{limiter}()'s loose rate arguments",
        "rate= a RateLimiterConfig (RateLimiterConfig.build(...)) or its text",
        2,
    )
    return RateLimiterConfig.build(options.pop("rate_type", RateType.OVERALL), rate, **options)


def config_value(config: object, what: str) -> RateLimiterConfig:
    """``config`` as a :class:`RateLimiterConfig`: itself, or its text read."""
    if isinstance(config, RateLimiterConfig):
        return config
    if isinstance(config, str):
        return RateLimiterConfig.parse(config)
    raise InvalidArgumentError(
        f"{what} must be a RateLimiterConfig or its text ('10/second; 100/minute'), not "
        f"{shown(config)}"
    )


def _check_names(method: str, options: dict[str, Any]) -> None:
    """TypeError, as Python's, for a keyword argument no earlier release took."""
    unknown = sorted(set(options) - _LOOSE)
    if unknown:
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}")


_LOOSE = {
    "rate",
    "interval",
    "rate_type",
    "algorithm",
    "min_spacing",
    "margin",
    "keep_alive",
    "max_debt",
}
"""The loose rate arguments of earlier releases, by name."""
