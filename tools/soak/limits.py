"""What the soaked limiter is set to (its rates, algorithm and spacing), read from the
command line, and the bounds each algorithm promises per interval."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from aiolimit import Algorithm, Rate

from .algorithms import BOUNDS, TOLERANCE_US

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "DEFAULT_INTERVAL",
    "DEFAULT_RATE",
    "TOLERANCE_US",
    "Limits",
    "rate_label",
]

ALGORITHMS = tuple(a.value.lower() for a in Algorithm)
DEFAULT_ALGORITHM = Algorithm.SLIDING_WINDOW
DEFAULT_RATE, DEFAULT_INTERVAL = 200, 1.0


@dataclass(frozen=True)
class Limits:
    """What the soaked limiter is set to: its rates, algorithm and spacing (seconds, 0: none)."""

    rates: tuple[Rate, ...]
    algorithm: Algorithm = DEFAULT_ALGORITHM
    min_spacing: float = 0.0

    @classmethod
    def of(cls, args: argparse.Namespace) -> Limits:
        """From the command line (InvalidArgumentError for rates it cannot read)."""
        if args.rates:
            rates = Rate.parse(args.rates)
        else:
            rate = DEFAULT_RATE if args.rate is None else args.rate
            interval = DEFAULT_INTERVAL if args.interval is None else args.interval
            rates = (Rate(rate, interval),)
        return cls(rates, Algorithm(args.algorithm.upper()), args.min_spacing or 0.0)

    @property
    def max_permits(self) -> int:
        """The most one request may ask for: the smallest rate's permits."""
        return min(r.permits for r in self.rates)

    @property
    def shortest(self) -> float:
        """The shortest interval, in seconds: the workload's pace (timeouts, grace)."""
        return min(r.interval_us for r in self.rates) / 1e6

    @property
    def text(self) -> str:
        """The rates as ``Rate.parse`` reads them."""
        return "; ".join(str(r) for r in self.rates)

    def interval_bound(self, rate: Rate) -> int:
        """The most permits one interval of ``rate`` may hold under this algorithm."""
        return BOUNDS[self.algorithm].interval_bound(rate)


def rate_label(rate: Rate) -> str:
    """``200/1s``, ``20/60s``: short, with the interval in seconds."""
    return f"{rate.permits}/{rate.interval_us / 1e6:g}s"
