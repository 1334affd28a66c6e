"""aiolimit against the other Python Redis rate limiters, side by side, in one run.

    pip install -e '.[bench]'
    python benchmarks/run.py                 # about 2.5 minutes
    python benchmarks/run.py --quick         # under a minute, noisier
    python benchmarks/run.py --write docs/benchmarks.md   # also replace the table there
    python benchmarks/run.py --costs         # (a) and (b) with their costs per grant, ~1 minute
    python benchmarks/run.py --otel          # aiolimit alone, with and without OpenTelemetry
    python benchmarks/run.py --otel --baseline /tmp/aiolimit-before   # and an older checkout

Starts its own redis-server on a free 127.0.0.1 port (stopped at the end) and measures every
contender against it, one after another, in this process:

(a) 64 tasks on 1 limiter that never refuses: calls/s
(b) 64 tasks over 10 000 limiters: calls/s
(c) 1 task, one call at a time: latency p50/p99 in microseconds
(d) saturation: 4 processes x 16 tasks on one limiter at 200 permits/s, each task calling the
    library's own blocking acquire in a loop: utilisation (permits granted / what the rate
    allows), Redis script calls and all Redis commands (INFO commandstats, commands run
    inside scripts included) per grant, and waiter lateness: for a grant returned at wall time
    t, when the grant ``rate`` places earlier left the window (t_k + interval) is the moment
    a permit was free; a caller that asked before then waited, and was late by t - that
    moment. aiolimit is also run through its soak tool (``python -m tools.soak --json``).

Beside (a) and (b), what each grant cost (benchmarks/costs.py): Redis's own CPU time (INFO cpu,
used_cpu_user + used_cpu_sys) and its script time (INFO commandstats, EVAL/EVALSHA/FCALL usec),
read before and after each contender's measured stretch, and this process's CPU time over the
same stretch, each divided by the grants. Redis is single threaded: 1 / (Redis CPU per grant)
is the most grants per second one node can give a whole fleet of clients.

Ratios are to the best peer library (the references are left out of "best").

``--otel`` measures the cost of observing instead: (a), (b) and (c) for aiolimit alone, with
nothing attached and with ``aiolimit.otel.OpenTelemetryObserver`` on an OpenTelemetry SDK
``MeterProvider`` (an in-memory reader, read at the end), in alternating rounds, each round
a fresh process; ``--baseline DIR`` adds a checkout of an earlier aiolimit (imported from
DIR), to show that nothing attached costs nothing. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import costs
from contenders import Contender, all_contenders, by_name

from tools import LocalRedis, cpu_model

NEVER_REFUSED = 1_000_000  # permits per second: far above any throughput here
MANY = 10_000
TASKS = 64
SATURATION_RATE = 200
SATURATION_PROCESSES = 4
SATURATION_TASKS = 16
START, END = "<!-- benchmark table: start -->", "<!-- benchmark table: end -->"


@dataclass(frozen=True)
class Throughput:
    calls: float  # per second
    refused: int
    cost: costs.Cost  # per grant


@dataclass
class Row:
    contender: Contender
    single: float | None = None  # (a) calls/s
    many: float | None = None  # (b) calls/s
    single_cost: costs.Cost | None = None
    many_cost: costs.Cost | None = None
    p50: float | None = None  # (c) µs
    p99: float | None = None
    refused: int = 0
    saturation: dict[str, Any] = field(default_factory=dict)


def flush(url: str) -> None:
    with Redis.from_url(url) as redis:
        redis.flushall()


# -- (a), (b): throughput -----------------------------------------------------------------------


async def throughput(contender: Contender, url: str, limiters: int, seconds: float) -> Throughput:
    """Calls per second, calls refused, and what each call cost Redis and this process."""
    names = [f"bench-{i}" for i in range(limiters)]
    await contender.open(url, names, NEVER_REFUSED, 1.0)
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
        before = costs.reading(meter)  # (blocks the loop for a moment: nothing is counted)
        measuring = True
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - began
        after = costs.reading(meter)
    stopping = True
    await asyncio.gather(*tasks)
    await contender.close()
    return Throughput(calls / elapsed, refused, costs.per_grant(before, after, calls))


# -- (c): latency -------------------------------------------------------------------------------


async def latency(contender: Contender, url: str, seconds: float) -> tuple[float, float]:
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
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


# -- (d): saturation ----------------------------------------------------------------------------


def _saturation_worker(
    name: str, url: str, shared_begin: Any, seconds: float, ready: Any, results: Any
) -> None:
    results.put(asyncio.run(_saturation_tasks(name, url, shared_begin, seconds, ready)))


async def _saturation_tasks(
    name: str, url: str, shared_begin: Any, seconds: float, ready: Any
) -> list[tuple[float, float]]:
    contender = by_name(name)
    await contender.open(url, ["bench-saturation"], SATURATION_RATE, 1.0)
    ready.put(os.getpid())
    while not shared_begin.value:  # noqa: ASYNC110 (a value shared between processes)
        await asyncio.sleep(0.01)
    begin = shared_begin.value
    end = begin + seconds
    grants: list[tuple[float, float]] = []  # (asked, returned), wall clock

    async def task() -> None:
        while time.time() < end:
            asked = time.time()
            await contender.acquire(0)
            grants.append((asked, time.time()))

    await asyncio.sleep(max(0.0, begin - time.time()))
    tasks = [asyncio.ensure_future(task()) for _ in range(SATURATION_TASKS)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.time()) + 2.0)
    for pending_task in pending:
        pending_task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await contender.close()
    return grants


def _command_counts(url: str) -> tuple[int, int]:
    """(script calls, all commands) so far, from INFO commandstats, INFO itself left out."""
    with Redis.from_url(url) as redis:
        stats = redis.info("commandstats")
    scripts = total = 0
    for command, values in stats.items():
        name = command.removeprefix("cmdstat_")
        if name in ("info", "flushall", "ping"):
            continue
        total += values["calls"]
        if name in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"):
            scripts += values["calls"]
    return scripts, total


def saturation(contender: Contender, url: str, seconds: float) -> dict[str, Any]:
    if not contender.blocking:
        return {}
    # The limiter's config (aiolimit) is written once, before the processes start.
    asyncio.run(_configure_saturation(contender, url))
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    begin = context.Value("d", 0.0)  # set once every process has opened its client
    processes = [
        context.Process(
            target=_saturation_worker,
            args=(contender.name, url, begin, seconds, ready, results),
        )
        for _ in range(SATURATION_PROCESSES)
    ]
    for process in processes:
        process.start()
    for _ in processes:
        ready.get(timeout=60)
    begin.value = time.time() + 0.2
    start, end = begin.value, begin.value + seconds
    scripts_before, total_before = _command_counts(url)
    grants = [grant for _ in processes for grant in results.get(timeout=seconds + 60)]
    for process in processes:
        process.join(10)
    scripts_after, total_after = _command_counts(url)
    return _saturation_figures(
        grants, start, end, scripts_after - scripts_before, total_after - total_before
    )


async def _configure_saturation(contender: Contender, url: str) -> None:
    await contender.open(url, ["bench-saturation"], SATURATION_RATE, 1.0)
    await contender.close()


def _saturation_figures(
    grants: list[tuple[float, float]], begin: float, end: float, scripts: int, total: int
) -> dict[str, Any]:
    grants.sort(key=lambda grant: grant[1])
    returned = [grant[1] for grant in grants]
    lateness = []
    for i, (asked, at) in enumerate(grants):
        if i < SATURATION_RATE:
            continue
        free = returned[i - SATURATION_RATE] + 1.0  # that grant left the window: room for one
        if free > asked:  # it had to wait
            lateness.append(max(0.0, at - free) * 1000)
    inside = sum(begin <= at <= end for at in returned)
    allowed = SATURATION_RATE * math.ceil(end - begin)
    lateness.sort()
    return {
        "utilisation": inside / allowed,
        "scripts_per_grant": scripts / max(1, len(grants)),
        "commands_per_grant": total / max(1, len(grants)),
        "lateness_p50_ms": lateness[len(lateness) // 2] if lateness else None,
        "lateness_p99_ms": lateness[int(len(lateness) * 0.99)] if lateness else None,
        "grants": len(grants),
    }


def soak(url: str, seconds: float) -> dict[str, Any]:
    """aiolimit's own soak tool on the same server: acquire(1) only, 4 x 16 at 200/s."""
    command = [
        sys.executable, "-m", "tools.soak", "--json", "--quiet", "--redis", url,
        "--processes", str(SATURATION_PROCESSES), "--tasks", str(SATURATION_TASKS),
        "--rate", str(SATURATION_RATE), "--duration", str(seconds), "--mix", "1,0,0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"soak tool failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
        return {}
    return report


# -- the table ----------------------------------------------------------------------------------


def _number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, best: float | None, lower_is_better: bool = False) -> str:
    if not value or not best:
        return ""
    ratio = best / value if lower_is_better else value / best
    return f" ({ratio:.2f}x)"


def table(rows: list[Row], soaked: dict[str, Any]) -> str:
    peers = _peers(rows)

    def best(values: list[float | None], lowest: bool = False) -> float | None:
        present = [v for v in values if v is not None]
        if not present:
            return None
        return min(present) if lowest else max(present)

    best_single = best([r.single for r in peers])
    best_many = best([r.many for r in peers])
    best_p50 = best([r.p50 for r in peers], lowest=True)
    lines = [
        "| contender | (a) 64 tasks, 1 limiter, calls/s | (b) 64 tasks, 10 000 limiters, "
        "calls/s | (c) 1 task p50 / p99 µs | (d) utilisation | (d) script calls / grant "
        "| (d) all commands / grant | (d) lateness p50 / p99 ms |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        sat = r.saturation
        lines.append(
            f"| {r.contender.name} "
            f"| {_number(r.single)}{_ratio(r.single, best_single)} "
            f"| {_number(r.many)}{_ratio(r.many, best_many)} "
            f"| {_number(r.p50)} / {_number(r.p99)}{_ratio(r.p50, best_p50, True)} "
            f"| {_percent(sat.get('utilisation'))} "
            f"| {_number(sat.get('scripts_per_grant'), 2)} "
            f"| {_number(sat.get('commands_per_grant'), 1)} "
            f"| {_number(sat.get('lateness_p50_ms'), 2)} / "
            f"{_number(sat.get('lateness_p99_ms'), 2)} |"
        )
    if soaked:
        lines.append(
            "| aiolimit, soak tool (limiter-time audit) | | | "
            f"| {_percent(soaked.get('utilisation'))} "
            f"| {_number(soaked.get('scripts_per_permit'), 2)} "
            f"| {_number(soaked.get('commands_per_permit'), 1)} "
            f"| {_number(soaked.get('lateness_p50_ms'), 2)} / "
            f"{_number(soaked.get('lateness_p99_ms'), 2)} |"
        )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _peers(rows: list[Row]) -> list[Row]:
    return [
        r for r in rows if not r.contender.reference and not r.contender.name.startswith("aiolimit")
    ]


def cost_table(rows: list[Row]) -> str:
    """What each grant of (a) and (b) cost Redis (its CPU, and the part spent in scripts) and
    the client process (its CPU); ratios to the best peer (lowest cost)."""

    def best(costs_of: list[costs.Cost | None], attr: str) -> float | None:
        present = [getattr(c, attr) for c in costs_of if c is not None]
        return min(present) if present else None

    peers = _peers(rows)
    columns = [(scenario, attr) for scenario in ("single", "many") for attr in COST_FIELDS]
    bests = {
        (scenario, attr): best([getattr(r, f"{scenario}_cost") for r in peers], attr)
        for scenario, attr in columns
    }
    lines = [
        "| contender | (a) calls/s | (a) Redis CPU µs / grant | (a) script µs / grant "
        "| (a) client CPU µs / grant | (b) calls/s | (b) Redis CPU µs / grant "
        "| (b) script µs / grant | (b) client CPU µs / grant |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        cells = [r.contender.name]
        for scenario in ("single", "many"):
            cells.append(_number(getattr(r, scenario)))
            cost = getattr(r, f"{scenario}_cost")
            for attr in COST_FIELDS:
                value = None if cost is None else getattr(cost, attr)
                cells.append(f"{_number(value, 1)}{_ratio(value, bests[scenario, attr], True)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


COST_FIELDS = ("redis_cpu", "script", "client_cpu")


def targets(rows: list[Row]) -> str:
    """The issues' targets, each said met or missed, by how much."""
    out: list[str] = []

    def say(what: str, ok: bool, detail: str) -> None:
        out.append(f"- {what}: **{'met' if ok else 'missed'}** ({detail})")

    peers = _peers(rows)
    ours = [r for r in rows if r.contender.name.startswith("aiolimit")]
    for row in ours if peers else []:
        name = row.contender.name
        for label, attr in (("(a)", "single"), ("(b)", "many")):
            mine, best = getattr(row, attr), max(getattr(r, attr) for r in peers)
            goal = 3 if name == "aiolimit" else 5
            say(
                f"{label} {name} ≥ {goal}x the best peer",
                mine >= goal * best,
                f"{mine / best:.2f}x",
            )
    for row in ours:
        name = row.contender.name
        goal = 8 if name == "aiolimit" else 5
        if row.many_cost is not None:
            cpu = row.many_cost.redis_cpu
            say(f"(b) {name} Redis CPU ≤ {goal} µs / grant", cpu <= goal, f"{cpu:.1f} µs")
        if row.single_cost is not None:
            cpu = row.single_cost.redis_cpu
            say(f"(a) {name} Redis CPU ≤ 3 µs / grant", cpu <= 3, f"{cpu:.1f} µs")
        if row.many_cost is not None:
            cpu = row.many_cost.client_cpu
            say(f"(b) {name} client CPU ≤ 12 µs / grant", cpu <= 12, f"{cpu:.1f} µs")
    default = next((r for r in ours if r.contender.name == "aiolimit"), None)
    if default is not None:
        out += _latency_and_saturation(default, rows)
    return "\n".join(out)


def _latency_and_saturation(ours: Row, rows: list[Row]) -> list[str]:
    out: list[str] = []

    def say(what: str, ok: bool, detail: str) -> None:
        out.append(f"- {what}: **{'met' if ok else 'missed'}** ({detail})")

    evalsha = next((r for r in rows if r.contender.name.startswith("redis-py EVALSHA")), None)
    if evalsha is not None and ours.p50 is not None and evalsha.p50 is not None:
        say(
            "(c) 1-task latency not worse than a plain EVALSHA",
            ours.p50 <= evalsha.p50 * 1.05,
            f"p50 {ours.p50:.0f} µs vs {evalsha.p50:.0f} µs, "
            f"p99 {ours.p99:.0f} µs vs {evalsha.p99:.0f} µs",
        )
    sat = ours.saturation
    if sat:
        say(
            "(d) ≤ 1.5 Redis requests per grant",
            sat["scripts_per_grant"] <= 1.5,
            f"{sat['scripts_per_grant']:.2f} script calls per grant, the only requests aiolimit "
            f"sends; {sat['commands_per_grant']:.1f} counting the commands run inside the script",
        )
        say("(d) utilisation ≥ 99%", sat["utilisation"] >= 0.99, _percent(sat["utilisation"]))
        p50, p99 = sat["lateness_p50_ms"], sat["lateness_p99_ms"]
        say("(d) lateness p50 ≤ 2 ms", p50 is not None and p50 <= 2, f"{_number(p50, 2)} ms")
        say("(d) lateness p99 ≤ 10 ms", p99 is not None and p99 <= 10, f"{_number(p99, 2)} ms")
    return out


def machine(url: str) -> str:
    with Redis.from_url(url) as redis:
        version = redis.info("server")["redis_version"]
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
        f"redis-server {version} on 127.0.0.1 (loopback), every contender on the same server"
    )


def write(path: Path, command: str, text: str) -> None:
    block = f"{START}\n\nCommand: `{command}`\n\n{text}\n\n{END}"
    doc = path.read_text() if path.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in doc:
        doc += f"\n{START}\n{END}\n"
    doc = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
    path.write_text(doc)


# -- the cost of observing (--otel) ---------------------------------------------------------------

OBSERVED = ("nothing attached", "OpenTelemetryObserver attached")


def observed_round(variant: str, url: str, duration: float, latency_s: float) -> dict[str, Any]:
    """One round of (a), (b), (c) for aiolimit in this process, observed as ``variant`` says."""
    reader = None
    if variant == "otel":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        import aiolimit
        from aiolimit.otel import OpenTelemetryObserver

        reader = InMemoryMetricReader()
        aiolimit.observe(OpenTelemetryObserver(MeterProvider(metric_readers=[reader])))
    contender = by_name("aiolimit")
    figures: dict[str, Any] = {}
    flush(url)
    single = asyncio.run(throughput(contender, url, 1, duration))
    figures["single"], figures["cpu_single"] = single.calls, single.cost.client_cpu
    flush(url)
    many = asyncio.run(throughput(contender, url, MANY, duration))
    figures["many"], figures["cpu_many"] = many.calls, many.cost.client_cpu
    flush(url)
    figures["p50"], figures["p99"] = asyncio.run(latency(contender, url, latency_s))
    if reader is not None:  # the adapter did count: every request, as granted
        data = reader.get_metrics_data()
        assert data is not None
        metrics = {m.name: m for s in data.resource_metrics[0].scope_metrics for m in s.metrics}
        points = metrics["aiolimit.requests"].data.data_points
        figures["counted"] = sum(p.value for p in points)  # type: ignore[union-attr]
    return figures


def observing_cost(args: argparse.Namespace) -> str:
    variants = [("none", OBSERVED[0], None), ("otel", OBSERVED[1], None)]
    if args.baseline:
        variants.insert(0, ("none", f"before observe() ({args.baseline.name})", args.baseline))
    results: dict[str, list[dict[str, Any]]] = {label: [] for _, label, _ in variants}
    with LocalRedis() as server:
        for round_number in range(args.rounds):
            for variant, label, path in variants:
                # This checkout's aiolimit, or the baseline's: never whatever is installed.
                env = {
                    **os.environ,
                    "PYTHONPATH": str(path or Path(__file__).resolve().parent.parent),
                }
                command = [
                    sys.executable, __file__, "--variant", variant, "--url", server.url,
                    "--duration", str(args.duration), "--latency", str(args.latency),
                ]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                results[label].append(json.loads(done.stdout))
                print(f"  round {round_number + 1}: {label} done", file=sys.stderr)
        about = machine(server.url)

    def median(label: str, key: str) -> float:
        values = sorted(r[key] for r in results[label])
        return values[len(values) // 2]

    base = OBSERVED[0]
    lines = [
        f"Machine: {about}. {args.rounds} rounds of {args.duration:g} s (a), (b) and "
        f"{args.latency:g} s (c) per variant, alternating; medians.",
        "",
        "| aiolimit | (a) 64 tasks, 1 limiter, calls/s | (a) client CPU µs / call "
        "| (b) 64 tasks, 10 000 limiters, calls/s | (b) client CPU µs / call "
        "| (c) 1 task p50 / p99 µs |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for _, label, _ in variants:
        single, many = median(label, "single"), median(label, "many")
        p50, p99 = median(label, "p50"), median(label, "p99")
        cpu_single, cpu_many = median(label, "cpu_single"), median(label, "cpu_many")
        lines.append(
            f"| {label} | {single:,.0f} ({single / median(base, 'single'):.3f}x) "
            f"| {cpu_single:.2f} ({cpu_single / median(base, 'cpu_single'):.3f}x) "
            f"| {many:,.0f} ({many / median(base, 'many'):.3f}x) "
            f"| {cpu_many:.2f} ({cpu_many / median(base, 'cpu_many'):.3f}x) "
            f"| {p50:,.0f} / {p99:,.0f} ({median(base, 'p50') / p50:.3f}x) |"
        )
    counted = [r.get("counted", 0) for r in results[OBSERVED[1]]]
    lines.append("")
    lines.append(
        "Every round's calls, per variant: "
        + "; ".join(
            f"{label}: (a) "
            + ", ".join(f"{r['single']:,.0f}" for r in results[label])
            + " / (b) "
            + ", ".join(f"{r['many']:,.0f}" for r in results[label])
            for _, label, _ in variants
        )
        + f". Requests the adapter counted per round: {', '.join(f'{c:,}' for c in counted)}."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per (a)/(b) run (3)")
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per (c) run (2)")
    parser.add_argument("--saturation", type=float, default=8.0, help="seconds per (d) run (8)")
    parser.add_argument("--quick", action="store_true", help="short runs: under a minute")
    parser.add_argument("--only", action="append", help="run only this contender (repeatable)")
    parser.add_argument("--no-soak", action="store_true", help="skip the soak-tool row")
    parser.add_argument(
        "--costs", action="store_true", help="(a) and (b) only, with their costs per grant"
    )
    parser.add_argument("--write", type=Path, metavar="FILE", help="replace the table in FILE")
    parser.add_argument("--otel", action="store_true", help="the cost of observing, aiolimit alone")
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR", help="with --otel: an older checkout"
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --otel: rounds (3)")
    parser.add_argument("--variant", choices=["none", "otel"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # one round of --otel, in a process of its own
        print(json.dumps(observed_round(args.variant, args.url, args.duration, args.latency)))
        return
    if args.otel:
        if args.quick:
            args.duration, args.latency = 1.0, 0.7
        print(observing_cost(args))
        return
    if args.quick:
        args.duration, args.latency, args.saturation = 1.0, 0.7, 3.0
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:])
    contenders = all_contenders()
    if args.only:
        contenders = [c for c in contenders if c.name in args.only or c.reference]
    began = time.monotonic()
    with LocalRedis() as server:
        url = server.url
        rows = [Row(c) for c in contenders]
        for row in rows:
            name = row.contender.name
            flush(url)
            single = asyncio.run(throughput(row.contender, url, 1, args.duration))
            row.single, row.single_cost = single.calls, single.cost
            flush(url)
            many = asyncio.run(throughput(row.contender, url, MANY, args.duration))
            row.many, row.many_cost = many.calls, many.cost
            row.refused = single.refused + many.refused
            if not args.costs:
                flush(url)
                row.p50, row.p99 = asyncio.run(latency(row.contender, url, args.latency))
                flush(url)
                row.saturation = saturation(row.contender, url, args.saturation)
            print(f"  {name}: done at {time.monotonic() - began:.0f} s", file=sys.stderr)
            if row.refused:
                print(f"  {name}: {row.refused} calls refused", file=sys.stderr)
        soaked: dict[str, Any] = {}
        if (
            not args.no_soak
            and not args.costs
            and any(r.contender.name == "aiolimit" for r in rows)
        ):
            flush(url)
            soaked = soak(url, args.saturation)
        about = machine(url)
    text = "\n\n".join(
        [
            f"Machine: {about}. Run took {time.monotonic() - began:.0f} s.",
            "" if args.costs else table(rows, soaked),
            cost_table(rows),
            "Targets:\n\n" + targets(rows)
            if any(r.contender.name == "aiolimit" for r in rows)
            else "",
        ]
    )
    print(text)
    if args.write:
        write(args.write, command.strip(), text)


if __name__ == "__main__":
    main()
