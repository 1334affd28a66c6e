"""The options every command that talks to a server takes (``--redis``, ``--cluster``,
``--prefix``), given before the command or after it: ``aiolimit --redis URL list`` and
``aiolimit list --redis URL`` are one command. Given twice, the one after the command wins.

A command adds the ones it takes with :func:`server_options`; ``cli.py`` offers all of them
before the command and fills in the command's defaults once the line is read.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_URL",
    "GLOBAL",
    "URL_VARIABLE",
    "add_global",
    "default_url",
    "fill_defaults",
    "masked",
    "server_options",
]

URL_VARIABLE = "AIOLIMIT_REDIS_URL"
DEFAULT_URL = "redis://localhost:6379"

GLOBAL: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "redis": (
        ("--redis",),
        {
            "metavar": "URL",
            "help": f"the Redis (or Valkey) server, e.g. redis://host:6379 (default: "
            f"${URL_VARIABLE}, else {DEFAULT_URL}; demo: the in-memory backend unless given)",
        },
    ),
    "cluster": (
        ("--cluster",),
        {
            "action": "store_true",
            "help": "the URL is a node of a Redis Cluster: reach every node through it",
        },
    ),
    "prefix": (
        ("--prefix",),
        {"metavar": "PREFIX", "help": "the limiters' key prefix (default aiolimit:)"},
    ),
}
"""dest -> (flags, argparse options) of each option a command may take before or after it."""


def default_url() -> str:
    return os.environ.get(URL_VARIABLE) or DEFAULT_URL


class Arguments(Protocol):
    """Where options are added: a parser, or a group of one."""

    def add_argument(self, *flags: str, **options: Any) -> Any: ...


def add_global(parser: Arguments, dest: str, help: str | None = None) -> None:
    """Adds one of :data:`GLOBAL`, set only when given (so that a value given before the
    command is not overwritten by the command's default)."""
    flags, options = GLOBAL[dest]
    parser.add_argument(
        *flags, dest=dest, default=argparse.SUPPRESS, **{**options, "help": help or options["help"]}
    )


def fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Sets each option of :func:`server_options` given neither before nor after the command
    to the command's default."""
    defaults: dict[str, object] = getattr(args, "global_defaults", {})
    for dest, value in defaults.items():
        if not hasattr(args, dest):
            setattr(args, dest, value)
    return args


def server_options(
    parser: argparse.ArgumentParser,
    redis: str | None,
    redis_help: str,
    *,
    cluster: bool = True,
    prefix: bool = True,
) -> None:
    """Adds ``--redis`` (default ``redis``) and, if asked, ``--cluster`` and ``--prefix`` to a
    command's parser; the defaults apply when the option is given neither before nor after."""
    add_global(parser, "redis", redis_help)
    defaults: dict[str, object] = {"redis": redis}
    if cluster:
        add_global(parser, "cluster")
        defaults["cluster"] = False
    if prefix:
        add_global(parser, "prefix")
        defaults["prefix"] = "aiolimit:"
    parser.set_defaults(global_defaults=defaults)


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
