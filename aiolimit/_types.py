"""What a limiter is configured with: its rate type, algorithm and rates (``_rates``: the
values, each checked), gathered in a :class:`RateLimiterConfig`, which its ``build`` checks
and its ``parse`` reads from text."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ._rates import (
    MAX_RATE,
    MAX_RATES,
    TEXT_PARTS,
    Algorithm,
    Rate,
    Rates,
    RateType,
    accepted,
    rates_in,
    rates_of,
    seconds_text,
)
from ._values import (
    MAX_DURATION,
    Duration,
    check_name,
    exceeds_max_duration,
    interval_of,
    micros,
    shown,
    to_micros,
    unit_seconds,
)
from .errors import InvalidArgumentError

# (Duration, MAX_DURATION and the value checks live in _values, the rates and their parts in
# _rates; the limiters, the stores and the HTTP calls take them from here with the config.)
__all__ = [
    "MAX_DURATION",
    "MAX_RATE",
    "MAX_RATES",
    "Algorithm",
    "Duration",
    "Rate",
    "RateLimiterConfig",
    "RateType",
    "Rates",
    "accepted",
    "check_name",
    "exceeds_max_duration",
    "rates_of",
    "shown",
    "to_micros",
]


def widened(rates: tuple[Rate, ...], margin: Duration) -> tuple[Rate, ...]:
    """``rates`` with every interval longer by ``margin``: for a partner that counts requests
    as they arrive, in its own window of the nominal interval, a limiter of its exact quota
    lets as many start in one interval as the partner allows, and any spread in how late
    callers send then puts one more in some partner window. Widened by the spread callers
    add (``Observer.late``: waking up, the event loop, the send), the partner sees at most
    its quota. Not negative, nor longer than the shortest interval."""
    margin_us = to_micros(margin, "margin")
    shortest = min(r.interval_us for r in rates)
    if not 0 <= margin_us <= shortest:
        raise InvalidArgumentError(
            f"margin must be between 0 and the shortest interval "
            f"({timedelta(microseconds=shortest)}), not {shown(margin)}"
        )
    if margin_us == 0:
        return rates
    return tuple(Rate(r.permits, timedelta(microseconds=r.interval_us + margin_us)) for r in rates)


@dataclass(frozen=True, init=False, repr=False)
class RateLimiterConfig:
    """A limiter's rates, rate type, algorithm and spacing: what the set-rate methods and
    ``RateLimiter(rate=...)`` take, as the value or its text.

    >>> RateLimiterConfig.parse("10/second; 100/minute; algorithm=token_bucket")
    >>> RateLimiterConfig.build(RateType.PER_CLIENT, "10/second", keep_alive=3600)
    >>> str(config)                  # '10/second; 100/minute; algorithm=token_bucket'

    :meth:`parse` and :meth:`build` check what they are given; ``str(config)`` is the text
    :meth:`parse` reads back as the same config. ``rates`` holds every rate; ``rate`` and
    ``interval`` are those of the first.

    ``margin``: the margin :meth:`build` was given (already in the rates), which the
    limiter keeps fixed; None (the default): a limiter whose callers wait for their slot
    (``acquire()``, the HTTP clients) goes at the fleet's measured margin
    (``backends/_margin.py``). Not compared: a stored config is the same config."""

    rate_type: RateType
    keep_alive: timedelta | None
    rates: tuple[Rate, ...]
    algorithm: Algorithm
    min_spacing: timedelta | None
    max_debt: int | None
    margin: timedelta | None = field(default=None, compare=False)

    def __init__(
        self,
        rate_type: RateType,
        rate: int | None = None,
        interval: timedelta | None = None,
        keep_alive: timedelta | None = None,
        rates: Sequence[Rate] = (),
        algorithm: Algorithm = Algorithm.SLIDING_WINDOW,
        min_spacing: timedelta | None = None,
        max_debt: int | None = None,
        margin: timedelta | None = None,
    ) -> None:
        if not rates:
            if rate is None or interval is None:
                raise InvalidArgumentError("a config needs its rates (or a rate and an interval)")
            rates = (Rate(rate, interval),)
        elif (rate is not None and rate != rates[0].permits) or (
            interval is not None and interval != rates[0].interval
        ):
            raise InvalidArgumentError(
                f"rate and interval ({rate}, {interval}) are not those of the first rate "
                f"({rates[0]}): give the rates only"
            )
        object.__setattr__(self, "rate_type", rate_type)
        object.__setattr__(self, "keep_alive", keep_alive)
        object.__setattr__(self, "rates", tuple(rates))
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "min_spacing", min_spacing)
        object.__setattr__(self, "max_debt", check_max_debt(max_debt))
        object.__setattr__(self, "margin", margin)

    @property
    def rate(self) -> int:
        """The permits of the first rate."""
        return self.rates[0].permits

    @property
    def interval(self) -> timedelta:
        """The interval of the first rate."""
        return self.rates[0].interval

    def __repr__(self) -> str:
        return (
            f"RateLimiterConfig(rate_type={self.rate_type!r}, rate={self.rate}, "
            f"interval={self.interval!r}, keep_alive={self.keep_alive!r}, rates={self.rates!r}, "
            f"algorithm={self.algorithm!r}, min_spacing={self.min_spacing!r}"
            + ("" if self.max_debt is None else f", max_debt={self.max_debt!r}")
            + ("" if self.margin is None else f", margin={self.margin!r}")
            + ")"
        )

    def __str__(self) -> str:
        """The rates, then each setting that is not the default, as :meth:`parse` reads them
        back: ``'5/second; rate_type=per_client; keep_alive=3600'``."""
        parts = [str(rate) for rate in self.rates]
        if self.rate_type is not RateType.OVERALL:
            parts.append(f"rate_type={self.rate_type.value.lower()}")
        if self.algorithm is not Algorithm.SLIDING_WINDOW:
            parts.append(f"algorithm={self.algorithm.value.lower()}")
        if self.min_spacing is not None:
            parts.append(f"min_spacing={seconds_text(self.min_spacing_us)}")
        if self.keep_alive is not None:
            parts.append(f"keep_alive={seconds_text(self.keep_alive_us)}")
        if self.max_debt is not None:
            parts.append(f"max_debt={self.max_debt}")
        if self.margin is not None:
            parts.append("margin=0")  # (a margin given is in the rates: kept fixed from here)
        return "; ".join(parts)

    @classmethod
    def parse(cls, text: str) -> RateLimiterConfig:
        """Reads a config from text: rates as :meth:`Rate.parse` reads them, and among them
        any of :meth:`build`'s settings as ``name=value``, separated by ``;``.

        >>> RateLimiterConfig.parse("10/second; 100/minute")      # OVERALL, sliding window
        >>> RateLimiterConfig.parse("5/second; rate_type=per_client; algorithm=token_bucket")
        >>> RateLimiterConfig.parse("60/minute; keep_alive=1 hour; margin=0.05; max_debt=30")

        ``rate_type`` and ``algorithm`` are named as the enums' members are, in any case;
        ``min_spacing``, ``margin`` and ``keep_alive`` are seconds (``0.5``) or a count and a
        unit as in a rate (``1 hour``). InvalidArgumentError names the part it could not
        read."""
        if not isinstance(text, str):
            raise InvalidArgumentError(
                f"a config's text must be a str such as '10/second; keep_alive=60', "
                f"not {shown(text)}"
            )
        settings: dict[str, Any] = {}
        rates = []
        for part in TEXT_PARTS.split(text):
            name, equals, value = part.partition("=")
            if not equals:
                if part.strip():
                    rates.append(part)
                continue
            name = name.strip()
            if name not in _SETTINGS:
                raise InvalidArgumentError(
                    f"no setting {name!r} in {text!r}: the settings are {', '.join(_SETTINGS)}"
                )
            if name in settings:
                raise InvalidArgumentError(f"{name} is given twice in {text!r}")
            read = _SETTINGS[name]
            settings[name] = value.strip() if read is None else read(value.strip(), name, text)
        rate_type = settings.pop("rate_type", RateType.OVERALL)
        return cls.build(rate_type, rates_in(rates, text), **settings)

    @classmethod
    def build(
        cls,
        rate_type: RateType | str,
        rate: Rates,
        interval: Duration | None = None,
        keep_alive: Duration | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,
        min_spacing: Duration | None = None,
        margin: Duration | None = None,
        max_debt: int | None = None,
    ) -> RateLimiterConfig:
        """Validates public arguments and returns the config they describe. ``margin``
        widens every rate's interval by that much (see :func:`widened`) and keeps it fixed;
        ``margin=0`` keeps the exact rate; None (the default): the fleet's measured margin
        where the limiter's callers wait for their slot (``backends/_margin.py``)."""
        try:
            kind = RateType(rate_type)
        except ValueError:
            raise InvalidArgumentError(
                f"rate_type must be RateType.OVERALL or RateType.PER_CLIENT (or the str "
                f"{accepted(RateType)}, in any case), not {shown(rate_type)}"
            ) from None
        try:
            how = Algorithm(algorithm)
        except ValueError:
            names = ", ".join(f"Algorithm.{a.name}" for a in Algorithm)
            raise InvalidArgumentError(
                f"algorithm must be one of {names} (or the str {accepted(Algorithm)}, in any "
                f"case), not {shown(algorithm)}"
            ) from None
        rates = rates_of(rate, interval)
        given = None
        if margin is not None:
            rates = widened(rates, margin)
            given = timedelta(microseconds=to_micros(margin, "margin"))
        longest = max(r.interval_us for r in rates)
        keep_alive_us = None
        if keep_alive is not None:
            keep_alive_us = to_micros(keep_alive, "keep_alive")
            if keep_alive_us < longest:
                raise InvalidArgumentError(
                    f"keep_alive ({keep_alive!r}) must not be shorter than the interval "
                    f"({timedelta(microseconds=longest)})"
                )
        spacing = None
        if min_spacing is not None:
            spacing_us = to_micros(min_spacing, "min_spacing")
            if spacing_us < 0:
                raise InvalidArgumentError(f"min_spacing must not be negative, not {min_spacing!r}")
            if spacing_us > longest:
                raise InvalidArgumentError(
                    f"min_spacing ({min_spacing!r}) must not be longer than the longest interval "
                    f"({timedelta(microseconds=longest)}); add a rate of 1 per that time instead"
                )
            spacing = timedelta(microseconds=spacing_us) if spacing_us else None
        return cls(
            kind,
            keep_alive=None if keep_alive_us is None else timedelta(microseconds=keep_alive_us),
            rates=rates,
            algorithm=how,
            min_spacing=spacing,
            max_debt=max_debt,
            margin=given,
        )

    @property
    def interval_us(self) -> int:
        return micros(self.interval)

    @property
    def keep_alive_us(self) -> int:
        """The keep-alive in microseconds, 0 for none."""
        return 0 if self.keep_alive is None else micros(self.keep_alive)

    @property
    def min_spacing_us(self) -> int:
        """The spacing in microseconds, 0 for none."""
        return 0 if self.min_spacing is None else micros(self.min_spacing)

    @property
    def max_permits(self) -> int:
        """The most permits one request may ask for: the smallest rate's."""
        return min(r.permits for r in self.rates)

    @property
    def debt_limit(self) -> int:
        """How far below zero a charge (``Backend.settle`` for more than was reserved) may
        take each rate's permits left: ``max_debt``, by default one interval's rate (the
        smallest rate's permits)."""
        return self.max_permits if self.max_debt is None else self.max_debt

    @property
    def longest_us(self) -> int:
        """The longest interval, in microseconds: how long a grant counts."""
        return max(r.interval_us for r in self.rates)


_DURATION_TEXT = re.compile(r"^(?P<count>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]+)?$", re.IGNORECASE)


def _duration(value: str, name: str, text: str) -> Duration:
    """A setting's seconds (``0.5``), or a count and a unit (``1 hour``), read exactly."""
    match = _DURATION_TEXT.match(value)
    unit = match and (1 if match["unit"] is None else unit_seconds(match["unit"].lower()))
    if match is None or unit is None:
        raise InvalidArgumentError(
            f"cannot read {name}={value!r} in {text!r}: write seconds (0.5) or a count and a "
            "unit (1 hour)"
        )
    return interval_of(match["count"], unit)


def _whole(value: str, name: str, text: str) -> int:
    if not value.isdecimal():
        raise InvalidArgumentError(f"cannot read {name}={value!r} in {text!r}: write an int")
    return int(value)


_SETTINGS: dict[str, Callable[[str, str, str], object] | None] = {
    "rate_type": None,  # a word, as written: build reads (and checks) the enums' members
    "algorithm": None,
    "min_spacing": _duration,
    "margin": _duration,
    "keep_alive": _duration,
    "max_debt": _whole,
}
"""How :meth:`RateLimiterConfig.parse` reads each setting's value (None: as written)."""


def check_max_debt(max_debt: object) -> int | None:
    """``max_debt`` as a config keeps it: None (the default) or an int from 0 to MAX_RATE."""
    if max_debt is None:
        return None
    if isinstance(max_debt, bool) or not isinstance(max_debt, int) or not 0 <= max_debt <= MAX_RATE:
        raise InvalidArgumentError(
            f"max_debt must be None or an int from 0 to {MAX_RATE} (MAX_RATE), not "
            f"{shown(max_debt)}"
        )
    return max_debt
