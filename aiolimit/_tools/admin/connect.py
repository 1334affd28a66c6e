"""What every admin command shares: the server options, the connection, and errors as one
line with exit code 2 (bad input, no such limiter, the server unreachable or refusing),
never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import NamedTuple, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    MovedError,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...backends.redis import RedisBackend
from ...backends.redis._errors import credentials_missing
from ...errors import BackendError, CredentialsError, LimiterError
from ..options import DEFAULT_URL, URL_VARIABLE, default_url, masked, server_options
from ..text import shown

__all__ = [
    "Abort",
    "Body",
    "Command",
    "command",
    "name_argument",
    "no_limiter",
    "read_server",
    "seconds_argument",
]

T = TypeVar("T")
Body = Callable[[argparse.Namespace, RedisBackend], Awaitable[int]]


class Command(NamedTuple):
    """A subcommand, as ``cli.py`` offers it."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class Abort(Exception):
    """Ends a command with a one-line message and exit code 2."""


def command(
    name: str, add_arguments: Callable[[argparse.ArgumentParser], None], body: Body
) -> Command:
    """A command that runs ``body`` with a backend on the server the options name."""

    def add(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        server_options(
            parser,
            default_url(),
            f"the Redis (or Valkey) server, e.g. redis://host:6379 "
            f"(default: ${URL_VARIABLE}, else {DEFAULT_URL})",
        )

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_with_backend(args, body))
        except Abort as exc:
            print(f"aiolimit {name}: error: {exc}", file=sys.stderr)
            return 2

    return Command(add, run)


async def read_server(url: str, read: Callable[[Redis], Awaitable[T]]) -> T:
    """What ``read`` reads with a client of the server at ``url``; a failure as an Abort."""
    where = masked(url)
    try:
        redis = Redis.from_url(url, socket_connect_timeout=5)
    except ValueError as exc:
        raise Abort(f"bad --redis URL {where!r}: {exc}") from None
    try:
        return await read(redis)
    except RedisError as exc:
        failure = _not_there(exc, where)
        raise (failure or Abort(f"Redis at {where} refused a command: {exc}")) from None
    finally:
        await redis.aclose()


async def _with_backend(args: argparse.Namespace, body: Body) -> int:
    url: str = args.redis
    where = masked(url)
    client = RedisCluster if args.cluster else Redis
    try:
        redis = client.from_url(url, socket_connect_timeout=5)
    except ValueError as exc:
        raise Abort(f"bad --redis URL {where!r}: {exc}") from None
    try:
        backend = RedisBackend(redis, prefix=args.prefix)
        return await body(args, backend)
    except CredentialsError as exc:
        raise _no_entry(exc.__cause__ or exc, where) from None
    except BackendError as exc:
        raise (_not_there(exc.__cause__, where) or Abort(str(exc))) from None
    except LimiterError as exc:
        raise Abort(str(exc)) from None
    except RedisError as exc:
        failure = _not_there(exc, where)
        raise (failure or Abort(f"Redis at {where} refused a command: {exc}")) from None
    finally:
        await redis.aclose()


def _not_there(exc: BaseException | None, where: str) -> Abort | None:
    """The error for a server that could not be reached, or that holds only part of a
    cluster's keys; None for any other failure."""
    if isinstance(exc, (AuthenticationError, AuthenticationWrongNumberOfArgsError)):
        return _no_entry(exc, where)
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return Abort(f"cannot reach Redis at {where}: {exc}")
    if isinstance(exc, MovedError):
        return Abort(f"{where} is a node of a Redis Cluster: pass --cluster")
    return None


def _no_entry(exc: BaseException, where: str) -> Abort:
    """The error for a server that needs credentials, or refused the ones given."""
    reason = str(exc)
    said = (
        "needs credentials"
        if credentials_missing(reason)
        else f"refused the credentials given ({reason})"
    )
    return Abort(
        f"Redis at {where} {said}: give them in --redis or ${URL_VARIABLE} as "
        "redis://USER:PASSWORD@HOST:6379 (redis://:PASSWORD@HOST:6379 for a server's "
        "requirepass)"
    )


def no_limiter(args: argparse.Namespace) -> Abort:
    return Abort(
        f"no limiter '{shown(args.name)}' on {masked(args.redis)} (prefix {args.prefix!r})"
    )


def name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the limiter's name")


def seconds_argument(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
