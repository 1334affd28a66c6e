"""The commands that change a live limiter: ``set-rate``, ``delete``, ``pause`` and
``resume`` (``block`` and ``unblock``, their deprecated names, still run them). ``set-rate``,
``pause`` and ``resume`` go through :class:`~aiolimit.RateLimiter`, as an application would.

``delete`` takes a name, or a glob as ``list`` reads it (any ``*``, ``?`` or ``[`` makes one;
``--exact`` says a name): the limiters a glob matches are listed, then deleted once confirmed
on the terminal (exit code 1 if not), or with ``--yes``. A ``ShardedRateLimiter`` is one
limiter there: every shard found is deleted (by the name it is stored under, whatever the
shard count). A limiter whose delete fails is said on stderr and the others are deleted
all the same (exit code 2)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

from redis.exceptions import ResponseError

from ... import Algorithm, Rate, RateLimiter, RateLimiterConfig, RateType
from ..._values import check_name
from ..._values import seconds as to_seconds
from ...backends.redis import RedisBackend
from ...errors import BackendError, NotConfiguredError
from ..options import masked
from ..text import plural, seconds, shown
from .connect import Abort, Body, command, name_argument, no_limiter, seconds_argument
from .glob import SYNTAX, Found, is_glob, limiters, redis_escape
from .show import rates

__all__ = ["BLOCK", "DELETE", "PAUSE", "RESUME", "SET_RATE", "UNBLOCK"]


def _described(config: RateLimiterConfig) -> str:
    """``10/second; 100/minute (SLIDING_WINDOW, OVERALL)``, with keep_alive and spacing."""
    more = [config.algorithm.value, config.rate_type.value]
    if config.keep_alive is not None:
        more.append(f"keep_alive {seconds(config.keep_alive.total_seconds())}")
    if config.min_spacing is not None:
        more.append(f"min spacing {seconds(config.min_spacing.total_seconds())}")
    return f"{rates(config)} ({', '.join(more)})"


# -- set-rate ------------------------------------------------------------------------------------


_DEFAULT_ALGORITHM = Algorithm.SLIDING_WINDOW.value
"""A new limiter's algorithm, where neither ``--algorithm`` nor a config names one."""


def _listed(kind: type[Algorithm] | type[RateType]) -> str:
    """``sliding_window, token_bucket or fixed_window``: every member, as the options take it."""
    *rest, last = (member.lower() for member in kind.__members__)
    return f"{', '.join(rest)} or {last}" if rest else last


def _choice(kind: type[Algorithm] | type[RateType]) -> Callable[[str], str]:
    def read(text: str) -> str:
        value = text.strip().upper().replace("-", "_")
        if value not in kind.__members__:
            names = ", ".join(member.lower() for member in kind.__members__)
            raise argparse.ArgumentTypeError(f"expected one of {names}, got {text!r}")
        return value

    return read


def _set_rate_arguments(parser: argparse.ArgumentParser) -> None:
    name_argument(parser)
    parser.add_argument("rates", metavar="RATES", help='e.g. "10/second; 100/minute"')
    parser.add_argument(
        "--algorithm",
        type=_choice(Algorithm),
        help=f"{_listed(Algorithm)} (default: the limiter's, else {_DEFAULT_ALGORITHM.lower()})",
    )
    parser.add_argument(
        "--type",
        type=_choice(RateType),
        help="overall or per_client (default: the limiter's, else overall)",
    )
    parser.add_argument("--keep-alive", type=seconds_argument, metavar="SECONDS")
    parser.add_argument("--min-spacing", type=seconds_argument, metavar="SECONDS")
    kept = parser.add_mutually_exclusive_group()
    kept.add_argument(
        "--keep-state",
        action="store_true",
        default=True,
        help="grants made keep counting (the default)",
    )
    kept.add_argument(
        "--reset-state",
        action="store_false",
        dest="keep_state",
        help="every budget restarts full",
    )


async def _set_rate(args: argparse.Namespace, backend: RedisBackend) -> int:
    limiter = RateLimiter(args.name, backend)
    current = await limiter.get_config()
    rate_type = args.type or (current.rate_type if current else RateType.OVERALL)
    algorithm = args.algorithm or (current.algorithm if current else _DEFAULT_ALGORITHM)
    asked = RateLimiterConfig.build(
        rate_type,
        Rate.parse(args.rates),
        keep_alive=args.keep_alive,
        algorithm=algorithm,
        min_spacing=args.min_spacing,
    )
    await limiter.set_rate(asked, keep_state=args.keep_state)
    stored = await limiter.get_config()
    if stored is None:
        raise Abort(f"the config of '{shown(args.name)}' was gone right after it was set")
    kept = "" if args.keep_state else ", state reset"
    print(f"{shown(args.name)}: {_described(stored)}{kept}")
    if stored != asked:
        print(
            f"aiolimit set-rate: the server stored {_described(stored)}, not "
            f"{_described(asked)}: this version's backend does not store all of it",
            file=sys.stderr,
        )
        return 1
    return 0


# -- delete, pause, resume ----------------------------------------------------------------------


def _delete_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        metavar="NAME",
        help=f"the limiter's name, or a glob on names as list reads it ({SYNTAX}): the "
        "limiters it matches are listed, then deleted once you confirm",
    )
    parser.add_argument(
        "--exact", action="store_true", help="NAME is a name even with * ? or [ in it"
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="delete what a glob matches without asking (needed when stdin is not a terminal)",
    )


async def _delete(args: argparse.Namespace, backend: RedisBackend) -> int:
    if args.exact or not is_glob(args.name):
        return await _delete_name(args, backend)
    matched = await limiters(backend, args.name)
    if not matched:
        raise Abort(
            f"no limiter matches '{shown(args.name)}' on {masked(args.redis)} "
            f"(prefix {args.prefix!r})"
        )
    them = plural(len(matched), "limiter")
    print(f"{them} {'matches' if len(matched) == 1 else 'match'} '{shown(args.name)}':")
    for found in matched:
        print(f"  {found.label}")
    if not args.yes and not _confirmed(f"delete {them}? [y/N] "):
        print("nothing deleted")
        return 1
    deleted = failed = 0
    for found in matched:  # (one gone meanwhile is not counted)
        outcome = await _delete_one(backend, found)
        deleted += outcome is True
        failed += outcome is None
    print(f"{plural(deleted, 'limiter')} deleted" + (f", {failed:,} not" if failed else ""))
    return 2 if failed else 0


async def _delete_name(args: argparse.Namespace, backend: RedisBackend) -> int:
    """``delete NAME``: the limiter of that name, and a sharded limiter of that name (its
    shards found with SCAN; a user refused SCAN deletes the limiter alone)."""
    name = check_name(args.name)
    outcomes = [await _delete_one(backend, Found(name, (name,), False))]
    try:
        found = await limiters(backend, redis_escape(name))
    except ResponseError:
        if not outcomes[0]:
            raise  # (nothing deleted: the refusal says why no sharded one was looked for)
        found = []
    outcomes += [await _delete_one(backend, each) for each in found if each.sharded]
    if None in outcomes:
        return 2
    if not any(outcomes):
        raise no_limiter(args)
    return 0


async def _delete_one(backend: RedisBackend, found: Found) -> bool | None:
    """Deletes every config ``found`` is stored under (a name each: the backend's own
    delete, which takes a shard's name too), saying so; whether anything was there, None
    when the server refused it (said on stderr: the other limiters of a glob are deleted
    all the same). A server that cannot be reached ends the command."""
    outcomes = await asyncio.gather(
        *(backend.delete(stored) for stored in found.stored), return_exceptions=True
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, BackendError) or outcome.outage:
                raise outcome
            print(f"aiolimit delete: error: {found.label} not deleted: {outcome}", file=sys.stderr)
            return None
    existed = any(outcomes)
    if existed:
        print(f"deleted {found.label}")
    return existed


def _confirmed(question: str) -> bool:
    """Asks on the terminal; only y or yes is a yes. Without a terminal, refuses: a
    pipe's "y" is no one's answer to what was listed."""
    if not sys.stdin.isatty():
        raise Abort("stdin is not a terminal to confirm on: pass --yes to delete what matches")
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _pause_arguments(parser: argparse.ArgumentParser) -> None:
    name_argument(parser)
    parser.add_argument(
        "seconds", type=seconds_argument, help="no grant to anyone before this many seconds"
    )


async def _pause(args: argparse.Namespace, backend: RedisBackend) -> int:
    limiter = RateLimiter(args.name, backend)
    try:
        await limiter.pause(args.seconds)
    except NotConfiguredError:
        raise no_limiter(args) from None
    left = await backend.block(args.name, None)
    print(f"paused {shown(args.name)}: no grant for {seconds(to_seconds(left))}")
    return 0


async def _resume(args: argparse.Namespace, backend: RedisBackend) -> int:
    limiter = RateLimiter(args.name, backend)
    if await limiter.get_config() is None:
        raise no_limiter(args)
    try:
        ended = await limiter.resume()
    except NotConfiguredError:
        raise no_limiter(args) from None
    print(f"resumed {shown(args.name)}" if ended else f"{shown(args.name)} was not paused")
    return 0


def _renamed(old: str, new: str, body: Body) -> Body:
    """``body`` under its deprecated name ``old``: a note on stderr, then ``new``'s work."""

    async def run(args: argparse.Namespace, backend: RedisBackend) -> int:
        print(f"aiolimit {old} is deprecated: use aiolimit {new}", file=sys.stderr)
        return await body(args, backend)

    return run


SET_RATE = command("set-rate", _set_rate_arguments, _set_rate)
DELETE = command("delete", _delete_arguments, _delete)
PAUSE = command("pause", _pause_arguments, _pause)
RESUME = command("resume", name_argument, _resume)
BLOCK = command("block", _pause_arguments, _renamed("block", "pause", _pause))
UNBLOCK = command("unblock", name_argument, _renamed("unblock", "resume", _resume))
