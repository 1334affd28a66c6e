"""The ``aiolimit`` command line: ``aiolimit demo`` and ``aiolimit soak``.

Each subcommand lives in its own tool module exposing ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Callable, Sequence

from .. import __version__

__all__ = ["build_parser", "main"]

# name -> (module, one-line help). A module that is not there is simply not offered.
COMMANDS = {
    "demo": ("aiolimit._tools.demo", "several workers share one limiter; live view and a verdict"),
    "soak": ("aiolimit._tools.soak", "multi-process soak test with fault injection and an audit"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolimit",
        description="aiolimit: an asyncio-native, Redis-backed distributed rate limiter.",
    )
    parser.add_argument("--version", action="version", version=f"aiolimit {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for name, (module_name, summary) in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        command = commands.add_parser(
            name, help=summary, description=(module.__doc__ or summary).split("\n\n")[0]
        )
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130
