"""The soak's progress line, on stderr about once a second while the workers run."""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, deque
from typing import Any

from .limits import Limits

__all__ = ["Progress"]


class Progress:
    """The progress line (stderr, about once a second): the permits granted in the last
    interval against what the rate allows in one, so the first interval's burst (a limiter
    starts with a full budget) reads as what it is, not as over-admission. With several
    rates: the first one; a fixed window allows twice its permits in one interval (the
    boundary burst), a token bucket twice less one."""

    def __init__(self, args: argparse.Namespace, begin: float, end: float, counts: Any) -> None:
        self.quiet = args.quiet
        self.begin, self.end = begin, end
        self.counts = counts
        limits = Limits.of(args)
        self.interval = limits.rates[0].interval_us / 1e6
        budgets = args.processes if args.rate_type == "per-client" else 1
        self.allowed = limits.interval_bound(limits.rates[0]) * budgets
        self.tty = sys.stderr.isatty()
        self._last = -math.inf
        # (time, permits so far), the oldest no more than one interval old.
        self._samples: deque[tuple[float, int]] = deque([(begin, 0)])

    def show(self, now: float, faults: Counter[str]) -> None:
        if self.quiet or now < self.begin:
            return
        permits = sum(self.counts[:])
        self._samples.append((now, permits))
        while self._samples[0][0] < now - self.interval:
            self._samples.popleft()
        if now - self._last < 1.0:
            return
        self._last = now
        elapsed = min(now, self.end) - self.begin
        share = elapsed / (self.end - self.begin)
        bar = "#" * round(share * 30)
        recent = permits - self._samples[0][1]
        injected = " ".join(f"{k}x{v}" for k, v in sorted(faults.items()))
        line = (
            f"[{bar:<30}] {elapsed:5.1f}/{self.end - self.begin:.0f}s  permits {permits}  "
            f"last {self.interval:g} s: {recent}/{self.allowed}"
            + (f"  faults {injected}" if injected else "")
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)
        sys.stderr.flush()

    def finish(self) -> None:
        if not self.quiet and self.tty:
            print(file=sys.stderr)
