"""The checks of the arguments every surface takes: a timeout (or ``wait``) and a count of
permits. One place each, below the engine and every limiter and surface that import them."""

from __future__ import annotations

from datetime import timedelta

from ._types import MAX_RATE
from ._values import MAX_DURATION_SECONDS, US, Duration, exceeds_max_duration, shown, to_micros
from .errors import InvalidArgumentError

__all__ = ["check_permits", "check_sync", "check_take", "max_wait_of"]


def max_wait_of(timeout: Duration | None, what: str = "timeout") -> int | None:
    """A public timeout as the longest wait in microseconds; None waits as long as it takes.
    Every surface's timeout (or ``wait``) is checked here.

    A timeout longer than MAX_DURATION (infinity included) is no limit: no interval is that
    long, so no wait can be. Any negative timeout is refused, even one that rounds to 0 µs."""
    if timeout.__class__ is int and 0 <= timeout <= MAX_DURATION_SECONDS:  # (0: the default)
        return timeout * US
    if timeout is None or exceeds_max_duration(timeout):
        return None
    max_wait = to_micros(timeout, what)  # (a number or a timedelta from here on)
    if max_wait < 0 or (not isinstance(timeout, timedelta) and timeout < 0):
        raise InvalidArgumentError(f"{what} must be >= 0 or None, not {timeout!r}")
    return max_wait


def check_permits(permits: object) -> int:
    """``permits`` when it is an int from 1 to MAX_RATE; else InvalidArgumentError."""
    if permits.__class__ is int and 1 <= permits <= MAX_RATE:
        return permits
    if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= MAX_RATE:
        raise InvalidArgumentError(
            f"permits must be an int from 1 to {MAX_RATE} (MAX_RATE), not {shown(permits)}"
        )
    return permits


def check_take(permits: int, timeout: Duration | None) -> tuple[int, int | None]:
    """``(check_permits(permits), max_wait_of(timeout))``: the permit path's, in one call
    that decides the common case (ints in range, as the defaults are) at once."""
    if (
        type(permits) is int
        and type(timeout) is int
        and 1 <= permits <= MAX_RATE
        and 0 <= timeout <= MAX_DURATION_SECONDS
    ):
        return permits, timeout * US
    return check_permits(permits), max_wait_of(timeout)


def check_sync(remaining: object, reset: Duration) -> tuple[int, int]:
    """A sync's ``remaining`` (an int from 0 to MAX_RATE) and ``reset`` (seconds or a
    timedelta, from 0 to MAX_DURATION) as ``(remaining, reset_us)``; else
    InvalidArgumentError."""
    if (
        isinstance(remaining, bool)
        or not isinstance(remaining, int)
        or not 0 <= remaining <= MAX_RATE
    ):
        raise InvalidArgumentError(
            f"remaining must be an int from 0 to {MAX_RATE} (MAX_RATE), not {shown(remaining)}"
        )
    if exceeds_max_duration(reset):
        raise InvalidArgumentError(f"reset must be at most 10 years, not {shown(reset)}")
    reset_us = to_micros(reset, "reset")  # (a number or a timedelta, finite, from here on)
    if reset_us < 0:
        raise InvalidArgumentError(f"reset must be >= 0, not {shown(reset)}")
    return remaining, reset_us
