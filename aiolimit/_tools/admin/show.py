"""``aiolimit inspect`` and ``aiolimit list``: a live limiter in full, or every limiter in a
line each. Both only read."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from ..._types import Rate, RateLimiterConfig
from ...backends.redis import RedisBackend
from ..text import plural, seconds, shown, size
from .connect import command, name_argument, no_limiter
from .glob import SYNTAX, limiter_names
from .leases import leases_json, render_leases
from .reading import Client, Snapshot, inspect_limiter

__all__ = ["INSPECT", "LIST", "blocked", "learned", "rates", "render"]


def rates(config: RateLimiterConfig) -> str:
    return "; ".join(str(rate) for rate in config.rates)


def learned(rates_now: tuple[Rate, ...], ceiling: tuple[Rate, ...]) -> str:
    """A learned rate against its ceiling, as ``inspect`` and ``watch`` show it."""
    share = rates_now[0].permits / ceiling[0].permits
    most = "; ".join(str(rate) for rate in ceiling)
    return f"{'; '.join(str(r) for r in rates_now)} in force, {share:.0%} of the ceiling {most}"


def blocked(left_s: float | None) -> str:
    """A block's time left, as ``inspect`` shows it."""
    if left_s is None:
        return "no"
    return f"for {seconds(left_s)} more: no grant to anyone"


# -- inspect -------------------------------------------------------------------------------------


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    name_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON for machines")


async def _inspect(args: argparse.Namespace, backend: RedisBackend) -> int:
    snapshot = await inspect_limiter(backend, args.name)
    leases = await backend.leases(args.name)  # a concurrency limiter of that name
    if snapshot is None and leases is None:
        raise no_limiter(args)
    if args.json:
        shown_json = {"name": args.name} if snapshot is None else snapshot.as_json()
        if leases is not None:
            shown_json["concurrency"] = leases_json(leases)
        print(json.dumps(shown_json, indent=2))
    else:
        lines = [f"limiter       {shown(args.name)}"] if snapshot is None else render(snapshot)
        print("\n".join(lines + ([] if leases is None else render_leases(leases))))
    return 0


def render(snapshot: Snapshot) -> list[str]:
    """``aiolimit inspect``'s lines."""
    config = snapshot.config
    keep_alive = config.keep_alive
    lines = [
        f"limiter       {shown(snapshot.name)}",
        f"rates         {rates(config)} ({config.algorithm.value}, {config.rate_type.value})",
        "keep_alive    " + ("none" if keep_alive is None else seconds(keep_alive.total_seconds())),
        "expires       " + ("never" if snapshot.ttl_s is None else f"in {seconds(snapshot.ttl_s)}"),
    ]
    if config.min_spacing is not None:
        lines.append(f"min spacing   {seconds(config.min_spacing.total_seconds())}")
    lines.append(f"blocked       {blocked(snapshot.blocked_s)}")
    if snapshot.ceiling is not None:
        lines.append(f"learned       {learned(config.rates, snapshot.ceiling)}")
    most = config.max_permits
    if snapshot.available is not None:
        lines.append(f"available     {snapshot.available} of {plural(most, 'permit')} now")
    if snapshot.in_window is not None:
        lines.append(f"in window     {snapshot.in_window} of {plural(most, 'permit')} taken")
    if snapshot.keeps_a_log:
        lines.append(f"reservations  {_queued(snapshot)}")
        lines.append(f"grants        {snapshot.budget.grants:,} since the state began")
    if snapshot.per_client:
        lines += _clients(snapshot)
    if snapshot.memory_bytes is None:
        lines.append("memory        n/a (MEMORY USAGE refused)")
    else:
        lines.append(
            f"memory        {size(snapshot.memory_bytes)} in "
            f"{plural(snapshot.memory_keys, 'key')}"
            + (" (the clients read)" if snapshot.per_client else "")
        )
    lines.append(f"slot          {snapshot.slot} on {snapshot.node}")
    return lines


def _queued(snapshot: Snapshot) -> str:
    ahead = snapshot.budget.reservations
    permits = plural(ahead.permits, "permit")
    if ahead.partial:
        permits = permits.replace(" ", "+ ", 1)
    queued = f"{ahead.count:,} waiting ({permits})"
    if ahead.count:
        queued += f", the furthest starts in {seconds(ahead.furthest_s)}"
    return queued


def _clients(snapshot: Snapshot) -> list[str]:
    """The PER_CLIENT lines: how many clients, and the busiest (a log's: with their grants)."""
    lines = [
        f"clients       {snapshot.clients_registered:,} in the registry, "
        f"{snapshot.clients_read:,} read, {snapshot.clients_with_state:,} with state"
    ]
    if not snapshot.busiest:
        return lines
    width = max(len(shown(client.client_id)) for client in snapshot.busiest)
    header = f"busiest       {'client':<{width}}  available"
    if snapshot.keeps_a_log:
        header += "  reserved  grants  last grant"
    lines.append(header)
    lines += [
        f"              {_client_row(c, width, snapshot.keeps_a_log)}" for c in snapshot.busiest
    ]
    return lines


def _client_row(client: Client, width: int, log: bool) -> str:
    row = f"{shown(client.client_id):<{width}}  {client.available:>9}"
    if log:
        row += f"  {client.reserved:>8}  {client.grants:>6}  {seconds(client.last_grant_ago_s)} ago"
    return row


# -- list ----------------------------------------------------------------------------------------


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pattern",
        metavar="PATTERN",
        nargs="?",
        default="*",
        help=f"a glob on names: {SYNTAX} (default *)",
    )


async def _list(args: argparse.Namespace, backend: RedisBackend) -> int:
    names = sorted({name async for name in limiter_names(backend, args.pattern)})
    configs: list[RateLimiterConfig | None] = []
    for start in range(0, len(names), 500):
        part = names[start : start + 500]
        configs += await asyncio.gather(*(backend.get_config(name) for name in part))
    rows = [(shown(n), c) for n, c in zip(names, configs, strict=True) if c is not None]
    if not rows:
        print(f"no limiter matches '{shown(args.pattern)}'", file=sys.stderr)
        return 0
    columns = [(name, rates(c), c.algorithm.value, c.rate_type.value) for name, c in rows]
    widths = [max(len(row[i]) for row in columns) for i in range(3)]
    for row in columns:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]))
    return 0


INSPECT = command("inspect", _inspect_arguments, _inspect)
LIST = command("list", _list_arguments, _list)
