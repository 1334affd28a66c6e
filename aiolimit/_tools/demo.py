"""Several workers share one limiter: a live per-second view of grants and a closing verdict.

The verdict does not trust the limiter: every worker stamps each grant with the event loop's
monotonic clock as soon as ``acquire()`` returns, and the audit slides a window over those
stamps to find the most permits any window held. On a busy machine the whole process may not
run for a while, and workers due in that time all wake at its end: each stamp is then the span
from how late the loop was running (a ticker measures it) to the wake, so a stall does not
bunch grants the limiter spread, while on time the span is a point and over-admission shows.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .. import RateLimiter, RateLimiterConfig, RateType
from ..backends import Backend, MemoryBackend, RedisBackend
from ..errors import LimiterError
from .options import masked, server_options
from .text import plural, shown
from .window import busiest_window

__all__ = [
    "LoopLag",
    "Run",
    "add_arguments",
    "allowed_by_rate",
    "masked",
    "positive_int",
    "run",
    "verdict",
]

_BAR_WIDTH = 20
# A stamp is taken a little after its grant (scheduling, the reply's trip back), and not
# always equally late, so the audit's window is shorter than the interval by this much.
_STAMP_TOLERANCE = 0.010


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate", type=positive_int, default=20, help="permits per interval (default 20)"
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="sliding window length (default 1)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=8, help="tasks sharing the limiter (default 8)"
    )
    parser.add_argument(
        "--duration",
        type=positive_seconds,
        default=5.0,
        metavar="SECONDS",
        help="how long the workers run (default 5)",
    )
    server_options(
        parser,
        None,
        "use the Redis (or Valkey) server at URL, e.g. redis://localhost:6379 "
        "(default: the in-memory backend)",
        cluster=False,
        prefix=False,
    )
    parser.add_argument(
        "--clock",
        choices=["server", "client"],
        help="with --redis: stamp grants with the server's TIME (default) or this host's clock",
    )
    parser.add_argument(
        "--name", default="aiolimit-demo", help="limiter name (default aiolimit-demo)"
    )


@dataclass
class Run:
    rate: int
    interval: float
    started: float = 0.0
    stamps: list[float] = field(default_factory=list)  # seconds since start, in grant order
    late: list[float] = field(default_factory=list)  # how late the loop ran at each stamp
    per_worker: list[int] = field(default_factory=list)
    error: LimiterError | None = None
    over: bool = False  # the run has ended: a grant still made is not the run's

    reported: int = 0  # grants already counted in a printed line

    def print_line(self, at: float) -> None:
        """One line of the live view: grants since the last line and in the last interval."""
        total = len(self.stamps)
        recent = total - bisect.bisect_right(self.stamps, at - self.interval)
        window = f"last {_seconds(self.interval)}: {recent:>4d}/{self.rate:<4d}"
        print(
            f"t={at:<6g} grants {total - self.reported:<5d} {window} {_bar(recent, self.rate)}",
            flush=True,
        )
        self.reported = total


def allowed_by_rate(rate: int, interval: float, elapsed: float) -> int:
    """The most permits a sliding-window limiter can grant in ``elapsed`` seconds."""
    windows = max(1, -int(-(elapsed - 1e-9) // interval))  # ceil, tolerant of float error
    return rate * windows


def _bar(count: int, rate: int) -> str:
    filled = min(_BAR_WIDTH, round(_BAR_WIDTH * count / rate))
    over = "!" if count > rate else ""
    return "[" + "#" * filled + "." * (_BAR_WIDTH - filled) + "]" + over


def _seconds(value: float) -> str:
    return f"{value:g} s"


class LoopLag:
    """How late this event loop runs now, as a ticker due every ``PERIOD`` sees it: the
    lateness of the tick still waiting, or of any that woke in the last ``RECENT`` seconds."""

    PERIOD = 0.005
    RECENT = 0.05

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time()
        self._woken: collections.deque[tuple[float, float]] = collections.deque()  # (woke, late)

    async def tick(self) -> None:
        while True:
            self._due = self._loop.time() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            woke = self._loop.time()
            self._woken.append((woke, woke - self._due))
            while self._woken[0][0] < woke - self.RECENT:
                self._woken.popleft()

    def now(self) -> float:
        at = self._loop.time()
        recent = (late for woke, late in self._woken if woke >= at - self.RECENT)
        return max(at - self._due, *recent, 0.0)


async def _worker(limiter: RateLimiter, run: Run, index: int, lag: LoopLag) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await limiter.acquire()
        if run.over:
            return
        run.late.append(lag.now())
        run.stamps.append(loop.time() - run.started)
        run.per_worker[index] += 1
        # The guarded call to some downstream service.
        await asyncio.sleep(random.uniform(0.0, 0.02))


async def _report(run: Run, duration: float) -> None:
    """Prints a line at every whole second of the run (the last line comes after it)."""
    loop = asyncio.get_running_loop()
    second = 1
    while second < duration:
        await asyncio.sleep(run.started + second - loop.time())
        run.print_line(second)
        second += 1


async def _run_for(
    limiter: RateLimiter, run: Run, workers: int, duration: float, end: Callable[[], Awaitable[Any]]
) -> None:
    """The workers and the live view, until ``duration`` is over or one of them fails (a
    LimiterError is kept in ``run.error``; anything else, such as the reader of stdout
    going away, is raised). ``end`` runs before the tasks are stopped; they have all ended
    when this returns."""
    lag = LoopLag()
    tasks = [asyncio.ensure_future(_worker(limiter, run, i, lag)) for i in range(workers)]
    tasks.append(asyncio.ensure_future(lag.tick()))
    tasks.append(asyncio.ensure_future(_report(run, duration)))
    try:
        done, _ = await asyncio.wait(tasks, timeout=duration, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        run.over = True
        await end()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    failures = [task.exception() for task in done if not task.cancelled() and task.exception()]
    for failure in failures:
        if not isinstance(failure, LimiterError):
            raise failure  # type: ignore[misc]
    if failures:
        run.error = failures[0]  # type: ignore[assignment]


async def _connect(url: str, clock: str) -> tuple[RedisBackend, Any]:
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    try:
        redis = Redis.from_url(url)
    except ValueError as exc:
        raise _Abort(f"bad --redis URL {masked(url)!r}: {exc}") from None
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        await redis.aclose()
        raise _Abort(f"cannot reach Redis at {masked(url)}: {exc}") from None
    return RedisBackend(redis, clock="client" if clock == "client" else "server"), redis


class _Abort(Exception):
    """Ends the demo with a one-line error message (exit code 2)."""


async def _demo(args: argparse.Namespace) -> int:
    redis = None
    backend: Backend
    if args.redis:
        clock = args.clock or "server"
        backend, redis = await _connect(args.redis, clock)
        where = f"Redis at {masked(args.redis)}, clock={clock}"
    else:
        backend = MemoryBackend()
        where = "in-memory backend"
    limiter = RateLimiter(args.name, backend)
    loop = asyncio.get_running_loop()

    async def ended() -> None:
        # The limiter goes before its workers stop: the reservations they hand back when
        # stopped find no limiter, so they write nothing (a hand-back leaves a receipt key).
        if redis is not None:
            with contextlib.suppress(LimiterError):
                await limiter.delete()

    try:
        # set_rate, not try_set_rate: start from a full budget whatever an earlier run left.
        config = RateLimiterConfig.build(RateType.OVERALL, args.rate, args.interval)
        await limiter.set_rate(config, keep_state=False)
        print(
            f"aiolimit demo: {plural(args.workers, 'worker')} "
            f"{'shares' if args.workers == 1 else 'share'} limiter "
            f"'{shown(args.name)}', "
            f"{plural(args.rate, 'permit')} per {_seconds(args.interval)}, "
            f"for {_seconds(args.duration)} ({where})",
            flush=True,
        )
        run = Run(args.rate, args.interval, per_worker=[0] * args.workers)
        run.started = loop.time()
        await _run_for(limiter, run, args.workers, args.duration, ended)
        # The duration, or less when a failure ended the run early.
        elapsed = min(args.duration, round(loop.time() - run.started, 2))
        run.print_line(elapsed)
        if run.error is not None:
            raise run.error
        return verdict(run, elapsed)
    finally:
        await ended()
        await backend.aclose()  # the hand-backs under way
        if redis is not None:
            await redis.aclose()


def verdict(run: Run, elapsed: float) -> int:
    tolerance = min(_STAMP_TOLERANCE, run.interval / 10)
    late = run.late or [0.0] * len(run.stamps)
    spans = [(stamp - lag, stamp) for stamp, lag in zip(run.stamps, late, strict=True)]
    busiest = busiest_window(spans, run.interval, slack=tolerance).most
    total = len(run.stamps)
    allowed = allowed_by_rate(run.rate, run.interval, elapsed)
    shares = f"{min(run.per_worker)}-{max(run.per_worker)} per worker"
    print()
    print(f"grants          {total} in {_seconds(elapsed)} ({shares})")
    print(
        f"busiest window  {plural(busiest, 'permit')} in one {_seconds(run.interval)} window "
        f"(rate {run.rate}; audited from {plural(total, 'grant stamp')}, "
        f"{tolerance * 1000:g} ms stamp tolerance)"
    )
    print(
        f"utilisation     {100 * total / allowed:.1f}% "
        f"({total} of the {plural(allowed, 'permit')} the rate allows in {_seconds(elapsed)})"
    )
    if busiest > run.rate:
        print(
            f"FAIL: a {_seconds(run.interval)} window held {plural(busiest, 'permit')}, "
            f"over the rate of {run.rate}"
        )
        return 1
    most = plural(run.rate, "permit")
    print(f"PASS: no {_seconds(run.interval)} window held more than {most}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.clock is not None and not args.redis:
        print(
            "aiolimit demo: error: --clock needs --redis (the in-memory backend has one clock)",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(_demo(args))
    except (_Abort, LimiterError) as exc:
        print(f"aiolimit demo: error: {exc}", file=sys.stderr)
        return 2
