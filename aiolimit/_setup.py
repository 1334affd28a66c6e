"""The rate a limiter is constructed with: ``RateLimiter(name, backend, rate="10/second")``.

It is checked at construction and made the stored config (:meth:`ensure_rate`) by the
limiter's first permit call, once per limiter object: its ``for_client`` views share it, and
concurrent first calls wait for one write. A write that fails is tried again by the next call.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ._types import Algorithm, Duration, RateLimiterConfig, Rates, RateType
from .errors import InvalidArgumentError

__all__ = ["Ensures", "Setup", "setup_of"]


class Ensures(Protocol):
    """What a setup writes through: a limiter's ``ensure_rate``."""

    async def ensure_rate(
        self,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        *,
        algorithm: Algorithm | str = ...,
        min_spacing: Duration | None = None,
        keep_alive: Duration | None = None,
        max_debt: int | None = None,
    ) -> bool: ...


class Setup:
    """A config to make the stored one before the first permit is taken."""

    __slots__ = ("_lock", "config", "done")

    def __init__(self, config: RateLimiterConfig) -> None:
        self.config = config
        self.done = False
        self._lock = asyncio.Lock()

    async def ensure(self, limiter: Ensures) -> None:
        """Writes the config through ``limiter`` unless it was written already."""
        async with self._lock:
            if self.done:
                return
            config = self.config
            await limiter.ensure_rate(
                config.rate_type,
                config.rates,
                algorithm=config.algorithm,
                min_spacing=config.min_spacing,
                keep_alive=config.keep_alive,
                max_debt=config.max_debt,
            )
            self.done = True


def setup_of(
    rate: Rates | None,
    interval: Duration | None,
    rate_type: RateType | str | None,
    algorithm: Algorithm | str | None,
    min_spacing: Duration | None,
    keep_alive: Duration | None,
    margin: Duration | None = None,
    max_debt: int | None = None,
) -> Setup | None:
    """The constructor's rate arguments, checked; None without a ``rate``."""
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
    config = RateLimiterConfig.build(
        RateType.OVERALL if rate_type is None else rate_type,
        rate,
        interval,
        keep_alive,
        algorithm=Algorithm.SLIDING_WINDOW if algorithm is None else algorithm,
        min_spacing=min_spacing,
        margin=margin,
        max_debt=max_debt,
    )
    return Setup(config)
