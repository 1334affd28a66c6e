from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import timedelta

from .errors import InvalidArgumentError

Duration = float | int | timedelta
"""Seconds as a number, or a :class:`~datetime.timedelta`."""

__all__ = ["Duration", "RateLimiterConfig", "RateType"]


class RateType(str, enum.Enum):
    """Whether every client shares one budget or each client id has its own."""

    OVERALL = "OVERALL"
    """One budget shared by every client of the limiter."""
    PER_CLIENT = "PER_CLIENT"
    """A budget per client id (``RedisBackend(..., client_id=...)``)."""


@dataclass(frozen=True)
class RateLimiterConfig:
    """A limiter's rate: at most ``rate`` permits in any sliding ``interval``."""

    rate_type: RateType
    rate: int
    interval: timedelta
    keep_alive: timedelta | None = None

    @classmethod
    def build(
        cls,
        rate_type: RateType | str,
        rate: int,
        interval: Duration,
        keep_alive: Duration | None = None,
    ) -> RateLimiterConfig:
        """Validates public arguments and returns the config they describe."""
        try:
            kind = RateType(rate_type)
        except ValueError:
            raise InvalidArgumentError(
                f"rate_type must be RateType.OVERALL or RateType.PER_CLIENT, not {rate_type!r}"
            ) from None
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
            raise InvalidArgumentError(f"rate must be an int >= 1, not {rate!r}")
        interval_us = to_micros(interval, "interval")
        if interval_us <= 0:
            raise InvalidArgumentError(f"interval must be positive, not {interval!r}")
        keep_alive_us = None
        if keep_alive is not None:
            keep_alive_us = to_micros(keep_alive, "keep_alive")
            if keep_alive_us < interval_us:
                raise InvalidArgumentError(
                    f"keep_alive ({keep_alive!r}) must not be shorter than interval ({interval!r})"
                )
        return cls(
            kind,
            rate,
            timedelta(microseconds=interval_us),
            None if keep_alive_us is None else timedelta(microseconds=keep_alive_us),
        )

    @property
    def interval_us(self) -> int:
        return micros(self.interval)

    @property
    def keep_alive_us(self) -> int:
        """The keep-alive in microseconds, 0 for none."""
        return 0 if self.keep_alive is None else micros(self.keep_alive)


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def to_micros(value: Duration, what: str) -> int:
    """Converts a public duration to integer microseconds (rounded up: never shorter)."""
    if isinstance(value, timedelta):
        return micros(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be seconds or a timedelta, not {value!r}")
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{what} must be finite, not {value!r}")
    return math.ceil(value * 1_000_000 - 1e-6)
