"""Calls per second of aiolimit beside the other Python Redis rate limiters, and what each
grant costs Redis and the client.

    pip install -e '.[bench]'
    python benchmarks/throughput.py                      # (a) and (b), 1 s each: ~30 s
    python benchmarks/throughput.py --full               # (a)-(d) and the soak row: ~2.5 min
    python benchmarks/throughput.py --checkout /tmp/aiolimit-main --checkout . --rounds 5
    python benchmarks/throughput.py --otel --rounds 5    # nothing attached / OpenTelemetry
    python benchmarks/throughput.py --sharded            # ShardedRateLimiter, K = 1, 2, 3

Starts its own redis-server on a free 127.0.0.1 port and measures every contender against
it, one after another (benchmarks/_contenders.py; peers not installed are left out):

(a) 64 tasks on 1 limiter that never refuses: calls/s
(b) 64 tasks over ``--limiters`` (10 000) limiters: calls/s
(c) 1 task, one call at a time: latency p50/p99 in µs (``--full``)
(d) saturation, benchmarks/_saturation.py (``--full``)

Beside (a) and (b), per grant: Redis's CPU (INFO cpu), its time in scripts (INFO
commandstats) and this process's CPU, read before and after the measured stretch. Redis is
single threaded: 1 / (Redis CPU per grant) is the most grants per second one node gives a
whole fleet. Ratios are to the best peer library (the references are left out of "best").

``--checkout PATH`` (repeatable) runs aiolimit alone, each checkout in a fresh process,
alternating round after round, every ``--algorithm``, with ratios to the first checkout;
``--otel`` adds this checkout with nothing attached and with an OpenTelemetry observer.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from _contenders import Aiolimit, Contender, all_contenders, missing
from _harness import (
    Cost,
    Table,
    Variant,
    alternate,
    checkouts,
    child_main,
    flush,
    local_redis,
    machine,
    medians,
    number,
    parser,
    per_grant,
    ratio,
    reading,
    report,
    say,
)

NEVER_REFUSED = 1_000_000  # permits per second: far above any throughput here
TASKS = 64
COSTS = ("redis_cpu", "script", "client_cpu")


async def throughput(contender: Contender, url: str, limiters: int, seconds: float) -> dict:
    """Calls per second, calls refused, and what each call cost Redis and this process."""
    from redis import Redis

    await contender.open(url, [f"bench-{i}" for i in range(limiters)], NEVER_REFUSED, 1.0)
    calls = refused = 0
    measuring = stopping = False

    async def task(seed: int) -> None:
        nonlocal calls, refused
        pick = random.Random(seed).randrange
        while not stopping:
            granted = await contender.hit(pick(limiters) if limiters > 1 else 0)
            if measuring:
                calls += 1
                refused += not granted

    tasks = [asyncio.ensure_future(task(seed)) for seed in range(TASKS)]
    await asyncio.sleep(min(0.5, seconds / 4))  # warm up: connections, script cache
    with Redis.from_url(url) as meter:
        before = reading(meter)  # (blocks the loop for a moment: nothing is counted)
        measuring = True
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - began
        after = reading(meter)
    stopping = True
    await asyncio.gather(*tasks)
    await contender.close()
    cost: Cost = per_grant(before, after, calls)
    return {"calls": calls / elapsed, "refused": refused, **cost.__dict__}


async def latency(contender: Contender, url: str, seconds: float) -> dict[str, float]:
    """(c): one task, one call at a time."""
    await contender.open(url, ["bench-latency"], NEVER_REFUSED, 1.0)
    for _ in range(200):
        await contender.hit(0)
    samples: list[float] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = clock()
        await contender.hit(0)
        samples.append((clock() - before) / 1000)
    await contender.close()
    samples.sort()
    return {"p50": samples[len(samples) // 2], "p99": samples[int(len(samples) * 0.99)]}


def measure(contender: Contender, url: str, args: Any) -> dict[str, Any]:
    """Every scenario asked for, for one contender, each on a flushed server."""
    out: dict[str, Any] = {}
    for key, count in (("a", 1), ("b", args.limiters)):
        flush(url)
        out[key] = asyncio.run(throughput(contender, url, count, args.duration))
    if args.latency:
        flush(url)
        out["c"] = asyncio.run(latency(contender, url, args.latency))
    if args.saturation:
        from _saturation import saturation

        flush(url)
        out["d"] = saturation(contender, url, args.saturation)
    refused = out["a"]["refused"] + out["b"]["refused"]
    say(f"{contender.name}: done" + (f", {refused} calls refused" if refused else ""))
    return out


# -- every contender, in this process -----------------------------------------------------------


def peers(args: Any) -> None:
    contenders = all_contenders()
    if args.only:
        contenders = [c for c in contenders if c.name in args.only or c.reference]
    if missing():
        say(f"not installed, left out: {', '.join(missing())} (pip install -e '.[bench]')")
    with local_redis() as url:
        rows = {c.name: measure(c, url, args) for c in contenders}
        soaked: dict[str, Any] = {}
        if args.saturation and "aiolimit" in rows:
            from _saturation import soak

            flush(url)
            soaked = soak(url, args.saturation)
        about = machine(url)
    best = {c.name for c in contenders if not c.reference and not c.name.startswith("aiolimit")}
    tables = [cost_table(rows, best, args.limiters)]
    if args.latency or args.saturation:
        tables.insert(0, scenario_table(rows, best, soaked))
    report(args, f"Machine: {about}.", tables, {"contenders": rows, "soak": soaked})


def _best(rows: dict[str, dict], names: set[str], path: tuple[str, str], lowest: bool) -> Any:
    values = [rows[n].get(path[0], {}).get(path[1]) for n in names]
    present = [v for v in values if v is not None]
    if not present:
        return None
    return min(present) if lowest else max(present)


def cost_table(rows: dict[str, dict], best: set[str], limiters: int) -> Table:
    columns = ["contender"]
    for key, title in (("a", "(a) 1 limiter"), ("b", f"(b) {limiters:,} limiters")):
        columns += [f"{title}, calls/s", f"({key}) Redis CPU µs / grant"]
        columns += [f"({key}) script µs / grant", f"({key}) client CPU µs / grant"]
    out = Table(columns)
    for name, figures in rows.items():
        cells = [name]
        for key in ("a", "b"):
            calls = figures[key]["calls"]
            cells.append(number(calls) + ratio(calls, _best(rows, best, (key, "calls"), False)))
            for cost in COSTS:
                value = figures[key][cost]
                top = _best(rows, best, (key, cost), True)
                cells.append(number(value, 1) + ratio(value, top, lower_is_better=True))
        out.add(*cells)
    return out


def scenario_table(rows: dict[str, dict], best: set[str], soaked: dict[str, Any]) -> Table:
    out = Table(
        ["contender", "(c) 1 task p50 / p99 µs", "(d) utilisation", "(d) script calls / grant",
         "(d) all commands / grant", "(d) lateness p50 / p99 ms"]
    )  # fmt: skip
    best_p50 = _best(rows, best, ("c", "p50"), True)
    for name, figures in [*rows.items(), ("aiolimit, soak tool (limiter time)", {"d": soaked})]:
        if not figures.get("d") and not figures.get("c"):
            continue
        c, d = figures.get("c", {}), figures.get("d", {})
        out.add(
            name,
            f"{number(c.get('p50'))} / {number(c.get('p99'))}"
            + ratio(c.get("p50"), best_p50, lower_is_better=True),
            number(d.get("utilisation") and d["utilisation"] * 100, 1, "%"),
            number(d.get("scripts_per_grant"), 2),
            number(d.get("commands_per_grant"), 1),
            f"{number(d.get('lateness_p50_ms'), 2)} / {number(d.get('lateness_p99_ms'), 2)}",
        )
    return out


# -- aiolimit alone, checkouts side by side -----------------------------------------------------


def one_round(args: Any) -> dict[str, Any]:
    """In a child: every algorithm's scenarios, this process's aiolimit."""
    import aiolimit

    counted = None
    if args.observer == "otel":
        counted = _observe()
    out: dict[str, Any] = {}
    for algorithm in args.algorithm:
        figures = measure(Aiolimit(aiolimit.Algorithm(algorithm.upper())), args.url, args)
        for key, value in figures.items():
            out[f"{algorithm} ({key})"] = value
    if counted is not None:
        out["counted"] = counted()
    return out


def _observe() -> Any:
    """OpenTelemetryObserver on an SDK MeterProvider; returns what reads the requests counted."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    import aiolimit
    from aiolimit.otel import OpenTelemetryObserver

    reader = InMemoryMetricReader()
    aiolimit.observe(OpenTelemetryObserver(MeterProvider(metric_readers=[reader])))

    def counted() -> int:
        data = reader.get_metrics_data()
        metrics = {m.name: m for s in data.resource_metrics[0].scope_metrics for m in s.metrics}
        return int(sum(p.value for p in metrics["aiolimit.requests"].data.data_points))

    return counted


def side_by_side(args: Any) -> None:
    variants = checkouts(args) if args.checkout or not args.otel else []
    if args.otel:
        variants.append(Variant("nothing attached"))
        variants.append(Variant("OpenTelemetry attached", extra=("--observer", "otel")))
    with local_redis() as url:
        child = [
            "--url", url, "--duration", str(args.duration), "--limiters", str(args.limiters),
            "--latency", str(args.latency), "--algorithm", ",".join(args.algorithm),
        ]  # fmt: skip
        results = alternate(__file__, variants, args.rounds, child)
        about = machine(url)
    figures = {label: medians(rounds) for label, rounds in results.items()}
    first = next(iter(figures.values()))
    out = Table(
        ["scenario", "checkout", "calls/s", "Redis CPU µs / grant", "script µs / grant",
         "client CPU µs / grant"],
        left=2,
    )  # fmt: skip
    for scenario in (k for k in first if k != "counted"):
        for label, medianed in figures.items():
            out.add(scenario, label, *_compared(medianed[scenario], first[scenario]))
    heading = f"Machine: {about}. Medians of {args.rounds} alternating rounds."
    report(args, heading, [out], {"medians": figures, "rounds": results})


def _compared(row: dict[str, float], first: dict[str, float]) -> list[str]:
    """A scenario's cells, each with its ratio to the first checkout's (better above 1)."""
    if "p50" in row:  # (c): the latency, in the calls/s column
        text = f"{number(row['p50'])} / {number(row['p99'])} µs p50 / p99"
        return [text + ("" if row is first else ratio(row["p50"], first["p50"], True)), "", "", ""]
    cells = []
    for name in ("calls", *COSTS):
        digits, lower = (0, False) if name == "calls" else (1, True)
        text = number(row[name], digits)
        cells.append(text + ("" if row is first else ratio(row[name], first[name], lower)))
    return cells


def main() -> None:
    cli = parser(__doc__, checkouts=True)
    cli.add_argument("--duration", type=float, default=1.0, help="seconds per (a)/(b) run (1)")
    cli.add_argument("--latency", type=float, default=0.0, help="seconds of (c) (0: none)")
    cli.add_argument("--saturation", type=float, default=0.0, help="seconds of (d) (0: none)")
    cli.add_argument("--full", action="store_true", help="(a)-(d) at 3 / 3 / 2 / 8 s, the soak")
    cli.add_argument("--limiters", type=int, default=10_000, help="limiters in (b) (10000)")
    cli.add_argument("--only", action="append", help="this contender only (repeatable)")
    cli.add_argument(
        "--algorithm",
        type=lambda text: text.split(","),
        default=["sliding_window", "token_bucket", "fixed_window"],
        help="with --checkout / --otel: comma-separated (all three)",
    )
    cli.add_argument("--otel", action="store_true", help="aiolimit observed and not")
    cli.add_argument("--sharded", action="store_true", help="ShardedRateLimiter on a cluster")
    cli.add_argument("--processes", type=int, default=2, help="with --sharded (2)")
    cli.add_argument("--workers", type=int, default=8, help="with --sharded: clients each (8)")
    cli.add_argument("--interval", type=float, default=1.0, help="with --sharded: window, s")
    cli.add_argument("--url", help=argparse.SUPPRESS)
    cli.add_argument("--observer", choices=["otel"], help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.full:
        args.duration, args.latency, args.saturation = 3.0, 2.0, 8.0
    if args.child:
        child_main(lambda: one_round(args))
    elif args.sharded:
        from _sharded import sharded

        table = sharded(args.processes, args.workers, args.duration, args.interval)
        heading = (
            f"Machine: {machine()}. 3 masters + 3 replicas on 127.0.0.1, {args.processes} "
            f"processes x {args.workers} clients, {args.duration:g} s per row, "
            f"window {args.interval:g} s."
        )
        report(args, heading, [table], {"rows": table.rows})
    elif args.checkout or args.otel:
        side_by_side(args)
    else:
        peers(args)


if __name__ == "__main__":
    main()
