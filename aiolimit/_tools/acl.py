"""``aiolimit acl``: prints the ``ACL SETUSER`` command of the least-privilege user a limiter
(and ``aiolimit inspect``, ``list`` and ``watch``) needs, for the keys of ``--prefix``; the
password is the placeholder ``PASSWORD``. The line is for Redis 7.2 and later and Valkey
(stderr says so): ``--server-version X.Y`` names an older server, whose line leaves out the
commands it lacks (Redis 7.0 and 7.1 refuse the whole default line), and ``--redis URL`` asks
the server its version."""

from __future__ import annotations

import argparse
import asyncio
import sys

from redis.asyncio import Redis

from ..backends.redis._acl import NEWER, acl_setuser
from .admin.connect import Abort, read_server
from .options import add_global, masked

__all__ = ["add_arguments", "run"]

_NEWEST = "{}.{}".format(*max(NEWER.values()))
_FOR_WHICH = (
    f"# for Redis {_NEWEST} and later and Valkey; Redis 7.0 and 7.1 refuse it: "
    "aiolimit acl --server-version 7.0 (or --redis URL: the server's own version)"
)


def _version(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(part) for part in text.split(".")[:2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a version such as 7.0, got {text!r}") from None
    return major, minor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--user", default="limiter", help="the user's name (default limiter)")
    parser.add_argument(
        "--server-version",
        type=_version,
        metavar="X.Y",
        help="the server's redis_version (INFO server; Valkey 8 gives 7.2), for a server "
        "older than Redis 7.2 (default: Redis 7.2 and later, Valkey)",
    )
    add_global(parser, "redis", "a server to ask its version (default: none is asked)")
    add_global(parser, "prefix")
    parser.set_defaults(global_defaults={"prefix": "aiolimit:", "redis": None})


async def _server_version(redis: Redis) -> str:
    info = await redis.info("server")
    return str(info["redis_version"])


def run(args: argparse.Namespace) -> int:
    if args.redis is not None and args.server_version is not None:
        print("aiolimit acl: error: give --redis or --server-version, not both", file=sys.stderr)
        return 2
    if args.redis is None:
        print(acl_setuser(args.user, args.prefix, server=args.server_version))
        if args.server_version is None:
            print(_FOR_WHICH, file=sys.stderr)
        return 0
    try:
        version = asyncio.run(read_server(args.redis, _server_version))
    except Abort as exc:
        print(f"aiolimit acl: error: {exc}", file=sys.stderr)
        return 2
    print(acl_setuser(args.user, args.prefix, server=_version(version)))
    print(f"# for the server at {masked(args.redis)}: redis_version {version}", file=sys.stderr)
    return 0
