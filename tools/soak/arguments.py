"""The soak's command line, and the checks of what it was given."""

from __future__ import annotations

import argparse
import math

from aiolimit._tools.options import masked
from aiolimit.errors import InvalidArgumentError

from .faults import FAULTS, SERVER_FAULTS
from .limits import ALGORITHMS, DEFAULT_ALGORITHM, Limits

__all__ = ["add_arguments", "check"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis", metavar="URL", help="use the server at URL (default: start one of its own)"
    )
    _limiter_arguments(parser)
    _workload_arguments(parser)
    _fault_arguments(parser)
    _output_arguments(parser)


def _limiter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", "-k", type=int, default=4, help="worker processes (4)")
    parser.add_argument("--tasks", "-t", type=int, default=16, help="tasks per process (16)")
    parser.add_argument("--duration", "-d", type=float, default=20.0, help="seconds (20)")
    parser.add_argument(
        "--type", choices=("overall", "per-client"), default="overall", dest="rate_type"
    )
    parser.add_argument("--rate", type=int, default=None, help="permits per interval (200)")
    parser.add_argument("--interval", type=float, default=None, help="seconds (1)")
    parser.add_argument(
        "--rates",
        metavar="TEXT",
        help='several rates, all of which must allow a grant, e.g. "3/second;20/minute" '
        "(read by Rate.parse; replaces --rate and --interval)",
    )
    parser.add_argument(
        "--algorithm",
        type=str.lower,
        choices=ALGORITHMS,
        default=DEFAULT_ALGORITHM.value.lower(),
        help=f"the limiter's algorithm ({DEFAULT_ALGORITHM.value.lower()})",
    )
    parser.add_argument(
        "--min-spacing",
        type=float,
        default=None,
        metavar="SECONDS",
        help="least time between the starts of consecutive grants (none)",
    )


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mix",
        default="60,25,15",
        help="weights of acquire(1), try_acquire(1, timeout), acquire(2..--max-multi) "
        "(default 60,25,15)",
    )
    parser.add_argument("--max-multi", type=int, default=5, help="largest multi-permit request")
    parser.add_argument(
        "--try-timeout", type=float, default=None, help="try_acquire timeout (interval / 2)"
    )
    parser.add_argument(
        "--big",
        action="store_true",
        help="one task repeatedly asks for the whole rate; all others flood acquire(1)",
    )


def _fault_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fault",
        action="append",
        choices=FAULTS,
        default=[],
        help="inject this fault (repeatable); clock-skew skews one process's client clock",
    )
    parser.add_argument(
        "--fault-every", type=float, default=2.0, help="seconds between injections (2)"
    )
    parser.add_argument(
        "--persistence",
        choices=("none", "aof"),
        default="none",
        help="local server persistence: none, or aof with appendfsync always",
    )
    parser.add_argument(
        "--clock", choices=("server", "client"), default="server", help="limiter clock"
    )
    parser.add_argument("--skew", type=float, default=3600.0, help="clock-skew seconds (3600)")
    parser.add_argument(
        "--i-own-this-server",
        action="store_true",
        help="with --redis: let --fault script-flush and client-kill act on that server "
        "(a throwaway one of yours, never a shared or production server)",
    )
    parser.add_argument(
        "--allow-loss",
        action="store_true",
        help="report but do not fail over-admission after a restart without persistence",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--client-retries",
        type=int,
        default=0,
        metavar="N",
        help="workers' redis-py clients retry a dropped connection N times "
        "(default 0, as Redis.from_url(url) does)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress line")


def check(args: argparse.Namespace) -> str | None:
    if args.processes < 1 or args.tasks < 1:
        return "--processes and --tasks must be at least 1"
    if args.rates and (args.rate is not None or args.interval is not None):
        return "--rates replaces --rate and --interval: give one or the other"
    if (args.rate is not None and args.rate < 1) or (
        args.interval is not None and args.interval <= 0
    ):
        return "--rate and --interval must be positive"
    if args.duration <= 0:
        return "--duration must be positive"
    if args.min_spacing is not None and not (0 <= args.min_spacing < math.inf):
        return "--min-spacing must be a non-negative number of seconds"
    try:
        Limits.of(args)
    except InvalidArgumentError as exc:
        return str(exc)
    problem = _refused_on_a_given_server(args)
    if problem:
        return problem
    try:
        mix = [int(part) for part in args.mix.split(",")]
    except ValueError:
        mix = []
    if len(mix) != 3 or min(mix) < 0 or sum(mix) == 0:
        return "--mix takes three non-negative weights, e.g. 60,25,15"
    return None


def _refused_on_a_given_server(args: argparse.Namespace) -> str | None:
    """The faults that act on the server, refused against one the soak did not start: no
    restart (there is no process of its own to crash), and the others only for its owner."""
    if not args.redis:
        return None
    if "restart" in args.fault:
        return "--fault restart needs the local server (leave out --redis)"
    on_server = [fault for fault in args.fault if fault in SERVER_FAULTS]
    if on_server and not args.i_own_this_server:
        fault = on_server[0]
        return (
            f"--fault {fault} acts on {masked(args.redis)}, a server this soak did not start "
            f"({SERVER_FAULTS[fault]}): leave out --redis, or add --i-own-this-server if it "
            "is a throwaway server of yours"
        )
    return None
