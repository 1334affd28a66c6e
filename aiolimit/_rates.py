"""The values a limiter's config is made of: its rate type, its algorithm and its rates
(:class:`Rate`, read from text by :meth:`Rate.parse`), each checked where it is made.
``_types`` gathers them in a :class:`~aiolimit.RateLimiterConfig`."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from ._values import US, Duration, interval_of, micros, shown, to_micros, unit_seconds
from .errors import InvalidArgumentError

__all__ = [
    "MAX_RATE",
    "MAX_RATES",
    "TEXT_PARTS",
    "Algorithm",
    "Rate",
    "RateType",
    "Rates",
    "accepted",
    "rates_in",
    "rates_of",
    "seconds_text",
]

# Lua numbers are doubles, exact for integers up to 2**53. Every number the scripts see stays
# below that: rates and permits up to 2**50 leave a margin of 8 for the permits a budget holds
# in queued reservations (durations: _values).
MAX_RATE = 2**50
"""The largest ``rate`` and ``permits``."""


def _member_named(kind: type[enum.Enum], value: object) -> enum.Enum | None:
    """The member a string names in any case, ``-`` for ``_`` (``"per_client"``,
    ``"token-bucket"``), as the command line reads them."""
    if isinstance(value, str):
        return kind.__members__.get(value.strip().upper().replace("-", "_"))
    return None


def accepted(kind: type[enum.Enum]) -> str:
    """What a str naming a member of ``kind`` may be: ``'overall' or 'per_client'``."""
    names = [repr(name.lower()) for name in kind.__members__]
    return f"{', '.join(names[:-1])} or {names[-1]}"


class RateType(str, enum.Enum):
    """Whether every client shares one budget or each client id has its own. Also given as
    a str in any case: ``"per_client"``.

    ``PER_CLIENT``: the client is the backend's ``client_id``. A backend made without one
    has a random id of its own, so each process (each backend) gets a budget of its own
    (Redisson's meaning of a client); ``limiter.for_client(user_id)`` counts a budget you
    name, such as one per user."""

    OVERALL = "OVERALL"
    """One budget shared by every client of the limiter."""
    PER_CLIENT = "PER_CLIENT"
    """A budget per client id (``limiter.for_client(client_id)``; without one, the
    backend's: random per backend unless ``RedisBackend(..., client_id=...)``)."""

    @classmethod
    def _missing_(cls, value: object) -> RateType | None:
        return _member_named(cls, value)  # type: ignore[return-value]


class Algorithm(str, enum.Enum):
    """How a limiter counts its permits (docs/algorithms.md)."""

    SLIDING_WINDOW = "SLIDING_WINDOW"
    """An exact log of grants: at most ``permits`` in any sliding interval."""
    TOKEN_BUCKET = "TOKEN_BUCKET"
    """A bucket of ``permits`` tokens refilled continuously; constant-size state."""
    FIXED_WINDOW = "FIXED_WINDOW"
    """At most ``permits`` per window aligned to the Unix epoch; constant-size state."""

    @classmethod
    def _missing_(cls, value: object) -> Algorithm | None:
        return _member_named(cls, value)  # type: ignore[return-value]


_RATE_TEXT = re.compile(
    r"^\s*(?P<permits>\d+)\s*(?:/|per)\s*(?P<count>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Rate:
    """At most ``permits`` per ``interval`` (seconds or a timedelta; kept as a timedelta)."""

    permits: int
    interval: timedelta

    def __init__(self, permits: int, interval: Duration) -> None:
        if (
            isinstance(permits, bool)
            or not isinstance(permits, int)
            or not 1 <= permits <= MAX_RATE
        ):
            raise InvalidArgumentError(
                f"permits must be an int from 1 to {MAX_RATE} (MAX_RATE), not {shown(permits)}"
            )
        interval_us = to_micros(interval, "interval")
        if interval_us <= 0:
            raise InvalidArgumentError(f"interval must be positive, not {interval!r}")
        object.__setattr__(self, "permits", permits)
        object.__setattr__(self, "interval", timedelta(microseconds=interval_us))

    @property
    def interval_us(self) -> int:
        return micros(self.interval)

    def __str__(self) -> str:
        """``"3/second"``, ``"20/minute"``, ``"5/10 seconds"``, ``"5/0.00005 seconds"``: what
        :meth:`parse` reads back as this very rate (seconds written exactly, to the µs)."""
        us = self.interval_us
        for unit, seconds in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
            count, rest = divmod(us, seconds * US)
            if rest == 0:
                return f"{self.permits}/{unit}" if count == 1 else f"{self.permits}/{count} {unit}s"
        return f"{self.permits}/{seconds_text(us)} seconds"

    @classmethod
    def parse(cls, text: str) -> tuple[Rate, ...]:
        """Reads rates such as ``"3/second; 20/minute"``: each ``N/unit`` or ``N/K units``
        (second, minute, hour, day, their plurals, or s, m, h, d), separated by ``;``, ``,``
        or ``|``. InvalidArgumentError names the part it could not read."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"rates must be a str such as '3/second', not {shown(text)}")
        return rates_in([part for part in TEXT_PARTS.split(text) if part.strip()], text)


TEXT_PARTS = re.compile(r"[;,|]")
"""What separates the parts of a rate's (or a config's) text."""


def rates_in(parts: list[str], text: str) -> tuple[Rate, ...]:
    """The rates ``parts`` of ``text`` write; InvalidArgumentError names the part it could not
    read, or says there is none."""
    rates = []
    for part in parts:
        match = _RATE_TEXT.match(part)
        unit = match and unit_seconds(match["unit"].lower())
        if match is None or unit is None:
            raise InvalidArgumentError(
                f"cannot read the rate {part.strip()!r} in {text!r}: write it as "
                "'N/second', 'N/minute', 'N/hour', 'N/day' or 'N/10 seconds'"
            )
        try:
            rates.append(Rate(int(match["permits"]), interval_of(match["count"], unit)))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"the rate {part.strip()!r} in {text!r}: {exc}") from None
    if not rates:
        raise InvalidArgumentError(f"no rate in {text!r}: write it as '3/second; 20/minute'")
    return tuple(rates)


def seconds_text(us: int) -> str:
    """``us`` microseconds as exact decimal seconds, never an exponent: ``"3600"``,
    ``"0.05"``, ``"0.000001"``."""
    whole, fraction = divmod(us, US)
    return str(whole) if not fraction else f"{whole}.{fraction:06d}".rstrip("0")


Rates = int | str | Rate | Sequence[Rate]
"""A limiter's rates, as every public signature takes them: an int with its interval, text
for :meth:`Rate.parse` (``"10/second; 100/minute"``), one :class:`Rate`, or a sequence."""


def rates_of(rate: object, interval: Duration | None) -> tuple[Rate, ...]:
    """The rates a public ``rate`` argument describes: an int with ``interval``, a sequence of
    :class:`Rate` without one, or (a convenience) one :class:`Rate` or a rate string."""
    if isinstance(rate, int) and not isinstance(rate, bool):
        if interval is None:
            raise InvalidArgumentError("an int rate needs an interval: (rate, interval)")
        return (Rate(rate, interval),)
    if interval is not None:
        raise InvalidArgumentError(
            f"an interval goes with an int rate, not with {shown(rate)}: give each Rate its own"
        )
    if isinstance(rate, str):
        return Rate.parse(rate)
    if isinstance(rate, Rate):
        return (rate,)
    if isinstance(rate, Sequence) and all(isinstance(r, Rate) for r in rate):
        if not rate:
            raise InvalidArgumentError("rate must not be an empty list: give at least one Rate")
        if len(rate) > MAX_RATES:
            raise InvalidArgumentError(f"at most {MAX_RATES} rates on one limiter, not {len(rate)}")
        return tuple(rate)
    raise InvalidArgumentError(
        f"rate must be an int (with an interval) or a sequence of Rate, not {shown(rate)}"
    )


MAX_RATES = 8
"""The most rates one limiter applies at once."""
