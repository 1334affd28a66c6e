"""Soak test: K worker processes x T tasks on one limiter on a real Redis, with faults and an audit.

    aiolimit soak --duration 30                          # saturation, 4 x 16 at 200 per 1 s
    aiolimit soak --fault script-flush --fault client-kill
    aiolimit soak --fault restart --persistence aof      # crash + restart, AOF fsync always
    aiolimit soak --fault clock-skew --clock client      # one process's clock is 1 h ahead
    aiolimit soak --big                                  # one task asks for the whole rate
    python -m aiolimit._tools.soak --json ...            # the same, machine-readable

Without ``--redis URL`` it starts its own redis-server on a free 127.0.0.1 port and stops it
at the end (``--fault restart`` needs that local server).

**The audit trusts nothing the limiter stores.** Every worker records each grant it was given
(see :mod:`aiolimit._tools.soak_worker`): its own wall clock just before and just after the script
call that granted, and the limiter's grant time (``Attempt.time``: Redis ``TIME`` by default).
The parent then checks, per budget (the whole limiter for ``overall``, each process for
``per-client``):

* *limiter-time windows*: for every grant g, the permits granted in ``(t_g - interval, t_g]``,
  where t is the limiter's grant time (exactly the window the Lua script enforces). Any sum
  above the rate is over-admission. With ``--clock client`` t is the worker's clock, corrected
  for the skew the tool injected.
* *wall-clock windows* (independent of any clock the limiter read): a grant's true time lies
  between its ``sent`` and ``received`` stamps; grants whose stamps all fit in less than one
  interval certainly shared a window. The largest such sum above the rate is over-admission
  even if the limiter's clock were lying.

Both are :func:`aiolimit._tools.audit.busiest_window`, over times and over spans.

Other figures:

* utilisation = permits granted during the run (limiter time, mapped from the run's wall
  clock start and end) / what the rate allows in a run of D seconds, ``rate * ceil(D /
  interval)`` per budget (a saturated limiter grants ``rate`` at once, then ``rate`` more
  each interval).
* per-process share, and Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` over the
  permits x of each process (1.0 = equal shares, 1/n = one process got everything).
* waiter lateness: for a grant g of p permits at limiter time t_g, ``free(g)`` is the earliest
  time from which, counting only the grants the audit saw before g, the window ending at t_g
  had room for p more permits: walk back from g summing the permits of earlier grants; at
  the first grant k that makes the sum exceed ``rate - p``, ``free(g) = t_k + interval`` (the
  moment k left the window; from then on the grants after k, all of them still before g,
  leave room for p). The request's time is mapped to
  limiter time with the process's clock offset (median of ``t - (sent + replied) / 2`` over
  grants decided while their script call was in flight).
  A grant *waited* if ``free(g)`` is later than its request; its lateness is
  ``t_g - free(g)``: how long enough permits sat free before this waiter took them. p50/p99
  are over waiters only.
* Redis commands per granted permit, from ``INFO commandstats`` deltas (summed across
  restarts), leaving out the commands the tool itself sends (``info``, ``script|flush``,
  ``client|list``, ``client|kill``).
* errors surfaced to callers, by exception type. A refused ``try_acquire`` is not an error.

Exit status: 0 when no window holds more than the rate, 1 on any over-admission, except that
``--allow-loss`` reports (without failing) a restart of a server without persistence, which
loses the limiter's state and so can admit up to one more rate's worth of permits.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .audit import Window, busiest_window
from .server import LocalRedis
from .soak_worker import Grant, WorkerConfig, WorkerResult, run_worker

__all__ = ["Progress", "add_arguments", "audit_grants", "main", "run", "soak"]

FAULTS = ("script-flush", "client-kill", "restart", "clock-skew")
# Commands the tool itself sends to watch and disturb the server; not the limiter's cost.
_OWN_COMMANDS = {"info", "script|flush", "client|list", "client|kill", "ping"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis", metavar="URL", help="use this server (default: start one)")
    parser.add_argument("--processes", "-k", type=int, default=4, help="worker processes (4)")
    parser.add_argument("--tasks", "-t", type=int, default=16, help="tasks per process (16)")
    parser.add_argument("--duration", "-d", type=float, default=20.0, help="seconds (20)")
    parser.add_argument(
        "--type", choices=("overall", "per-client"), default="overall", dest="rate_type"
    )
    parser.add_argument("--rate", type=int, default=200, help="permits per interval (200)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds (1)")
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
        "--allow-loss",
        action="store_true",
        help="report but do not fail over-admission after a restart without persistence",
    )
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


# -- the audit ---------------------------------------------------------------------------------


def clock_offsets(grants: Sequence[Grant]) -> dict[int, float]:
    """Per process: microseconds to add to its wall clock to get the limiter's clock."""
    by_process: dict[int, list[float]] = defaultdict(list)
    for g in grants:
        offset = g.limiter_time - (g.sent + g.replied) / 2 * 1e6
        # Only grants stamped while the call was in flight (not a reserved future slot).
        if g.limiter_time <= g.replied * 1e6 + abs(offset) or not by_process[g.process]:
            by_process[g.process].append(offset)
    return {process: statistics.median(values) for process, values in by_process.items()}


def lateness(grants: Sequence[Grant], rate: int, interval_us: int) -> list[float]:
    """Seconds each waiter's permits sat free before it got them (see the module docstring)."""
    offsets = clock_offsets(grants)
    ordered = sorted(grants, key=lambda g: g.limiter_time)
    result = []
    for index, grant in enumerate(ordered):
        free = -math.inf
        taken = 0
        for k in range(index - 1, -1, -1):
            earlier = ordered[k]
            taken += earlier.permits
            if taken > rate - grant.permits:
                free = earlier.limiter_time + interval_us
                break
        requested = grant.requested * 1e6 + offsets[grant.process]
        if free > requested:
            result.append(max(0.0, grant.limiter_time - free) / 1e6)
    return result


def jain(values: Sequence[float]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else total * total / (len(values) * squares)


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def audit_grants(
    grants: Sequence[Grant],
    rate: int,
    interval: float,
    per_client: bool,
    run: tuple[float, float],
) -> dict[str, Any]:
    """Window counts, utilisation and lateness per budget, from the grant records alone."""
    interval_us = round(interval * 1e6)
    budgets: dict[int, list[Grant]] = defaultdict(list)
    for grant in grants:
        budgets[grant.process if per_client else 0].append(grant)
    limiter = wall = Window(0)
    begin, end = run
    # A full budget at the start, then `rate` more per interval: ceil(D / interval) rates.
    allowed_per_budget = rate * math.ceil((end - begin) / interval - 1e-9)
    allowed = 0
    in_run = 0
    late: list[float] = []
    for budget in budgets.values():
        # Permits in (t - interval, t] for every limiter grant time t; and the most permits
        # whose [sent, received] wall-clock stamps all fit within less than one interval.
        times = [(g.limiter_time, g.limiter_time, g.permits) for g in budget]
        limiter = _worst(limiter, busiest_window(times, interval_us, rate=rate))
        spans = [(g.sent, g.received, g.permits) for g in budget]
        wall = _worst(wall, busiest_window(spans, interval, rate=rate))
        offset = statistics.median(clock_offsets(budget).values())
        first, last = begin * 1e6 + offset, end * 1e6 + offset
        in_run += sum(g.permits for g in budget if first <= g.limiter_time < last)
        allowed += allowed_per_budget
        late += lateness(budget, rate, interval_us)
    permits = sum(g.permits for g in grants)
    return {
        "grants": len(grants),
        "permits": permits,
        "most_in_window": limiter.most,
        "windows_over_rate": limiter.over,
        "most_in_window_wall": wall.most,
        "windows_over_rate_wall": wall.over,
        "utilisation": in_run / allowed if allowed else 0.0,
        "waiters": len(late),
        "lateness_p50_ms": _ms(percentile(late, 0.50)),
        "lateness_p99_ms": _ms(percentile(late, 0.99)),
    }


def _worst(total: Window, budget: Window) -> Window:
    """The windows of every budget so far: the busiest, and all those over the rate."""
    busiest = budget if budget.most > total.most else total
    return Window(busiest.most, total.over + budget.over, busiest.end)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


# -- the server side: stats and faults ------------------------------------------------------------


class _Commands:
    """INFO commandstats deltas, summed over server restarts (a restart resets the counters)."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self._base: Counter[str] = Counter()

    @staticmethod
    def read(redis: Any) -> Counter[str]:
        stats = redis.info("commandstats")
        return Counter(
            {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}
        )

    def begin(self, redis: Any) -> None:
        self._base = self.read(redis)

    def end(self, redis: Any) -> None:
        now = self.read(redis)
        now.subtract(self._base)
        self.total.update({k: v for k, v in now.items() if v > 0 and k not in _OWN_COMMANDS})


@dataclass
class _Injector:
    redis: Any
    server: LocalRedis | None
    faults: list[str]
    every: float
    client_prefix: str
    commands: _Commands
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    downtime: float = 0.0
    _turn: int = 0
    _next: float = 0.0

    def start(self, now: float) -> None:
        self._next = now + self.every / 2

    def tick(self, now: float, end: float) -> None:
        if not self.faults or now < self._next or now > end - self.every / 4:
            return
        self._next = now + self.every
        fault = self.faults[self._turn % len(self.faults)]
        self._turn += 1
        try:
            self._inject(fault)
            self.done[fault] += 1
        except Exception as exc:  # the tool keeps going; the table says what failed
            self.failed[f"{fault}: {type(exc).__name__}"] += 1

    def _inject(self, fault: str) -> None:
        if fault == "script-flush":
            self.redis.script_flush()
        elif fault == "client-kill":
            for client in self.redis.client_list():
                if client.get("name", "").startswith(self.client_prefix):
                    self.redis.client_kill_filter(_id=client["id"])
        elif fault == "restart":
            assert self.server is not None
            self.commands.end(self.redis)
            self.downtime += self.server.crash_and_restart()
            self.redis.connection_pool.disconnect()
            self.commands.begin(self.redis)


# -- running it -----------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> str | None:
    if args.processes < 1 or args.tasks < 1:
        return "--processes and --tasks must be at least 1"
    if args.rate < 1 or args.interval <= 0 or args.duration <= 0:
        return "--rate, --interval and --duration must be positive"
    if "restart" in args.fault and args.redis:
        return "--fault restart needs the local server (leave out --redis)"
    try:
        mix = [int(part) for part in args.mix.split(",")]
    except ValueError:
        mix = []
    if len(mix) != 3 or min(mix) < 0 or sum(mix) == 0:
        return "--mix takes three non-negative weights, e.g. 60,25,15"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"aiolimit soak: {problem}", file=sys.stderr)
        return 2
    server = None if args.redis else LocalRedis(persistence=args.persistence).start()
    try:
        results = soak(args, server.url if server else args.redis, server)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))
    else:
        print(format_table(results))
    return int(results["exit_code"])


def soak(args: argparse.Namespace, url: str, server: LocalRedis | None) -> dict[str, Any]:
    import redis as sync_redis

    run_id = uuid.uuid4().hex[:8]
    name = f"soak-{run_id}"
    client_prefix = f"aiolimit-soak-{run_id}-"
    rate_type = "PER_CLIENT" if args.rate_type == "per-client" else "OVERALL"
    interval = float(args.interval)
    mix = tuple(int(part) for part in args.mix.split(","))
    control = sync_redis.Redis.from_url(url, decode_responses=True)
    _set_rate(url, name, rate_type, args.rate, interval)

    context = multiprocessing.get_context("spawn")
    counts = context.Array("q", args.processes)
    ready = context.Queue()
    results_queue = context.Queue()
    start = context.Event()
    window = context.Array("d", 2)
    processes = []
    for process in range(args.processes):
        skewed = "clock-skew" in args.fault and process == 0
        config = WorkerConfig(
            url=url,
            name=name,
            rate_type=rate_type,
            rate=args.rate,
            interval=interval,
            tasks=args.tasks,
            mix=(mix[0], mix[1], mix[2]),
            max_multi=args.max_multi,
            try_timeout=args.try_timeout if args.try_timeout is not None else interval / 2,
            clock=args.clock,
            skew=args.skew if skewed and args.clock == "client" else 0.0,
            big=args.big,
            big_timeout=5 * interval,
            client_name=f"{client_prefix}{process}",
            client_retries=args.client_retries,
            seed=args.seed,
        )
        worker = context.Process(
            target=run_worker,
            args=(config, process, counts, ready, start, window, results_queue),
            daemon=True,
        )
        worker.start()
        processes.append(worker)

    worker_results: list[WorkerResult] = []
    commands = _Commands()
    periodic = [f for f in args.fault if f != "clock-skew"]
    injector = _Injector(control, server, periodic, args.fault_every, client_prefix, commands)
    try:
        for _ in processes:
            ready.get(timeout=60)
        commands.begin(control)
        begin = time.time() + 0.2
        end = begin + args.duration
        window[0], window[1] = begin, end
        start.set()
        injector.start(begin)
        progress = Progress(args, begin, end, counts)
        while len(worker_results) < len(processes):
            now = time.time()
            if begin <= now <= end:
                injector.tick(now, end)
            progress.show(now, injector.done)
            worker_results += _drain(results_queue, timeout=0.1)
            if now > end + 10 * interval + 60:
                raise RuntimeError("workers did not report back")
        progress.finish()
        commands.end(control)
    finally:
        for worker in processes:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        control.close()
    return _summarise(args, worker_results, commands, injector, (begin, end))


def _drain(queue: Any, timeout: float) -> Iterator[WorkerResult]:
    import queue as queues

    try:
        yield queue.get(timeout=timeout)
    except queues.Empty:
        return


def _set_rate(url: str, name: str, rate_type: str, rate: int, interval: float) -> None:
    import asyncio

    from redis.asyncio import Redis

    from .. import RateLimiter, RedisBackend

    async def configure() -> None:
        redis = Redis.from_url(url)
        try:
            await RateLimiter(name, RedisBackend(redis)).set_rate(rate_type, rate, interval)
        finally:
            await redis.aclose()

    asyncio.run(configure())


class Progress:
    """The progress line (stderr, about once a second): the permits granted in the last
    interval against what the rate allows in one, so the first interval's burst (a limiter
    starts with a full budget) reads as what it is, not as over-admission."""

    def __init__(self, args: argparse.Namespace, begin: float, end: float, counts: Any) -> None:
        self.quiet = args.quiet
        self.begin, self.end = begin, end
        self.counts = counts
        self.interval = args.interval
        budgets = args.processes if args.rate_type == "per-client" else 1
        self.allowed = args.rate * budgets
        self.tty = sys.stderr.isatty()
        self._last = -math.inf
        # (time, permits so far), the oldest no more than one interval old.
        self._samples: deque[tuple[float, int]] = deque([(begin, 0)])

    def show(self, now: float, faults: Counter[str]) -> None:
        if self.quiet or now < self.begin:
            return
        permits = sum(self.counts[:])
        self._samples.append((now, permits))
        while self._samples[0][0] < now - self.interval:
            self._samples.popleft()
        if now - self._last < 1.0:
            return
        self._last = now
        elapsed = min(now, self.end) - self.begin
        share = elapsed / (self.end - self.begin)
        bar = "#" * round(share * 30)
        recent = permits - self._samples[0][1]
        injected = " ".join(f"{k}x{v}" for k, v in sorted(faults.items()))
        line = (
            f"[{bar:<30}] {elapsed:5.1f}/{self.end - self.begin:.0f}s  permits {permits}  "
            f"last {self.interval:g} s: {recent}/{self.allowed}"
            + (f"  faults {injected}" if injected else "")
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)
        sys.stderr.flush()

    def finish(self) -> None:
        if not self.quiet and self.tty:
            print(file=sys.stderr)


def _summarise(
    args: argparse.Namespace,
    worker_results: list[WorkerResult],
    commands: _Commands,
    injector: _Injector,
    run: tuple[float, float],
) -> dict[str, Any]:
    grants = [g for r in worker_results for g in r.grants]
    per_client = args.rate_type == "per-client"
    results = audit_grants(grants, args.rate, args.interval, per_client, run)
    shares = {r.process: sum(g.permits for g in r.grants) for r in worker_results}
    errors: Counter[str] = Counter()
    error_samples: dict[str, str] = {}
    for r in worker_results:
        errors.update(r.errors)
        for kind, message in r.error_samples.items():
            error_samples.setdefault(kind, message)
    scripts = commands.total["evalsha"] + commands.total["eval"]
    every = sum(commands.total.values())
    big_waits = [w for r in worker_results for w in r.big_waits]
    over = results["windows_over_rate"] + results["windows_over_rate_wall"] > 0
    loss_allowed = args.allow_loss and "restart" in args.fault and args.persistence == "none"
    results.update(
        {
            "scenario": _scenario(args),
            "duration_s": round(run[1] - run[0], 2),
            "rate": args.rate,
            "interval_s": args.interval,
            "rate_type": args.rate_type,
            "processes": args.processes,
            "tasks": args.tasks,
            "shares": {str(p): shares[p] for p in sorted(shares)},
            "jain": round(jain([shares[p] for p in sorted(shares)]), 4),
            "refused_try_acquire": sum(r.refused for r in worker_results),
            "cancelled_at_end": sum(r.cancelled for r in worker_results),
            "errors": dict(sorted(errors.items())),
            "error_samples": error_samples,
            "redis_commands": dict(commands.total.most_common()),
            "scripts_per_permit": _ratio(scripts, results["permits"]),
            "commands_per_permit": _ratio(every, results["permits"]),
            "faults_injected": dict(sorted(injector.done.items())),
            "faults_failed": dict(sorted(injector.failed.items())),
            "restart_downtime_s": round(injector.downtime, 3),
            "over_admission": over,
            "over_admission_allowed": over and loss_allowed,
            "exit_code": 1 if (over and not loss_allowed) or not grants else 0,
        }
    )
    if args.big:
        results["big"] = {
            "granted": len(big_waits),
            "timed_out": sum(r.big_timeouts for r in worker_results),
            "timeout_s": 5 * args.interval,
            "p50_s": _round(percentile(big_waits, 0.5)),
            "max_s": _round(max(big_waits) if big_waits else None),
            "within_2_intervals": sum(w <= 2 * args.interval for w in big_waits),
        }
    return results


def _ratio(count: int, permits: int) -> float | None:
    return round(count / permits, 3) if permits else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _scenario(args: argparse.Namespace) -> str:
    parts = [
        f"{args.processes}x{args.tasks}",
        f"{args.rate}/{args.interval:g}s",
        args.rate_type,
        f"clock={args.clock}",
    ]
    if args.client_retries:
        parts.append(f"client-retries={args.client_retries}")
    if args.fault:
        parts.append("faults=" + ",".join(args.fault))
    if "restart" in args.fault:
        parts.append(f"persistence={args.persistence}")
    if args.big:
        parts.append("big")
    return " ".join(parts)


def format_table(results: dict[str, Any]) -> str:
    rate = results["rate"]

    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    shares = results["shares"]
    total = max(1, sum(shares.values()))
    rows = [
        ("scenario", results["scenario"]),
        ("duration", f"{results['duration_s']} s"),
        ("grants (permits)", f"{results['grants']} ({results['permits']})"),
        (
            "most permits in any window",
            f"{results['most_in_window']} / rate {rate}"
            f" ({results['windows_over_rate']} windows over)",
        ),
        (
            "  same, wall-clock stamps",
            f"{results['most_in_window_wall']} / rate {rate}"
            f" ({results['windows_over_rate_wall']} windows over)",
        ),
        ("utilisation", f"{results['utilisation'] * 100:.2f} %"),
        (
            "per-process share",
            " ".join(f"{p}:{v / total * 100:.1f}%" for p, v in shares.items()),
        ),
        ("Jain fairness index", f"{results['jain']:.4f}"),
        (
            "waiter lateness p50 / p99",
            f"{fmt(results['lateness_p50_ms'])} / {fmt(results['lateness_p99_ms'])} ms"
            f" ({results['waiters']} waiters)",
        ),
        (
            "Redis calls per permit",
            f"{fmt(results['scripts_per_permit'])} scripts (round trips); "
            f"{fmt(results['commands_per_permit'])} commands incl. those inside scripts",
        ),
        ("refused try_acquire", str(results["refused_try_acquire"])),
        (
            "errors surfaced to callers",
            ", ".join(f"{k}: {v}" for k, v in results["errors"].items()) or "none",
        ),
    ]
    if results["faults_injected"] or results["faults_failed"]:
        injected = ", ".join(f"{k} x{v}" for k, v in results["faults_injected"].items())
        if results["restart_downtime_s"]:
            injected += f" (downtime {results['restart_downtime_s']} s)"
        rows.append(("faults injected", injected or "none"))
        if results["faults_failed"]:
            rows.append(
                (
                    "faults failed",
                    ", ".join(f"{k} x{v}" for k, v in results["faults_failed"].items()),
                )
            )
    if "big" in results:
        big = results["big"]
        rows.append(
            (
                "whole-rate request",
                f"{big['granted']} granted, {big['timed_out']} timed out "
                f"(after {big['timeout_s']:g} s); p50 {fmt(big['p50_s'])} s, "
                f"max {fmt(big['max_s'])} s; {big['within_2_intervals']} within 2 intervals",
            )
        )
    verdict = "OK: no window over the rate"
    if not results["grants"]:
        verdict = "FAILED: nothing was granted"
    elif results["over_admission"]:
        verdict = "OVER-ADMISSION" + (
            " (allowed: restart without persistence)" if results["over_admission_allowed"] else ""
        )
    rows.append(("verdict", verdict))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiolimit._tools.soak", description=(__doc__ or "").split("\n\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
