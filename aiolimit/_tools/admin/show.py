"""``aiolimit inspect`` and ``aiolimit list``: a live limiter in full, or every limiter in a
line each. Both only read."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from redis.exceptions import ResponseError

from ..._types import Rate, RateLimiterConfig
from ...backends._lease import LeaseSnapshot
from ...backends.redis import RedisBackend
from ..text import plural, seconds, shown, size
from .connect import command, name_argument, no_limiter
from .glob import SYNTAX, Found, limiters, redis_escape
from .leases import leases_json, render_leases
from .reading import Client, Snapshot, inspect_limiter
from .sharded import ShardedSnapshot, inspect_sharded, summed

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
    name = args.name
    snapshot = await inspect_limiter(backend, name)
    leases = await backend.leases(name)  # a concurrency limiter of that name
    try:
        shards = await _sharded_named(backend, name)
    except ResponseError:  # a user refused SCAN sees the rest, and is told if there is none
        if snapshot is None and leases is None:
            raise
        shards = None
    if snapshot is None and leases is None and shards is None:
        raise no_limiter(args)
    if args.json:
        print(json.dumps(_inspected_json(name, snapshot, leases, shards), indent=2))
        return 0
    lines = [] if snapshot is None else render(snapshot)
    if leases is not None:
        lines = (lines or [f"limiter       {shown(name)}"]) + render_leases(leases)
    if shards is not None:
        lines += ([""] if lines else []) + render_sharded(shards)
    print("\n".join(lines))
    return 0


async def _sharded_named(backend: RedisBackend, name: str) -> ShardedSnapshot | None:
    """The ``ShardedRateLimiter`` of that name, its shards found with SCAN; None: none."""
    found = await limiters(backend, redis_escape(name))
    sharded = next((each for each in found if each.sharded), None)
    return None if sharded is None else await inspect_sharded(backend, sharded)


def _inspected_json(
    name: str,
    snapshot: Snapshot | None,
    leases: LeaseSnapshot | None,
    shards: ShardedSnapshot | None,
) -> dict[str, Any]:
    """``inspect --json``: the limiter's figures; a sharded limiter's alone (with its
    ``shards``), or under ``sharded`` beside a limiter of the same name."""
    if snapshot is not None:
        shown_json = snapshot.as_json()
        if shards is not None:
            shown_json["sharded"] = shards.as_json()
    else:
        shown_json = {"name": name} if shards is None else shards.as_json()
    if leases is not None:
        shown_json["concurrency"] = leases_json(leases)
    return shown_json


def render_sharded(snapshot: ShardedSnapshot) -> list[str]:
    """``aiolimit inspect``'s lines for a sharded limiter: the sums, then a row a shard."""
    config = snapshot.config
    count = plural(len(snapshot.shards), "shard")
    lines = [f"limiter       {shown(snapshot.name)} (sharded: {count})"]
    if config is None:
        lines.append("rates         the shards' configs differ: see each")
    else:
        lines.append(
            f"rates         {rates(config)} ({config.algorithm.value}, "
            f"{config.rate_type.value}), summed over the shards"
        )
    lines.append(f"blocked       {blocked(snapshot.blocked_s)}")
    available = snapshot.available
    if available is not None and config is not None:
        most = plural(config.max_permits, "permit")
        lines.append(f"available     {available} of {most} now, summed over the shards")
    if snapshot.keeps_a_log:
        budget = snapshot.budget
        ahead = budget.reservations
        lines.append(f"reservations  {ahead.count:,} waiting ({plural(ahead.permits, 'permit')})")
        lines.append(f"grants        {budget.grants:,} since the state began")
    memory, keys = snapshot.memory
    used = "n/a (MEMORY USAGE refused)" if memory is None else size(memory)
    lines.append(f"memory        {used} in {plural(keys, 'key')}")
    return lines + _shard_rows(snapshot.shards)


def _shard_rows(shards: list[Snapshot]) -> list[str]:
    """The table of shards: name, rates, available, blocked, slot and node."""
    cells = [
        (
            shown(shard.name),
            rates(shard.config),
            "-" if shard.available is None else str(shard.available),
            "no" if shard.blocked_s is None else seconds(shard.blocked_s),
            f"{shard.slot} on {shard.node}",
        )
        for shard in shards
    ]
    header = ("shard", "rates", "available", "blocked", "slot")
    widths = [max(len(row[i]) for row in (header, *cells)) for i in range(len(header))]
    labels = ["shards", *[""] * len(cells)]
    return [
        f"{label:<14}" + "  ".join(_cell(row, widths, i) for i in range(len(row))).rstrip()
        for label, row in zip(labels, (header, *cells), strict=True)
    ]


def _cell(row: tuple[str, ...], widths: list[int], i: int) -> str:
    """A cell of a table: numbers (the third column) to the right."""
    return row[i].rjust(widths[i]) if i == 2 else row[i].ljust(widths[i])


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
    if snapshot.margin_s is not None:
        lines.append(f"margin        {seconds(snapshot.margin_s)}, measured: each interval longer")
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
    found = await limiters(backend, args.pattern)
    stored = [name for each in found for name in each.stored]
    configs: dict[str, RateLimiterConfig | None] = {}
    for start in range(0, len(stored), 500):
        part = stored[start : start + 500]
        read = await asyncio.gather(*(backend.get_config(name) for name in part))
        configs.update(zip(part, read, strict=True))
    rows = [row for each in found if (row := _list_row(each, configs)) is not None]
    if not rows:
        print(f"no limiter matches '{shown(args.pattern)}'", file=sys.stderr)
        return 0
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _list_row(
    found: Found, configs: dict[str, RateLimiterConfig | None]
) -> tuple[str, str, str, str, str] | None:
    """A line of ``list``: name, rates, algorithm, type (a sharded limiter's summed, and how
    many shards); None for a limiter whose config is gone."""
    read = [config for name in found.stored if (config := configs.get(name)) is not None]
    if not read:
        return None
    config = summed(read) if found.sharded else read[0]
    shards = f"sharded: {plural(len(read), 'shard')}" if found.sharded else ""
    if config is None:
        return shown(found.name), "(the shards' configs differ)", "-", "-", shards
    return shown(found.name), rates(config), config.algorithm.value, config.rate_type.value, shards


INSPECT = command("inspect", _inspect_arguments, _inspect)
LIST = command("list", _list_arguments, _list)
