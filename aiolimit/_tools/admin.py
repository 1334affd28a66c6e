"""Operating live limiters on a Redis server: ``aiolimit inspect``, ``list``, ``set-rate``,
``delete``, ``block`` and ``watch``. Each command's ``run`` returns the exit code: 0, 1
(``set-rate``: the server stored another config than the one asked for) or 2 (bad input, no
such limiter, the server unreachable or refusing), with a one-line message on stderr and
never a traceback.

The server is ``--redis URL``, by default ``$AIOLIMIT_REDIS_URL``. What the commands read is
read by ``inspect.py``; ``inspect``, ``list`` and ``watch`` only read, so they work as the
README's least-privilege ACL user.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import Algorithm, Rate, RateLimiter, RateLimiterConfig, RateType
from ..backends.redis import RedisBackend
from ..errors import BackendError, LimiterError, NotConfiguredError
from .demo import masked, positive_int, positive_seconds
from .inspect import Snapshot, budget_state, inspect_limiter, limiter_names

__all__ = ["BLOCK", "DELETE", "INSPECT", "LIST", "SET_RATE", "WATCH", "Command"]

URL_VARIABLE = "AIOLIMIT_REDIS_URL"
_BAR_WIDTH = 20


class Command(NamedTuple):
    """A subcommand, as ``cli.py`` offers it."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class _Abort(Exception):
    """Ends a command with a one-line message and exit code 2."""


Body = Callable[[argparse.Namespace, RedisBackend], Awaitable[int]]


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get(URL_VARIABLE),
        help=f"the Redis (or Valkey) server, e.g. redis://host:6379 (default: ${URL_VARIABLE})",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the URL is a node of a Redis Cluster: reach every node through it",
    )
    parser.add_argument(
        "--prefix", default="aiolimit:", help="the limiters' key prefix (default aiolimit:)"
    )


def _command(
    name: str, add_arguments: Callable[[argparse.ArgumentParser], None], body: Body
) -> Command:
    def add(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        _server_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_with_backend(args, body))
        except _Abort as exc:
            print(f"aiolimit {name}: error: {exc}", file=sys.stderr)
            return 2

    return Command(add, run)


async def _with_backend(args: argparse.Namespace, body: Body) -> int:
    url: str | None = args.redis
    if not url:
        raise _Abort(f"no Redis server: pass --redis URL or set {URL_VARIABLE}")
    where = masked(url)
    client = RedisCluster if args.cluster else Redis
    try:
        redis = client.from_url(url, socket_connect_timeout=5)
    except ValueError as exc:
        raise _Abort(f"bad --redis URL {where!r}: {exc}") from None
    try:
        backend = RedisBackend(redis, prefix=args.prefix)
        return await body(args, backend)
    except BackendError as exc:
        raise (_not_there(exc.__cause__, where) or _Abort(str(exc))) from None
    except LimiterError as exc:
        raise _Abort(str(exc)) from None
    except RedisError as exc:
        failure = _not_there(exc, where)
        raise (failure or _Abort(f"Redis at {where} refused a command: {exc}")) from None
    finally:
        await redis.aclose()


def _not_there(exc: BaseException | None, where: str) -> _Abort | None:
    """The error for a server that could not be reached, or that holds only part of a
    cluster's keys; None for any other failure."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return _Abort(f"cannot reach Redis at {where}: {exc}")
    if isinstance(exc, MovedError):
        return _Abort(f"{where} is a node of a Redis Cluster: pass --cluster")
    return None


def _shown(name: str) -> str:
    """A limiter name as printed: a shard's NUL as ``\\0``."""
    return name.replace("\x00", "\\0")


def _no_limiter(args: argparse.Namespace) -> _Abort:
    return _Abort(f"no limiter {args.name!r} on {masked(args.redis)} (prefix {args.prefix!r})")


def _rates(config: RateLimiterConfig) -> str:
    return "; ".join(str(rate) for rate in config.rates)


def _described(config: RateLimiterConfig) -> str:
    """``10/second; 100/minute (SLIDING_WINDOW, OVERALL)``, with keep_alive and spacing."""
    more = [config.algorithm.value, config.rate_type.value]
    if config.keep_alive is not None:
        more.append(f"keep_alive {_seconds(config.keep_alive.total_seconds())}")
    if config.min_spacing is not None:
        more.append(f"min spacing {_seconds(config.min_spacing.total_seconds())}")
    return f"{_rates(config)} ({', '.join(more)})"


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:,.0f} s"


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024 or unit == "MiB":
            return f"{count} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    raise AssertionError  # pragma: no cover


def _bar(part: int, whole: int) -> str:
    filled = min(_BAR_WIDTH, max(0, round(_BAR_WIDTH * part / whole))) if whole else 0
    return "[" + "#" * filled + "-" * (_BAR_WIDTH - filled) + "]"


# -- inspect -------------------------------------------------------------------------------------


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the limiter's name")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")


async def _inspect(args: argparse.Namespace, backend: RedisBackend) -> int:
    snapshot = await inspect_limiter(backend, args.name)
    if snapshot is None:
        raise _no_limiter(args)
    if args.json:
        print(json.dumps(snapshot.as_json(), indent=2))
    else:
        print("\n".join(render(snapshot)))
    return 0


def render(snapshot: Snapshot) -> list[str]:
    """``aiolimit inspect``'s lines."""
    config = snapshot.config
    ahead = snapshot.budget.reservations
    lines = [
        f"limiter       {_shown(snapshot.name)}",
        f"rates         {_rates(config)} ({config.algorithm.value}, {config.rate_type.value})",
        "keep_alive    "
        + ("none" if config.keep_alive is None else _seconds(config.keep_alive.total_seconds())),
        "expires       "
        + ("never" if snapshot.ttl_s is None else f"in {_seconds(snapshot.ttl_s)}"),
    ]
    if config.min_spacing is not None:
        lines.append(f"min spacing   {_seconds(config.min_spacing.total_seconds())}")
    most = config.max_permits
    if snapshot.available is not None:
        lines.append(f"available     {snapshot.available} of {most} permits now")
        lines.append(f"in window     {snapshot.in_window} of {most} permits taken")
    queued = f"{ahead.count} waiting ({ahead.permits}{'+' if ahead.partial else ''} permits)"
    if ahead.count:
        queued += f", the furthest starts in {_seconds(ahead.furthest_s)}"
    if snapshot.config.algorithm is Algorithm.SLIDING_WINDOW:
        lines.append(f"reservations  {queued}")
        lines.append(f"grants        {snapshot.budget.grants} since the state began")
    else:  # a token bucket or fixed windows keep a few numbers, not a log of grants
        kept = f"not kept ({snapshot.config.algorithm.value} keeps a few numbers, not a log)"
        lines.append(f"reservations  {kept}")
        lines.append(f"grants        {kept}")
    if snapshot.per_client:
        lines.append(
            f"clients       {snapshot.clients_registered} in the registry, "
            f"{snapshot.clients_read} read, {snapshot.clients_with_state} with state"
        )
        if snapshot.busiest:
            width = max(len(client.client_id) for client in snapshot.busiest)
            lines.append(
                f"busiest       {'client':<{width}}  available  reserved  grants  last grant"
            )
            for client in snapshot.busiest:
                lines.append(
                    f"              {client.client_id:<{width}}  {client.available:>9}  "
                    f"{client.reserved:>8}  {client.grants:>6}  "
                    f"{_seconds(client.last_grant_ago_s)} ago"
                )
    if snapshot.memory_bytes is None:
        lines.append("memory        n/a (MEMORY USAGE refused)")
    else:
        lines.append(
            f"memory        {_bytes(snapshot.memory_bytes)} in {snapshot.memory_keys} keys"
            + (" (the clients read)" if snapshot.per_client else "")
        )
    lines.append(f"slot          {snapshot.slot} on {snapshot.node}")
    return lines


# -- list ----------------------------------------------------------------------------------------


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pattern", metavar="PATTERN", nargs="?", default="*", help="a glob on names (default *)"
    )


async def _list(args: argparse.Namespace, backend: RedisBackend) -> int:
    names = sorted({name async for name in limiter_names(backend, args.pattern)})
    configs: list[RateLimiterConfig | None] = []
    for start in range(0, len(names), 500):
        part = names[start : start + 500]
        configs += await asyncio.gather(*(backend.get_config(name) for name in part))
    rows = [(n, c) for n, c in zip(names, configs, strict=True) if c is not None]
    if not rows:
        print(f"no limiter matches {args.pattern!r}", file=sys.stderr)
        return 0
    width = max(len(_shown(name)) for name, _ in rows)
    for name, config in rows:
        print(
            f"{_shown(name):<{width}}  {_rates(config)}  {config.algorithm.value}  "
            f"{config.rate_type.value}"
        )
    return 0


# -- set-rate ------------------------------------------------------------------------------------


def _choice(kind: type[Algorithm] | type[RateType]) -> Callable[[str], str]:
    def read(text: str) -> str:
        value = text.strip().upper().replace("-", "_")
        if value not in kind.__members__:
            names = ", ".join(member.lower() for member in kind.__members__)
            raise argparse.ArgumentTypeError(f"expected one of {names}, got {text!r}")
        return value

    return read


def _seconds_argument(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None


def _set_rate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the limiter's name")
    parser.add_argument("rates", metavar="RATES", help='e.g. "10/second; 100/minute"')
    parser.add_argument(
        "--algorithm",
        type=_choice(Algorithm),
        help="sliding_window, token_bucket or fixed_window (default: the limiter's, "
        "else sliding_window)",
    )
    parser.add_argument(
        "--type",
        type=_choice(RateType),
        help="overall or per_client (default: the limiter's, else overall)",
    )
    parser.add_argument("--keep-alive", type=_seconds_argument, metavar="SECONDS")
    parser.add_argument("--min-spacing", type=_seconds_argument, metavar="SECONDS")
    parser.add_argument(
        "--keep-state",
        action="store_true",
        help="grants made keep counting (default: every budget restarts full)",
    )


async def _set_rate(args: argparse.Namespace, backend: RedisBackend) -> int:
    rates = Rate.parse(args.rates)
    limiter = RateLimiter(args.name, backend)
    current = await limiter.get_config()
    rate_type = args.type or (current.rate_type if current else RateType.OVERALL)
    algorithm = args.algorithm or (current.algorithm if current else Algorithm.SLIDING_WINDOW)
    asked = RateLimiterConfig.build(
        rate_type, rates, None, args.keep_alive, algorithm=algorithm, min_spacing=args.min_spacing
    )
    await limiter.set_rate(
        asked.rate_type,
        asked.rates,
        algorithm=asked.algorithm,
        min_spacing=asked.min_spacing,
        keep_alive=asked.keep_alive,
        keep_state=args.keep_state,
    )
    stored = await limiter.get_config()
    if stored is None:
        raise _Abort(f"the config of {args.name!r} was gone right after it was set")
    print(
        f"{_shown(args.name)}: {_described(stored)}" + (", state kept" if args.keep_state else "")
    )
    if stored != asked:
        print(
            f"aiolimit set-rate: the server stored {_described(stored)}, not "
            f"{_described(asked)}: this version's backend does not store all of it",
            file=sys.stderr,
        )
        return 1
    return 0


# -- delete --------------------------------------------------------------------------------------


def _name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the limiter's name")


async def _delete(args: argparse.Namespace, backend: RedisBackend) -> int:
    if not await RateLimiter(args.name, backend).delete():
        raise _no_limiter(args)
    print(f"deleted {_shown(args.name)}")
    return 0


# -- block ---------------------------------------------------------------------------------------


def _block_arguments(parser: argparse.ArgumentParser) -> None:
    _name_argument(parser)
    parser.add_argument(
        "seconds", type=_seconds_argument, help="no grant to anyone before this many seconds"
    )


async def _block(args: argparse.Namespace, backend: RedisBackend) -> int:
    limiter = RateLimiter(args.name, backend)
    try:
        await limiter.block(args.seconds)
    except NotConfiguredError:
        raise _no_limiter(args) from None
    left = await backend.block(args.name, None)
    print(f"blocked {_shown(args.name)}: no grant for {_seconds(left / 1e6)}")
    return 0


# -- watch ---------------------------------------------------------------------------------------


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the limiter's name")
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="refresh (default 1)",
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N lines")


async def _watch(args: argparse.Namespace, backend: RedisBackend) -> int:
    loop = asyncio.get_running_loop()
    tty = sys.stdout.isatty()
    previous: tuple[float, int] | None = None
    began = loop.time()
    tick = 0
    try:
        while args.count is None or tick < args.count:
            await asyncio.sleep(max(0.0, began + tick * args.interval - loop.time()))
            tick += 1
            config = await backend.get_config(args.name)
            if config is None:
                raise _no_limiter(args)
            budget = await budget_state(backend, args.name, config)
            now = loop.time()
            rate = None
            if previous is not None and budget.grants >= previous[1]:
                rate = (budget.grants - previous[1]) / (now - previous[0])
            previous = (now, budget.grants)
            available = None
            if config.rate_type is RateType.OVERALL:
                available = await backend.available_permits(args.name)
            line = watch_line(config, rate, available, budget.reservations)
            if tty:
                sys.stdout.write("\r\x1b[K" + line)
                sys.stdout.flush()
            else:
                print(line, flush=True)
    finally:
        if tty:
            print()
    return 0


def watch_line(
    config: RateLimiterConfig, rate: float | None, available: int | None, ahead: Any
) -> str:
    """One line of ``aiolimit watch``: the time, grants per second, the permits taken of the
    tightest rate with a bar (OVERALL), the reservations waiting."""
    shown_rate = "      -" if rate is None else f"{rate:7.1f}"
    parts = [time.strftime("%H:%M:%S"), f"{shown_rate} grants/s"]
    most = config.max_permits
    if available is not None:
        taken = most - available
        width = len(str(most))
        parts.append(f"window {taken:>{width}}/{most} {_bar(taken, most)}")
    else:
        parts.append(f"PER_CLIENT, {most} per client")
    queued = f"queued {ahead.count}"
    if ahead.count:
        queued += f" (+{ahead.furthest_s:.2f} s)"
    parts.append(queued)
    return "  ".join(parts)


INSPECT = _command("inspect", _inspect_arguments, _inspect)
LIST = _command("list", _list_arguments, _list)
SET_RATE = _command("set-rate", _set_rate_arguments, _set_rate)
DELETE = _command("delete", _name_argument, _delete)
BLOCK = _command("block", _block_arguments, _block)
WATCH = _command("watch", _watch_arguments, _watch)
