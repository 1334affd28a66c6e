"""The ``aiolimit`` command line: ``demo`` and ``soak``; ``inspect``, ``list``, ``set-rate``,
``delete`` and ``watch`` for live limiters on a Redis server.

Each subcommand is a tool module, or an object in one (``"module:NAME"``), exposing
``add_arguments(parser)`` and ``run(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
from collections.abc import Callable, Sequence

from .. import __version__

__all__ = ["build_parser", "main"]

# name -> (module, one-line help). A module that is not there is simply not offered.
COMMANDS = {
    "demo": ("aiolimit._tools.demo", "several workers share one limiter; live view and a verdict"),
    "soak": ("aiolimit._tools.soak", "multi-process soak test with fault injection and an audit"),
    "inspect": (
        "aiolimit._tools.admin:INSPECT",
        "a live limiter's config, state, queue and memory",
    ),
    "list": ("aiolimit._tools.admin:LIST", "the limiters on the server, one line each"),
    "set-rate": (
        "aiolimit._tools.admin:SET_RATE",
        'change a limiter\'s rates: "10/second; 100/minute"',
    ),
    "delete": ("aiolimit._tools.admin:DELETE", "remove a limiter's config and state"),
    "block": ("aiolimit._tools.admin:BLOCK", "no grant to anyone for SECONDS (every process)"),
    "watch": ("aiolimit._tools.admin:WATCH", "grants/s, the window and the queue, once a second"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolimit",
        description="aiolimit: an asyncio-native, Redis-backed distributed rate limiter.",
    )
    parser.add_argument("--version", action="version", version=f"aiolimit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for name, (target, summary) in COMMANDS.items():
        module_name, _, attribute = target.partition(":")
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        tool = getattr(module, attribute) if attribute else module
        described = summary if attribute else (module.__doc__ or summary).split("\n\n")[0]
        command = commands.add_parser(name, help=summary, description=described)
        tool.add_arguments(command)
        command.set_defaults(run=tool.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
