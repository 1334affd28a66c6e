"""What every benchmark script shares: a throwaway redis-server, medians over rounds, the
counters a grant's cost is read from, checkouts side by side, and the table or ``--json``.

A script measures in its own process, or, given ``--checkout PATH`` (repeatable), runs
itself once per round and checkout in a fresh process importing ``aiolimit`` from PATH (the
checkouts alternate, round after round), and prints the medians side by side:

    git archive main aiolimit | tar -x -C /tmp/aiolimit-main
    python benchmarks/throughput.py --checkout /tmp/aiolimit-main --checkout . --rounds 5

The child is the same script with ``--child``: it measures once and prints one JSON object
as its last line of output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # this checkout: its aiolimit is the one measured unless told otherwise
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def _this_checkout_first() -> None:
    """``python benchmarks/x.py`` measures this checkout's ``aiolimit`` (and runs its
    ``tools``), not one installed from elsewhere: its root goes right after ``PYTHONPATH``'s
    entries, which a ``--checkout`` child is given (its ``aiolimit`` first)."""
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if str(ROOT) not in sys.path:
        sys.path.insert(1 + len(given), str(ROOT))


_this_checkout_first()


# -- numbers ------------------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def percentile(ordered: Sequence[float], share: float) -> float | None:
    """The value at ``share`` (0..1) of an ascending sequence; None when it is empty."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def number(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def ratio(value: float | None, base: float | None, lower_is_better: bool = False) -> str:
    """`` (1.23x)``: ``value`` against ``base``, above 1 when better; empty without both."""
    if not value or not base:
        return ""
    return f" ({(base / value if lower_is_better else value / base):.2f}x)"


# -- the server ---------------------------------------------------------------------------------


@contextmanager
def local_redis() -> Iterator[str]:
    """A redis-server on a free 127.0.0.1 port for the block; yields its URL."""
    from tools import LocalRedis

    with LocalRedis() as server:
        yield server.url


def flush(url: str) -> None:
    from redis import Redis

    with Redis.from_url(url) as redis:
        redis.flushall()


def machine(url: str | None = None) -> str:
    """The cores, the Python and the server, for the line above a table."""
    from tools import cpu_model

    about = f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}"
    if url is not None:
        from redis import Redis

        with Redis.from_url(url, socket_timeout=10) as redis:
            version = redis.info("server")["redis_version"]
        about += f", redis-server {version} on 127.0.0.1 (loopback)"
    return about


# -- what a grant costs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """The server's counters and this process's CPU time at one moment."""

    server_cpu: float  # seconds: INFO cpu, used_cpu_user + used_cpu_sys
    script_usec: int  # INFO commandstats: usec of the script commands
    client_cpu: float  # seconds: time.process_time()


@dataclass(frozen=True)
class Cost:
    """Per grant, in microseconds."""

    redis_cpu: float
    script: float
    client_cpu: float


def reading(redis: Any) -> Reading:
    """Now (a blocking INFO on a ``redis.Redis``: call it where the event loop may stop)."""
    client = time.process_time()
    cpu = redis.info("cpu")
    stats = redis.info("commandstats")
    script = sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in SCRIPT_COMMANDS)
    return Reading(float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), script, client)


def per_grant(before: Reading, after: Reading, grants: int) -> Cost:
    grants = max(grants, 1)
    return Cost(
        (after.server_cpu - before.server_cpu) * 1e6 / grants,
        (after.script_usec - before.script_usec) / grants,
        (after.client_cpu - before.client_cpu) * 1e6 / grants,
    )


def command_counts(url: str) -> tuple[int, int]:
    """(script calls, all commands) so far, from INFO commandstats; INFO, FLUSHALL and PING
    left out. Commands run inside scripts are counted too."""
    from redis import Redis

    with Redis.from_url(url) as redis:
        stats = redis.info("commandstats")
    scripts = total = 0
    for command, values in stats.items():
        name = command.removeprefix("cmdstat_")
        if name in ("info", "flushall", "ping"):
            continue
        total += values["calls"]
        scripts += values["calls"] if name in SCRIPT_COMMANDS else 0
    return scripts, total


# -- checkouts side by side ---------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """What one child process measures: ``aiolimit`` from ``path``, the script's ``extra``
    arguments added."""

    label: str
    path: Path = ROOT
    extra: tuple[str, ...] = ()


def checkouts(args: argparse.Namespace) -> list[Variant]:
    """One variant per ``--checkout`` (this checkout when none is given)."""
    paths: list[str] = args.checkout or []
    return [Variant(p, Path(p).resolve()) for p in paths] or [Variant("aiolimit (this checkout)")]


def alternate(
    script: str, variants: Sequence[Variant], rounds: int, child_args: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """Each variant once per round, in a fresh process (``script --child ...``), the variants
    alternating; every round's JSON, by label."""
    results: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    for number_ in range(rounds):
        for variant in variants:
            command = [sys.executable, script, "--child", *child_args, *variant.extra]
            env = {**os.environ, "PYTHONPATH": str(variant.path)}
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(f"{variant.label} failed:\n{done.stderr[-3000:]}")
            results[variant.label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            say(f"round {number_ + 1}/{rounds}: {variant.label} done")
    return results


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number over the rounds, nested dicts followed."""
    first = rounds[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = medians([r[key] for r in rounds])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = median(r[key] for r in rounds)
        else:
            out[key] = value
    return out


# -- the command line and the report ------------------------------------------------------------


def parser(doc: str | None, checkouts: bool = False) -> argparse.ArgumentParser:
    """A script's parser: the first line of its docstring, ``--json``, and with ``checkouts``
    ``--checkout``, ``--rounds`` and the hidden ``--child``."""
    text = doc or ""
    out = argparse.ArgumentParser(
        description=text.split("\n")[0],
        epilog="\n".join(text.split("\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    out.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    if checkouts:
        out.add_argument(
            "--checkout",
            action="append",
            metavar="PATH",
            help="a directory holding an aiolimit package (repeatable; this checkout if none)",
        )
        out.add_argument("--rounds", type=int, default=1, help="alternating rounds (1)")
        out.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return out


@dataclass
class Table:
    """A markdown table: the first ``left`` columns left-aligned, the others right-aligned."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str = ""
    left: int = 1

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = [f"{self.title}\n"] if self.title else []
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "---|" * self.left + "--:|" * (len(self.columns) - self.left))
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def report(
    args: argparse.Namespace, heading: str, tables: Sequence[Table], figures: dict[str, Any]
) -> None:
    """The tables under ``heading`` (the command, the machine), or, with ``--json``, the
    figures they were made from."""
    command = " ".join(["python", _relative(sys.argv[0]), *sys.argv[1:]])
    if args.json:
        print(json.dumps({"command": command, "about": heading, **figures}, indent=2))
        return
    print(f"Command: `{command}`\n\n{heading}\n")
    print("\n\n".join(table.markdown() for table in tables))


def _relative(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def say(text: str) -> None:
    """Progress, on stderr (stdout is the table or the JSON)."""
    print(f"  {text}", file=sys.stderr, flush=True)


def child_main(measure: Callable[[], dict[str, Any]]) -> None:
    """In a ``--child`` process: one measurement as one JSON line."""
    print(json.dumps(measure()))
