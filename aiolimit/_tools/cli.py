"""The ``aiolimit`` command line: ``demo``; ``inspect``, ``list``, ``set-rate``,
``delete``, ``pause``, ``resume`` and ``watch`` for live limiters on a Redis server; ``acl``,
the least-privilege user they and a limiter need.

Each subcommand is a tool module, or an object in one (``"module:NAME"``), exposing
``add_arguments(parser)`` and ``run(args) -> int`` (the exit code). The server options
(``--redis``, ``--cluster``, ``--prefix``: ``options.py``) go before or after the command.
Output into a pipe closed early (``aiolimit list | head``) ends the command quietly, with
exit code 141 (128 + SIGPIPE) as a shell reports it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .options import GLOBAL, add_global, fill_defaults

__all__ = ["build_parser", "main", "parse"]

BROKEN_PIPE = 141

# name -> (module, one-line help).
COMMANDS = {
    "demo": ("aiolimit._tools.demo", "several workers share one limiter; live view and a verdict"),
    "inspect": (
        "aiolimit._tools.admin:INSPECT",
        "a live limiter's config, state, block, queue and memory",
    ),
    "list": ("aiolimit._tools.admin:LIST", "the limiters on the server, one line each"),
    "set-rate": (
        "aiolimit._tools.admin:SET_RATE",
        'change a limiter\'s rates: "10/second; 100/minute"',
    ),
    "delete": (
        "aiolimit._tools.admin:DELETE",
        "remove a limiter's config and state (a glob's: those it matches, once confirmed)",
    ),
    "pause": ("aiolimit._tools.admin:PAUSE", "no grant to anyone for SECONDS (every process)"),
    "resume": ("aiolimit._tools.admin:RESUME", "end a limiter's pause now"),
    "watch": (
        "aiolimit._tools.admin:WATCH",
        "grants/s, the window, the queue and any block, once a second",
    ),
    "acl": ("aiolimit._tools.acl", "the ACL SETUSER line of the least-privilege limiter user"),
    # Deprecated names, for one release: each says so on stderr, then does its new name's work.
    "block": ("aiolimit._tools.admin:BLOCK", "deprecated: aiolimit pause"),
    "unblock": ("aiolimit._tools.admin:UNBLOCK", "deprecated: aiolimit resume"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolimit",
        description="aiolimit: an asyncio-native, Redis-backed distributed rate limiter.",
        epilog="aiolimit COMMAND --help: the command's own options.",
    )
    parser.add_argument("--version", action="version", version=f"aiolimit {__version__}")
    server = parser.add_argument_group("server options (before or after the command)")
    for dest in GLOBAL:
        add_global(server, dest)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for name, (target, summary) in COMMANDS.items():
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(module_name)
        tool = getattr(module, attribute) if attribute else module
        described = summary if attribute else (module.__doc__ or summary).split("\n\n")[0]
        command = commands.add_parser(name, help=summary, description=described)
        tool.add_arguments(command)
        command.set_defaults(run=tool.run)
    return parser


class _Refused(Exception):
    """A server option given before a command that does not take it."""


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line read, each server option given or the command's default."""
    args = build_parser().parse_args(argv)
    defaults: dict[str, object] = getattr(args, "global_defaults", {})
    for dest in GLOBAL:
        if dest not in defaults and hasattr(args, dest):
            flag = GLOBAL[dest][0][0]
            raise _Refused(f"aiolimit {args.command}: error: {args.command} takes no {flag}")
    return fill_defaults(args)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(argv)
    except _Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    run: Callable[[argparse.Namespace], int] = args.run
    log = logging.getLogger("aiolimit")
    if not log.handlers:
        # A failure ends a command with its own one-line message: the library's log lines
        # (an outage warning) would only repeat it.
        log.addHandler(logging.NullHandler())
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of stdout went away (``| head``): no traceback, and no second error when
    the interpreter flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE
