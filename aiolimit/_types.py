from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import timedelta

from .errors import InvalidArgumentError

Duration = float | int | timedelta
"""Seconds as a number, or a :class:`~datetime.timedelta`."""

__all__ = ["MAX_DURATION", "MAX_RATE", "Duration", "RateLimiterConfig", "RateType"]

# Lua numbers are doubles, exact for integers up to 2**53. Every number the scripts see stays
# below that: rates and permits up to 2**50 leave a margin of 8 for the permits a budget holds
# in queued reservations, and durations up to ten years in microseconds (3.2e14) leave room to
# add them to a clock reading (1.8e15 today).
MAX_RATE = 2**50
"""The largest ``rate`` and ``permits``."""
MAX_DURATION = timedelta(days=3650)
"""The longest ``interval``, ``keep_alive`` and ``expire`` ttl; a longer timeout waits
as long as it takes."""
_MAX_SECONDS = int(MAX_DURATION.total_seconds())
_MAX_CLOCK_US = 2**53  # the scripts add durations to clock readings; past 2**53 they round


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
        if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= MAX_RATE:
            raise InvalidArgumentError(
                f"rate must be an int from 1 to {MAX_RATE} (MAX_RATE), not {shown(rate)}"
            )
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
    """Converts a public duration to integer microseconds (rounded up: never shorter).

    Durations beyond 10 years either way (:data:`MAX_DURATION`) are refused before any
    arithmetic, so no value overflows or becomes an integer the scripts cannot hold."""
    if isinstance(value, timedelta):
        if not -MAX_DURATION <= value <= MAX_DURATION:
            raise _too_long(value, what)
        return micros(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{what} must be seconds or a timedelta, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # (huge ints overflow isfinite)
        raise InvalidArgumentError(f"{what} must be finite, not {value!r}")
    if not -_MAX_SECONDS <= value <= _MAX_SECONDS:
        raise _too_long(value, what)
    return math.ceil(value * 1_000_000 - 1e-6)


def exceeds_max_duration(value: object) -> bool:
    """Whether ``value`` is a duration (seconds or timedelta) longer than MAX_DURATION."""
    if isinstance(value, timedelta):
        return value > MAX_DURATION
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value > _MAX_SECONDS  # False for NaN


def _too_long(value: Duration, what: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} must be at most 10 years (MAX_DURATION) either way, not {shown(value)}"
    )


def shown(value: object) -> str:
    """``repr(value)``, but short for huge ints (whose repr may even raise ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def clock_micros(reading: object) -> int:
    """A clock reading (seconds) as integer microseconds; InvalidArgumentError unless it is a
    finite number the scripts can hold exactly."""
    if (
        isinstance(reading, bool)
        or not isinstance(reading, (int, float))
        or not abs(reading) < _MAX_CLOCK_US / 1_000_000  # False for NaN and infinities
    ):
        raise InvalidArgumentError(
            f"the backend's clock returned {shown(reading)}, not a finite time in seconds "
            f"(below {_MAX_CLOCK_US // 1_000_000} in magnitude)"
        )
    return round(reading * 1_000_000)


def check_text(value: object, what: str) -> str:
    """A non-empty str that encodes as strict UTF-8 (what Redis keys and arguments are
    sent as); InvalidArgumentError otherwise, before anything is sent."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what} must be a non-empty str, not {shown(value)}")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} must encode as UTF-8: {value!r} holds {value[exc.start]!r} at index "
            f"{exc.start} ({exc.reason})"
        ) from None
    return value


def check_name(name: object) -> str:
    """A limiter name: non-empty UTF-8 text without NUL, which shard names use."""
    name = check_text(name, "name")
    if "\x00" in name:
        raise InvalidArgumentError(
            f"name must not contain NUL ('\\x00'; sub-limiters of ShardedRateLimiter use it), "
            f"not {name!r}"
        )
    return name
