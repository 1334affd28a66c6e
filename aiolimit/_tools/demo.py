"""Several workers share one limiter: a live per-second view of grants and a closing verdict.

The verdict does not trust the limiter: every worker stamps each grant with the event loop's
monotonic clock as soon as ``acquire()`` returns, and the audit slides a window over those
stamps to find the most permits any window held.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import random
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.abc

from .. import RateLimiter, RateType
from ..backends import Backend, MemoryBackend, RedisBackend
from ..errors import LimiterError
from .audit import busiest_window

__all__ = ["Run", "add_arguments", "allowed_by_rate", "masked", "run", "verdict"]

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
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="use the Redis (or Valkey) server at URL, e.g. redis://localhost:6379 "
        "(default: the in-memory backend)",
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
    per_worker: list[int] = field(default_factory=list)
    error: LimiterError | None = None

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


async def _worker(limiter: RateLimiter, run: Run, index: int, workers: anyio.abc.TaskGroup) -> None:
    while True:
        try:
            await limiter.acquire()
        except LimiterError as exc:  # reported once, without a task group's traceback
            run.error = run.error or exc
            workers.cancel_scope.cancel()
            return
        run.stamps.append(anyio.current_time() - run.started)
        run.per_worker[index] += 1
        # The guarded call to some downstream service.
        await anyio.sleep(random.uniform(0.0, 0.02))


async def _report(run: Run, duration: float) -> None:
    """Prints a line at every whole second of the run (the last line comes after it)."""
    second = 1
    while second < duration:
        await anyio.sleep_until(run.started + second)
        run.print_line(second)
        second += 1


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


def masked(url: str) -> str:
    """The URL with any password replaced by ``***`` (``redis://:***@host``), to print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unreadable URL>"
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == "password" for key, _ in query):
        query = [(key, "***" if key == "password" else value) for key, value in query]
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))
    return urlunsplit(parts._replace(netloc=netloc))


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
    try:
        # set_rate, not try_set_rate: start from a full budget whatever an earlier run left.
        await limiter.set_rate(RateType.OVERALL, args.rate, args.interval)
        print(
            f"aiolimit demo: {args.workers} workers share limiter {args.name!r}, "
            f"{args.rate} permits per {_seconds(args.interval)}, "
            f"for {_seconds(args.duration)} ({where})",
            flush=True,
        )
        run = Run(args.rate, args.interval, per_worker=[0] * args.workers)
        run.started = anyio.current_time()
        async with anyio.create_task_group() as workers:
            workers.cancel_scope.deadline = run.started + args.duration
            for index in range(args.workers):
                workers.start_soon(_worker, limiter, run, index, workers)
            workers.start_soon(_report, run, args.duration)
        # The duration, or less when a failure ended the run early.
        elapsed = min(args.duration, round(anyio.current_time() - run.started, 2))
        run.print_line(elapsed)
        if run.error is not None:
            raise run.error
        return verdict(run, elapsed)
    finally:
        if redis is not None:
            with contextlib.suppress(LimiterError):
                await limiter.delete()
            await redis.aclose()


def verdict(run: Run, elapsed: float) -> int:
    tolerance = min(_STAMP_TOLERANCE, run.interval / 10)
    busiest = busiest_window(run.stamps, run.interval, slack=tolerance).most
    total = len(run.stamps)
    allowed = allowed_by_rate(run.rate, run.interval, elapsed)
    shares = f"{min(run.per_worker)}-{max(run.per_worker)} per worker"
    print()
    print(f"grants          {total} in {_seconds(elapsed)} ({shares})")
    print(
        f"busiest window  {busiest} permits in one {_seconds(run.interval)} window "
        f"(rate {run.rate}; audited from {total} grant stamps, "
        f"{tolerance * 1000:g} ms stamp tolerance)"
    )
    print(
        f"utilisation     {100 * total / allowed:.1f}% "
        f"({total} of the {allowed} permits the rate allows in {_seconds(elapsed)})"
    )
    if busiest > run.rate:
        print(
            f"FAIL: a {_seconds(run.interval)} window held {busiest} permits, "
            f"over the rate of {run.rate}"
        )
        return 1
    print(f"PASS: no {_seconds(run.interval)} window held more than {run.rate} permits")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.clock is not None and not args.redis:
        print(
            "aiolimit demo: error: --clock needs --redis (the in-memory backend has one clock)",
            file=sys.stderr,
        )
        return 2
    try:
        return anyio.run(_demo, args, backend="asyncio")
    except (_Abort, LimiterError) as exc:
        print(f"aiolimit demo: error: {exc}", file=sys.stderr)
        return 2
