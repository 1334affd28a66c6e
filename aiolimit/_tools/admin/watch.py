"""``aiolimit watch NAME``: once a second, grants per second (those whose slot started since
the previous tick), the permits taken of the tightest rate, the reservations waiting and any
block; one line redrawn on a terminal, a line per tick otherwise. It only reads."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from typing import NamedTuple

from ..._types import RateLimiterConfig, RateType
from ..._values import seconds as to_seconds
from ...backends.memory import GROUPS
from ...backends.redis import RedisBackend
from ..demo import positive_int
from ..text import bar
from .connect import command, name_argument, no_limiter
from .reading import Reservations, budget_state
from .show import learned

__all__ = ["WATCH", "Reading", "watch_line"]


class Reading(NamedTuple):
    """What one tick of ``watch`` read."""

    rate: float | None
    """Grants per second whose slot started since the previous tick (None: not known)."""
    available: int | None
    """Permits available now (None: PER_CLIENT, each client its own)."""
    ahead: Reservations
    blocked_s: float | None = None
    """Seconds until the limiter's block ends (None: not blocked)."""
    learned: str | None = None
    """A rate learned from a partner, against its ceiling (None: not learned)."""


SHORTEST_INTERVAL = 0.1
"""The shortest ``--interval``: each tick is a few reads, and no terminal needs more than ten
redraws a second."""


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not SHORTEST_INTERVAL <= seconds < math.inf:  # (NaN too)
        raise argparse.ArgumentTypeError(
            f"must be at least {SHORTEST_INTERVAL:g} seconds (and finite), got {text}"
        )
    return seconds


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    name_argument(parser)
    parser.add_argument(
        "--interval",
        type=_interval,
        default=1.0,
        metavar="SECONDS",
        help=f"refresh every SECONDS, at least {SHORTEST_INTERVAL:g} (default 1)",
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N lines")


async def _watch(args: argparse.Namespace, backend: RedisBackend) -> int:
    loop = asyncio.get_running_loop()
    tty = sys.stdout.isatty()
    previous: Previous | None = None
    began = loop.time()
    tick = 0
    try:
        while args.count is None or tick < args.count:
            await asyncio.sleep(max(0.0, began + tick * args.interval - loop.time()))
            tick += 1
            config = await backend.get_config(args.name)
            if config is None:
                raise no_limiter(args)
            reading, previous = await _read(backend, args.name, config, previous)
            line = watch_line(config, reading)
            if tty:
                sys.stdout.write("\r\x1b[K" + line)
                sys.stdout.flush()
            else:
                print(line, flush=True)
    finally:
        if tty:
            print()
    return 0


class Previous(NamedTuple):
    """What the next tick compares with: when this one read (the server's clock), and the
    generation of the state it read."""

    now_us: int
    gen: str


async def _read(
    backend: RedisBackend, name: str, config: RateLimiterConfig, previous: Previous | None
) -> tuple[Reading, Previous]:
    """One tick's reading, and what the next compares with. The rate is of the grants whose
    slot started between the two readings (a sliding window's log holds their starts), on
    the server's clock: neither a reservation made for later nor a caller that a block sent
    back to queue again is a grant before its slot. None on the first tick, after the state
    began afresh (``set-rate``), and for the counters (no log)."""
    since_us = previous.now_us if previous is not None else None
    read = await budget_state(backend, name, config, since_us)
    rate = None
    if (
        previous is not None
        and read.gen == previous.gen
        and read.now_us > previous.now_us
        and GROUPS[config.algorithm].logs_grants
    ):
        rate = read.budget.started / to_seconds(read.now_us - previous.now_us)
    available = None
    if config.rate_type is RateType.OVERALL:
        available = await backend.available_permits(name)
    blocked_us = await backend.block(name, None)
    blocked_s = to_seconds(blocked_us) if blocked_us > 0 else None
    ceiling = await backend.learned(name)
    shown_learned = None
    if ceiling is not None:
        current = await backend.get_config(name)
        if current is not None:
            shown_learned = learned(current.rates, ceiling)
    reading = Reading(rate, available, read.budget.reservations, blocked_s, shown_learned)
    return reading, Previous(read.now_us, read.gen)


def watch_line(config: RateLimiterConfig, reading: Reading) -> str:
    """One line of ``aiolimit watch``: the time, grants per second, the permits taken of the
    tightest rate with a bar (OVERALL, unless a block holds them all back), the reservations
    waiting, any block's time left."""
    shown_rate = "      -" if reading.rate is None else f"{reading.rate:7.1f}"
    parts = [time.strftime("%H:%M:%S"), f"{shown_rate} grants/s"]
    most = config.max_permits
    if reading.blocked_s is not None:
        pass  # nothing is available, whatever the window holds
    elif reading.available is not None:
        taken = most - reading.available
        width = len(str(most))
        parts.append(f"window {taken:>{width}}/{most} {bar(taken, most)}")
    else:
        parts.append(f"PER_CLIENT, {most} per client")
    queued = f"queued {reading.ahead.count}"
    if reading.ahead.count:
        queued += f" (+{reading.ahead.furthest_s:.2f} s)"
    parts.append(queued)
    if reading.blocked_s is not None:
        parts.append(f"blocked {reading.blocked_s:.1f} s")
    if reading.learned is not None:
        parts.append(f"learned {reading.learned}")
    return "  ".join(parts)


WATCH = command("watch", _watch_arguments, _watch)
