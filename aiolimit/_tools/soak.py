"""Soak test: K worker processes x T tasks on one limiter on a real Redis, with faults and an audit.

    aiolimit soak --duration 30                          # saturation, 4 x 16 at 200 per 1 s
    aiolimit soak --fault script-flush --fault client-kill
    aiolimit soak --fault restart --persistence aof      # crash + restart, AOF fsync always
    aiolimit soak --fault clock-skew --clock client      # one process's clock is 1 h ahead
    aiolimit soak --big                                  # one task asks for the whole rate
    aiolimit soak --algorithm token_bucket --rates "50/second;1000/minute" --min-spacing 0.005
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

With ``--rates`` (several rates, all of which must allow a grant), ``--algorithm`` and
``--min-spacing``, each rate is checked against its own bound, per budget:

* ``sliding_window``: the two checks above, with that rate's permits and interval.
* ``fixed_window``: at most ``permits`` in each window aligned to a multiple of the interval
  since the Unix epoch, on the limiter's clock (the grant times the workers recorded are on
  it), :func:`~aiolimit._tools.audit.busiest_fixed_window`. The wall clock cannot see that
  alignment; its check is the boundary burst: at most ``2 * permits`` in any one interval.
* ``token_bucket``: for every pair of grants i <= j (limiter time), the permits granted in
  ``[t_i, t_j]`` are at most ``permits + permits * (t_j - t_i) / interval``
  (:func:`~aiolimit._tools.audit.fullest_bucket`, exact, O(n log n)); the figure shown is the
  largest ``permits in the span - refill in the span``, at most ``permits``. The wall-clock
  check: at most ``2 * permits - 1`` in any one interval.
* ``--min-spacing``: the starts of consecutive grants (limiter time) are at least the spacing
  apart (:func:`~aiolimit._tools.audit.closest_grants`); on the wall clock, no two grants
  whose stamps all fit in less than the spacing.

The new checks allow ``TOLERANCE_US`` (1 µs) of rounding: grant times and the config are whole
microseconds and the limiter rounds a refill up, so an honest limiter never needs it.

Other figures:

* utilisation = permits granted during the run (limiter time, mapped from the run's wall
  clock start and end) / what the rate allows in a run of D seconds, ``rate * ceil(D /
  interval)`` per budget (a saturated limiter grants ``rate`` at once, then ``rate`` more
  each interval). With several rates or another algorithm: against the tightest rate, the
  one allowing the fewest permits in the run (sliding window as above; fixed window:
  ``permits`` per aligned window the run touches; token bucket: ``permits + permits * D /
  interval``).
* per-process share, and Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` over the
  permits x of each process (1.0 = equal shares, 1/n = one process got everything).
* waiter lateness: for a grant g of p permits at limiter time t_g, ``free(g)`` is the earliest
  time from which, counting only the grants the audit saw before g, the window ending at t_g
  had room for p more permits: walk back from g summing the permits of earlier grants; at
  the first grant k that makes the sum exceed ``rate - p``, ``free(g) = t_k + interval`` (the
  moment k left the window; from then on the grants after k, all of them still before g,
  leave room for p). The request's time is mapped to
  limiter time with the process's clock offset (median of ``t - (sent + replied) / 2`` over
  grants decided while their script call was in flight: their caller returned at once
  rather than sleeping until a reserved slot).
  A grant *waited* if ``free(g)`` is later than its request; its lateness is
  ``t_g - free(g)``: how long enough permits sat free before this waiter took them. p50/p99
  are over waiters only. With several rates ``free(g)`` is the latest of each rate's; a token
  bucket's is when the bucket, replayed over the earlier grants, held p tokens; a fixed
  window's is the start of the run of windows up to g's that had room for p; the spacing's
  is the previous grant's time plus the spacing.
* Redis commands per granted permit, from ``INFO commandstats`` deltas (summed across
  restarts), leaving out the commands the tool itself sends (``info``, ``script|flush``,
  ``client|list``, ``client|kill``).
* errors surfaced to callers, by exception type. A refused ``try_acquire`` is not an error.

Exit status: 0 when no bound is exceeded, 1 on any over-admission, except that
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

from .. import Algorithm, InvalidArgumentError, Rate
from .audit import Window, busiest_fixed_window, busiest_window, closest_grants, fullest_bucket
from .server import LocalRedis
from .soak_worker import Grant, WorkerConfig, WorkerResult, run_worker

__all__ = ["Progress", "add_arguments", "audit_grants", "main", "run", "soak"]

FAULTS = ("script-flush", "client-kill", "restart", "clock-skew")
ALGORITHMS = tuple(a.value.lower() for a in Algorithm)
TOLERANCE_US = 1
"""Rounding the token-bucket and spacing checks allow (grant times are whole microseconds)."""
DEFAULT_RATE, DEFAULT_INTERVAL = 200, 1.0
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
        default="sliding_window",
        help="the limiter's algorithm (sliding_window)",
    )
    parser.add_argument(
        "--min-spacing",
        type=float,
        default=None,
        metavar="SECONDS",
        help="least time between the starts of consecutive grants (none)",
    )
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


@dataclass(frozen=True)
class Limits:
    """What the soaked limiter is set to: its rates, algorithm and spacing (seconds, 0: none)."""

    rates: tuple[Rate, ...]
    algorithm: Algorithm = Algorithm.SLIDING_WINDOW
    min_spacing: float = 0.0

    @classmethod
    def of(cls, args: argparse.Namespace) -> Limits:
        """From the command line (InvalidArgumentError for rates it cannot read)."""
        if args.rates:
            rates = Rate.parse(args.rates)
        else:
            rate = DEFAULT_RATE if args.rate is None else args.rate
            interval = DEFAULT_INTERVAL if args.interval is None else args.interval
            rates = (Rate(rate, interval),)
        return cls(rates, Algorithm(args.algorithm.upper()), args.min_spacing or 0.0)

    @property
    def max_permits(self) -> int:
        """The most one request may ask for: the smallest rate's permits."""
        return min(r.permits for r in self.rates)

    @property
    def shortest(self) -> float:
        """The shortest interval, in seconds: the workload's pace (timeouts, grace)."""
        return min(r.interval_us for r in self.rates) / 1e6

    @property
    def text(self) -> str:
        """The rates as ``Rate.parse`` reads them."""
        return "; ".join(str(r) for r in self.rates)

    def interval_bound(self, rate: Rate) -> int:
        """The most permits one interval of ``rate`` may hold under this algorithm."""
        if self.algorithm is Algorithm.FIXED_WINDOW:
            return 2 * rate.permits  # the boundary burst
        if self.algorithm is Algorithm.TOKEN_BUCKET:
            return 2 * rate.permits - 1
        return rate.permits


def rate_label(rate: Rate) -> str:
    """``200/1s``, ``20/60s``: short, with the interval in seconds."""
    return f"{rate.permits}/{rate.interval_us / 1e6:g}s"


# -- the audit ---------------------------------------------------------------------------------


def clock_offsets(grants: Sequence[Grant]) -> dict[int, float]:
    """Per process: microseconds to add to its wall clock to get the limiter's clock.

    The median of ``t - (sent + replied) / 2`` over the grants decided while their script
    call was in flight: those whose caller returned at once (within ``_IN_FLIGHT`` s of the
    reply), not a reserved future slot it then slept until. A process with none of those
    gets the least ``t - sent``: every grant starts no earlier than its call reached the
    limiter, so that is the offset plus at most one call's latency."""
    in_flight: dict[int, list[float]] = defaultdict(list)
    earliest: dict[int, float] = {}
    for g in grants:
        if g.received - g.replied <= _IN_FLIGHT:
            in_flight[g.process].append(g.limiter_time - (g.sent + g.replied) / 2 * 1e6)
        ahead = g.limiter_time - g.sent * 1e6
        earliest[g.process] = min(earliest.get(g.process, ahead), ahead)
    return {
        process: statistics.median(in_flight[process]) if in_flight[process] else ahead
        for process, ahead in earliest.items()
    }


_IN_FLIGHT = 0.002
"""Seconds between a grant's reply and its caller's return within which it was not a wait."""


def lateness(grants: Sequence[Grant], limits: Limits) -> list[float]:
    """Seconds each waiter's permits sat free before it got them (see the module docstring)."""
    offsets = clock_offsets(grants)
    ordered = sorted(grants, key=lambda g: g.limiter_time)
    requested = [g.requested * 1e6 + offsets[g.process] for g in ordered]
    free = [-math.inf] * len(ordered)
    for rate in limits.rates:
        if limits.algorithm is Algorithm.TOKEN_BUCKET:
            found = _free_in_bucket(ordered, rate)
        elif limits.algorithm is Algorithm.FIXED_WINDOW:
            found = _free_in_fixed_windows(ordered, rate, requested)
        else:
            found = _free_in_sliding_window(ordered, rate)
        free = [max(a, b) for a, b in zip(free, found, strict=True)]
    spacing_us = round(limits.min_spacing * 1e6)
    if spacing_us:
        for index in range(1, len(ordered)):
            free[index] = max(free[index], ordered[index - 1].limiter_time + spacing_us)
    return [
        max(0.0, grant.limiter_time - at) / 1e6
        for grant, at, asked in zip(ordered, free, requested, strict=True)
        if at > asked
    ]


def _free_in_sliding_window(ordered: Sequence[Grant], rate: Rate) -> list[float]:
    """Walk back from g summing permits; the grant that leaves no room for g's permits frees
    them when it leaves the window."""
    result = []
    for index, grant in enumerate(ordered):
        free = -math.inf
        taken = 0
        for k in range(index - 1, -1, -1):
            earlier = ordered[k]
            taken += earlier.permits
            if taken > rate.permits - grant.permits:
                free = earlier.limiter_time + rate.interval_us
                break
        result.append(free)
    return result


def _free_in_bucket(ordered: Sequence[Grant], rate: Rate) -> list[float]:
    """Replays the bucket (GCRA: the time it is full again) over the grants in order: g's
    permits were there from ``full - interval + their refill``."""
    per_permit = rate.interval_us / rate.permits
    full = -math.inf
    result = []
    for grant in ordered:
        cost = grant.permits * per_permit
        result.append(full + cost - rate.interval_us)
        full = max(full, grant.limiter_time) + cost
    return result


def _free_in_fixed_windows(
    ordered: Sequence[Grant], rate: Rate, requested: Sequence[float]
) -> list[float]:
    """g's window had room for g from its start; so had each window before it whose grants
    (all of them: a window's count only grows) left room for g's permits."""
    interval = rate.interval_us
    totals: Counter[int] = Counter()
    for grant in ordered:
        totals[grant.limiter_time // interval] += grant.permits
    result = []
    for grant, asked in zip(ordered, requested, strict=True):
        window = grant.limiter_time // interval
        while window * interval > asked and totals[window - 1] <= rate.permits - grant.permits:
            window -= 1
        result.append(float(window * interval))
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
    limits: Limits,
    per_client: bool,
    run: tuple[float, float],
) -> dict[str, Any]:
    """Each rate's bound, the spacing, utilisation and lateness per budget, from the grant
    records alone."""
    budgets: dict[int, list[Grant]] = defaultdict(list)
    for grant in grants:
        budgets[grant.process if per_client else 0].append(grant)
    checks = [_RateCheck(rate) for rate in limits.rates]
    spacing_us = round(limits.min_spacing * 1e6)
    closest: float | None = None
    too_close = too_close_wall = 0
    begin, end = run
    allowed = 0
    in_run = 0
    late: list[float] = []
    for budget in budgets.values():
        offset = statistics.median(clock_offsets(budget).values())
        first, last = begin * 1e6 + offset, end * 1e6 + offset
        for check in checks:
            check.add(budget, limits)
        in_run += sum(g.permits for g in budget if first <= g.limiter_time < last)
        allowed += min(_allowed(rate, limits.algorithm, first, last) for rate in limits.rates)
        late += lateness(budget, limits)
        if spacing_us:
            times = [(g.limiter_time, g.permits) for g in budget]
            spaced = closest_grants(times, spacing_us, slack=TOLERANCE_US)
            if spaced.closest is not None:
                closest = spaced.closest if closest is None else min(closest, spaced.closest)
            too_close += spaced.too_close
            # Two grants whose [sent, received] stamps all fit within the spacing.
            spans = [(g.sent, g.received, 1) for g in budget]
            too_close_wall += busiest_window(spans, limits.min_spacing, rate=1).over
    rates = [check.report(limits) for check in checks]
    permits = sum(g.permits for g in grants)
    tightest = min(
        limits.rates, key=lambda r: _allowed(r, limits.algorithm, begin * 1e6, end * 1e6)
    )
    return {
        "grants": len(grants),
        "permits": permits,
        # The first rate's busiest window of its interval, limiter time and wall clock; and
        # every bound exceeded, over all rates and the spacing.
        "most_in_window": rates[0]["most_in_interval"],
        "windows_over_rate": sum(r["over"] for r in rates) + too_close,
        "most_in_window_wall": rates[0]["most_wall"],
        "windows_over_rate_wall": sum(r["over_wall"] for r in rates) + too_close_wall,
        "per_rate": rates,
        "spacing": None
        if not spacing_us
        else {
            "min_spacing_s": limits.min_spacing,
            "closest_s": None if closest is None else round(closest / 1e6, 6),
            "too_close": too_close,
            "too_close_wall": too_close_wall,
        },
        "utilisation": in_run / allowed if allowed else 0.0,
        "utilisation_against": rate_label(tightest),
        "waiters": len(late),
        "lateness_p50_ms": _ms(percentile(late, 0.50)),
        "lateness_p99_ms": _ms(percentile(late, 0.99)),
    }


_CHECKS = {
    Algorithm.SLIDING_WINDOW: "any window",
    Algorithm.FIXED_WINDOW: "aligned window",
    Algorithm.TOKEN_BUCKET: "bucket",
}


@dataclass
class _RateCheck:
    """One rate's bound over every budget: the algorithm's own check on limiter time, the
    busiest window of its interval (limiter time), and the wall-clock check."""

    rate: Rate
    worst: float = 0.0
    over: int = 0
    interval: Window = field(default_factory=lambda: Window(0))
    wall: Window = field(default_factory=lambda: Window(0))

    def add(self, budget: Sequence[Grant], limits: Limits) -> None:
        permits, interval_us = self.rate.permits, self.rate.interval_us
        times = [(g.limiter_time, g.limiter_time, g.permits) for g in budget]
        bound = limits.interval_bound(self.rate)
        # Permits in (t - interval, t] for every limiter grant time t.
        busiest = busiest_window(times, interval_us, rate=bound)
        self.interval = _worst(self.interval, busiest)
        if limits.algorithm is Algorithm.FIXED_WINDOW:
            timed = [(g.limiter_time, g.permits) for g in budget]
            aligned = busiest_fixed_window(timed, interval_us, rate=permits)
            self.worst = max(self.worst, aligned.most)
            self.over += aligned.over
        elif limits.algorithm is Algorithm.TOKEN_BUCKET:
            timed = [(g.limiter_time, g.permits) for g in budget]
            bucket = fullest_bucket(timed, permits, interval_us, slack=TOLERANCE_US)
            self.worst = max(self.worst, bucket.peak)
            self.over += bucket.over
        else:
            self.worst = max(self.worst, busiest.most)
            self.over += busiest.over
        # The most permits whose [sent, received] wall-clock stamps all fit within less than
        # one interval: independent of any clock the limiter read.
        spans = [(g.sent, g.received, g.permits) for g in budget]
        self.wall = _worst(self.wall, busiest_window(spans, interval_us / 1e6, rate=bound))

    def report(self, limits: Limits) -> dict[str, Any]:
        return {
            "rate": rate_label(self.rate),
            "permits": self.rate.permits,
            "interval_s": self.rate.interval_us / 1e6,
            "check": _CHECKS[limits.algorithm],
            "worst": round(self.worst, 3),
            "bound": self.rate.permits,
            "over": self.over,
            "most_in_interval": self.interval.most,
            "interval_bound": limits.interval_bound(self.rate),
            "most_wall": self.wall.most,
            "over_wall": self.wall.over,
        }


def _allowed(rate: Rate, algorithm: Algorithm, first: float, last: float) -> int:
    """The most permits ``rate`` lets one budget take in ``[first, last)`` (limiter µs),
    starting with a fresh state."""
    interval = rate.interval_us
    if algorithm is Algorithm.FIXED_WINDOW:
        windows = math.floor((last - 1) / interval) - math.floor(first / interval) + 1
        return rate.permits * max(1, windows)
    if algorithm is Algorithm.TOKEN_BUCKET:
        return math.floor(rate.permits + rate.permits * (last - first) / interval + 1e-9)
    return rate.permits * math.ceil((last - first) / interval - 1e-9)


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
    limits = Limits.of(args)
    interval = limits.shortest
    mix = tuple(int(part) for part in args.mix.split(","))
    control = sync_redis.Redis.from_url(url, decode_responses=True)
    _set_rate(url, name, rate_type, limits)

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
            rate=limits.max_permits,
            interval=interval,
            rates=limits.text,
            algorithm=limits.algorithm.value,
            min_spacing=limits.min_spacing,
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


def _set_rate(url: str, name: str, rate_type: str, limits: Limits) -> None:
    import asyncio

    from redis.asyncio import Redis

    from .. import RateLimiter, RedisBackend

    async def configure() -> None:
        redis = Redis.from_url(url)
        try:
            await RateLimiter(name, RedisBackend(redis)).set_rate(
                rate_type,
                limits.rates,
                algorithm=limits.algorithm,
                min_spacing=limits.min_spacing or None,
            )
        finally:
            await redis.aclose()

    asyncio.run(configure())


class Progress:
    """The progress line (stderr, about once a second): the permits granted in the last
    interval against what the rate allows in one, so the first interval's burst (a limiter
    starts with a full budget) reads as what it is, not as over-admission. With several
    rates: the first one; a fixed window allows twice its permits in one interval (the
    boundary burst), a token bucket twice less one."""

    def __init__(self, args: argparse.Namespace, begin: float, end: float, counts: Any) -> None:
        self.quiet = args.quiet
        self.begin, self.end = begin, end
        self.counts = counts
        limits = Limits.of(args)
        self.interval = limits.rates[0].interval_us / 1e6
        budgets = args.processes if args.rate_type == "per-client" else 1
        self.allowed = limits.interval_bound(limits.rates[0]) * budgets
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
    limits = Limits.of(args)
    results = audit_grants(grants, limits, per_client, run)
    shares = {r.process: sum(g.permits for g in r.grants) for r in worker_results}
    errors: Counter[str] = Counter()
    error_samples: dict[str, str] = {}
    for r in worker_results:
        errors.update(r.errors)
        for kind, message in r.error_samples.items():
            error_samples.setdefault(kind, message)
    scripts = commands.total["evalsha"] + commands.total["eval"] + commands.total["fcall"]
    every = sum(commands.total.values())
    big_waits = [w for r in worker_results for w in r.big_waits]
    over = results["windows_over_rate"] + results["windows_over_rate_wall"] > 0
    loss_allowed = args.allow_loss and "restart" in args.fault and args.persistence == "none"
    results.update(
        {
            "scenario": _scenario(args),
            "duration_s": round(run[1] - run[0], 2),
            "rate": limits.rates[0].permits,
            "interval_s": limits.rates[0].interval_us / 1e6,
            "rates": limits.text,
            "algorithm": args.algorithm,
            "min_spacing_s": limits.min_spacing or None,
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
            "permits": limits.max_permits,
            "timeout_s": 5 * limits.shortest,
            "p50_s": _round(percentile(big_waits, 0.5)),
            "max_s": _round(max(big_waits) if big_waits else None),
            "within_2_intervals": sum(w <= 2 * limits.shortest for w in big_waits),
        }
    return results


def _ratio(count: int, permits: int) -> float | None:
    return round(count / permits, 3) if permits else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _scenario(args: argparse.Namespace) -> str:
    limits = Limits.of(args)
    parts = [
        f"{args.processes}x{args.tasks}",
        ";".join(rate_label(r) for r in limits.rates),
        args.rate_type,
        f"clock={args.clock}",
    ]
    if limits.algorithm is not Algorithm.SLIDING_WINDOW:
        parts.append(args.algorithm)
    if limits.min_spacing:
        parts.append(f"min-spacing={limits.min_spacing:g}s")
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
    per_rate = results["per_rate"]
    plain = len(per_rate) == 1 and per_rate[0]["check"] == "any window" and not results["spacing"]
    rows = [
        ("scenario", results["scenario"]),
        ("duration", f"{results['duration_s']} s"),
        ("grants (permits)", f"{results['grants']} ({results['permits']})"),
    ]
    if plain:  # one sliding-window rate: as the tool has always shown it
        rows += [
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
        ]
    else:
        rows += [(f"rate {r['rate']}", _rate_row(r)) for r in per_rate]
        spacing = results["spacing"]
        if spacing:
            closest = spacing["closest_s"]
            rows.append(
                (
                    "spacing between grants",
                    f"closest {'-' if closest is None else f'{closest * 1000:.3f}'} ms"
                    f" / at least {spacing['min_spacing_s'] * 1000:g} ms"
                    f" ({spacing['too_close']} too close; wall clock"
                    f" {spacing['too_close_wall']})",
                )
            )
    utilisation = f"{results['utilisation'] * 100:.2f} %"
    if not plain:
        utilisation += f" (of what {results['utilisation_against']} allows)"
    rows += [
        ("utilisation", utilisation),
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
    verdict = "OK: no window over the rate" if plain else "OK: no bound exceeded"
    if not results["grants"]:
        verdict = "FAILED: nothing was granted"
    elif results["over_admission"]:
        verdict = "OVER-ADMISSION" + (
            " (allowed: restart without persistence)" if results["over_admission_allowed"] else ""
        )
    rows.append(("verdict", verdict))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _rate_row(r: dict[str, Any]) -> str:
    """One rate's checks: its own bound on limiter time, its interval, the wall clock."""
    interval = f"{r['interval_s']:g} s"
    if r["check"] == "bucket":
        own = f"bucket peak {r['worst']:.3f} / {r['bound']} ({r['over']} spans over)"
    elif r["check"] == "aligned window":
        own = f"{r['worst']:g} / {r['bound']} in an aligned {interval} ({r['over']} over)"
    else:
        own = f"{r['worst']:g} / {r['bound']} in any {interval} ({r['over']} over)"
    if r["check"] != "any window":
        own += f"; any {interval}: {r['most_in_interval']} / {r['interval_bound']}"
    return f"{own}; wall clock {r['most_wall']} / {r['interval_bound']} ({r['over_wall']} over)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aiolimit._tools.soak", description=(__doc__ or "").split("\n\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
