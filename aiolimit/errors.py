"""Every exception aiolimit raises, under one base class."""

from __future__ import annotations

__all__ = [
    "BackendError",
    "InvalidArgumentError",
    "LimiterError",
    "NotConfiguredError",
]


class LimiterError(Exception):
    """Base class of every aiolimit error."""


class InvalidArgumentError(LimiterError, ValueError):
    """An argument is out of range or of the wrong type (also a :class:`ValueError`)."""


class NotConfiguredError(LimiterError):
    """The limiter has no rate yet: call ``try_set_rate`` or ``set_rate`` first."""

    def __init__(self, name: str) -> None:
        super().__init__(f"rate limiter {name!r} has no rate: call try_set_rate() or set_rate()")
        self.name = name


class BackendError(LimiterError):
    """The backend failed: Redis unreachable, timed out, or refused a command.

    The original exception is chained as ``__cause__``.
    """
