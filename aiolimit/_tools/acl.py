"""``aiolimit acl``: prints the ``ACL SETUSER`` command of the least-privilege user a limiter
(and ``aiolimit inspect``, ``list`` and ``watch``) needs, for the keys of ``--prefix``; the
password is the placeholder ``PASSWORD``. It connects to nothing: ``--server-version`` names
an older server, whose line leaves out the commands it lacks."""

from __future__ import annotations

import argparse

from ..backends.redis._acl import acl_setuser
from .options import add_global

__all__ = ["add_arguments", "run"]


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
    add_global(parser, "prefix")
    parser.set_defaults(global_defaults={"prefix": "aiolimit:"})


def run(args: argparse.Namespace) -> int:
    print(acl_setuser(args.user, args.prefix, server=args.server_version))
    return 0
