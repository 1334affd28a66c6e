"""The values callers pass, checked once and converted to the one unit used inside: durations
(seconds or a timedelta, at most :data:`MAX_DURATION` either way, or units read from text) to
integer microseconds, clock readings, limiter names and other text; :func:`shown` writes any
of them into a message.

>>> to_micros(1.5, "interval")           # 1_500_000
>>> check_name("partner-api")            # the name, or InvalidArgumentError
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal

from .errors import InvalidArgumentError

__all__ = [
    "MAX_DURATION",
    "MAX_DURATION_SECONDS",
    "US",
    "Duration",
    "check_name",
    "check_text",
    "clock_micros",
    "exceeds_max_duration",
    "interval_of",
    "micros",
    "micros_up",
    "millis_up",
    "seconds",
    "shown",
    "to_micros",
    "unit_seconds",
    "whole_seconds_up",
]

Duration = float | int | timedelta
"""Seconds as a number, or a :class:`~datetime.timedelta`."""

# Durations up to ten years in microseconds (3.2e14) leave room to add them to a clock reading
# (1.8e15 today) below 2**53, where Lua's doubles stop being exact.
US = 1_000_000
"""Microseconds in a second. Every duration inside is integer microseconds; this module is
the one place that converts them to and from seconds (and milliseconds)."""


def seconds(us: float) -> float:
    """``us`` microseconds in seconds."""
    return us / US


def micros_up(seconds: float) -> int:
    """``seconds`` in whole microseconds, rounded up (a wait is never shortened)."""
    return math.ceil(seconds * US)


def whole_seconds_up(us: int) -> int:
    """``us`` microseconds in whole seconds, rounded up (as ``Retry-After`` counts them)."""
    return -(-us // US)


def millis_up(us: int) -> int:
    """``us`` microseconds in whole milliseconds, rounded up (as Redis keeps TTLs)."""
    return -(-us // 1000)


MAX_DURATION = timedelta(days=3650)
"""The longest ``interval``, ``keep_alive`` and ``expire`` ttl; a longer timeout waits
as long as it takes."""
MAX_DURATION_SECONDS = int(MAX_DURATION.total_seconds())
_MAX_CLOCK_US = 2**53  # the scripts add durations to clock readings; past 2**53 they round


_UNITS = {
    "s": 1, "sec": 1, "second": 1,
    "m": 60, "min": 60, "minute": 60,
    "h": 3600, "hr": 3600, "hour": 3600,
    "d": 86400, "day": 86400,
}  # fmt: skip


def unit_seconds(word: str) -> int | None:
    """Seconds in a unit word: second(s), sec(s), s, minute(s), min(s), m, ... ("ms" is not
    minutes: it is refused)."""
    if word in _UNITS:
        return _UNITS[word]
    if len(word) > 2 and word.endswith("s"):
        return _UNITS.get(word[:-1])
    return None


def interval_of(count: str | None, unit: int) -> Duration:
    """``count`` units read exactly (decimal text, not a float), rounded up to a whole
    microsecond, so the text ``Rate.__str__`` writes reads back as the same interval."""
    if count is None:
        return unit
    seconds = Decimal(count) * unit
    if seconds > MAX_DURATION_SECONDS or not seconds:
        return float(seconds)  # refused by Rate, naming MAX_DURATION (or "not positive")
    return timedelta(microseconds=math.ceil(seconds * US))


def micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * US + delta.microseconds


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
    if not -MAX_DURATION_SECONDS <= value <= MAX_DURATION_SECONDS:
        raise _too_long(value, what)
    return math.ceil(value * 1_000_000 - 1e-6)


def exceeds_max_duration(value: object) -> bool:
    """Whether ``value`` is a duration (seconds or timedelta) longer than MAX_DURATION."""
    if isinstance(value, timedelta):
        return value > MAX_DURATION
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value > MAX_DURATION_SECONDS  # False for NaN


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
