"""A partner API that keeps its quota the way partners do: it counts requests as they
*arrive*, in its own window, and answers ``429`` with ``Retry-After`` past the quota. The
limiter's grants are exact on its own clock; what a partner sees is each grant's start plus
whatever the caller adds before the request lands (waking up, the event loop, the HTTP send),
so a limiter set to the exact quota is judged here, where the promise lands.

>>> partner = Partner(10, 1.0, "sliding")
>>> with serve(partner) as url:
...     ...  # send requests to url; partner.arrivals, partner.refused

``trial`` runs processes x tasks through ``RateLimitedTransport`` against three partners at
once (a strict sliding window, fixed windows aligned to its clock, a token bucket of the
quota's size) and reports what each partner saw: 429s, the share of the quota delivered, and
how late requests arrived after their grant's start.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import json
import math
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

import aiolimit
from aiolimit.backends import Grant
from tools.audit import busiest_window

if TYPE_CHECKING:
    from aiolimit import Acquired, RateLimiter

KINDS = ("sliding", "fixed", "bucket")
"""How a partner counts: the arrivals in any span of one interval (strict), in fixed windows
aligned to multiples of the interval on its clock, or a token bucket of ``rate`` tokens
refilled at the quota."""

LATENESS_HEADER = "x-grant-start"
"""The grant's start (limiter clock, µs), sent by the trial's workers: the partner reads it
beside the arrival time (Redis's TIME and the partner's clock are one machine's clock)."""


class Partner:
    """An ASGI app keeping ``rate`` requests per ``interval`` seconds by arrival (``kind``,
    one of :data:`KINDS`). ``GET /stats`` answers what it counted as JSON."""

    def __init__(
        self, rate: int, interval: float, kind: str = "sliding", *, states: bool = False
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.rate, self.interval, self.kind = rate, interval, kind
        self.states = states  # every answer states the quota (RateLimit-Policy)
        self.arrivals: list[float] = []  # the served requests' arrival times
        self.refused: list[float] = []  # the 429s' arrival times
        self.late: list[float] = []  # seconds from a grant's start to its request's arrival
        self.late_at: list[float] = []  # ... and when it arrived
        self.requests: list[tuple[float, float | None, bool]] = []  # (arrival, late, served)
        self._window: deque[float] = deque()  # sliding: the arrivals of the last interval
        self._counts: dict[int, int] = {}  # fixed: arrivals per window number
        self._tat = 0.0  # bucket: when the bucket is full again
        self._lock = threading.Lock()

    def admit(self, now: float) -> float:
        """Counts an arrival at ``now``: 0.0 when served, else the seconds until it would be."""
        with self._lock:
            wait = self._decide(now)
            (self.refused if wait > 0 else self.arrivals).append(now)
            return wait

    def _decide(self, now: float) -> float:
        if self.kind == "sliding":
            window = self._window
            while window and window[0] <= now - self.interval:
                window.popleft()
            if len(window) >= self.rate:
                return window[0] + self.interval - now
            window.append(now)
            return 0.0
        if self.kind == "fixed":
            number = math.floor(now / self.interval)
            if self._counts.get(number, 0) >= self.rate:
                return (number + 1) * self.interval - now
            self._counts[number] = self._counts.get(number, 0) + 1
            return 0.0
        step = self.interval / self.rate  # bucket (GCRA): a token per step, rate at most
        tat = max(self._tat, now) + step
        if tat - self.interval > now + 1e-9:
            return tat - self.interval - now
        self._tat = tat
        return 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        now = time.time()
        if scope["path"] == "/stats":
            await _answer(send, 200, [], json.dumps(self.stats()).encode())
            return
        wait = self.admit(now)
        late = arrival_late(scope, now)
        with self._lock:
            self.requests.append((now, late, wait <= 0))
            if late is not None:
                self.late.append(late)
                self.late_at.append(now)
        stated = []
        if self.states:
            policy = f'"quota";q={self.rate};w={self.interval:g}'.encode()
            stated = [(b"ratelimit-policy", policy)]
        if wait > 0:
            retry_after = str(max(1, math.ceil(wait))).encode()  # (whole seconds, as most do)
            await _answer(send, 429, [(b"retry-after", retry_after), *stated], b"over quota")
        else:
            await _answer(send, 200, stated, b"ok")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "kind": self.kind,
                "rate": self.rate,
                "interval": self.interval,
                "arrivals": list(self.arrivals),
                "refused": list(self.refused),
                "late": list(self.late),
                "late_at": list(self.late_at),
                "requests": list(self.requests),
            }


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


PARTNER_NICE = -10
"""The scheduling priority (nice) of a trial's partner thread: a real partner is remote, and
its clock stamps arrivals whatever the callers' machine is doing; one that shares a busy
machine with its callers and is not run for a while stamps a backlog of requests "at once",
late, and refuses some for a burst no caller sent. Raised where allowed (root, or
``CAP_SYS_NICE``), else left as it is (:func:`serve` returns which)."""


def _raise_priority(nice: int | None) -> bool:
    """This thread's nice set to ``nice`` (Linux: per thread); whether it could be."""
    if nice is None or not hasattr(os, "setpriority"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return False
    return True


def partner_priority() -> str:
    """How a trial's partner thread is run here, for a benchmark's heading: at
    :data:`PARTNER_NICE`, or as its process (not allowed)."""
    allowed: list[bool] = []
    probe = threading.Thread(target=lambda: allowed.append(_raise_priority(PARTNER_NICE)))
    probe.start()
    probe.join()
    if allowed[0]:
        return f"the partner's thread at nice {PARTNER_NICE} (a real partner is remote)"
    return "the partner's thread at its process's priority (not allowed to raise it)"


@contextmanager
def serve(app: Any, host: str = "127.0.0.1", nice: int | None = None) -> Iterator[str]:
    """Serves ``app`` with uvicorn in a thread on a free port (at priority ``nice`` where
    allowed: :data:`PARTNER_NICE`); yields its base URL."""
    import uvicorn

    from tools import free_port

    port = free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)

    def run() -> None:
        _raise_priority(nice)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the partner did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# -- what a partner saw ---------------------------------------------------------------------------


@dataclass
class Seen:
    """One partner's view of a trial."""

    kind: str
    client: str
    served: int
    refused: int
    share: float  # the served requests of the steady windows, over the quota of those windows
    windows: int
    late_p50: float | None  # seconds from the grant's start to the request's arrival
    late_p99: float | None
    spread: float | None  # p99 - p1 of that lateness: what a margin has to cover
    most_in_a_window: int = 0  # the most arrivals any span of one interval held
    stall: float = 0.0  # the longest any caller's event loop ran late meanwhile (a busy machine)
    unexcused: int = 0  # the 429s the limiter's schedule is to blame for (see `unexcused`)
    settled: float | None = None  # the fleet's measured margin after the trial (s; None: none)


def seen(
    stats: dict[str, Any], began: float, ended: float, client: str = "", margin: float = 0.0
) -> Seen:
    """What a partner's ``stats()`` say about the trial's steady part, from one interval
    after ``began`` (the callers' first burst and connections left out) to ``ended``; the
    429s of the whole run, and those of them a limiter with ``margin`` is to blame for."""
    rate, interval = stats["rate"], stats["interval"]
    arrivals = sorted(stats["arrivals"])
    first = began + interval
    steady = arrivals[bisect.bisect_left(arrivals, first) : bisect.bisect_left(arrivals, ended)]
    windows = math.floor((ended - first) / interval)
    # What came through per interval, from the first steady arrival to the start of the last
    # burst (arrivals closer than half a permit's share of the interval are one burst, and
    # the last one opens the next span), over the quota.
    last = len(steady) - 1
    while last > 0 and steady[last] - steady[last - 1] < interval / rate / 2:
        last -= 1
    span = steady[last] - steady[0] if last > 0 else 0.0
    share = last / (rate * span / interval) if span > 0 else 0.0
    stamped = zip(stats["late_at"], stats["late"], strict=True)
    late = sorted(late for at, late in stamped if at >= first)
    return Seen(
        kind=stats["kind"],
        client=client,
        served=len(arrivals),
        refused=len(stats["refused"]),
        share=share,
        windows=windows,
        late_p50=_percentile(late, 0.5),
        late_p99=_percentile(late, 0.99),
        spread=_spread(late),
        most_in_a_window=busiest_window(arrivals, interval).most,
        unexcused=unexcused(stats["requests"], rate, margin),
    )


def unexcused(requests: list[tuple[float, float | None, bool]], rate: int, margin: float) -> int:
    """The 429s a limiter with ``margin`` is to blame for, from a partner's ``requests``
    (arrival, lateness after the grant's start, served), in arrival order.

    A limiter promises its grants' *starts*: no more than the quota in any interval plus the
    margin. What its callers add before a request lands (the event loop, the HTTP send, a
    process the machine did not run) shifts each arrival by its lateness; as long as the
    lateness of the requests a partner counts together differs by no more than the margin,
    the partner sees no more than its quota. So a 429 is the limiter's when its request and
    the ``rate`` served requests before it (those that filled the partner's window or
    bucket) arrived within ``margin`` of one another's lateness; a 429 beside a request that
    came later than that (or carries no grant) is the callers' spread, not the schedule."""
    blamed = 0
    served: deque[float | None] = deque(maxlen=rate)
    for _arrival, late, ok in sorted(requests, key=lambda request: request[0]):
        if ok:
            served.append(late)
            continue
        together = [*served, late]
        if len(served) == rate and None not in together:
            known = [value for value in together if value is not None]
            blamed += max(known) - min(known) <= margin
    return blamed


def _spread(ordered: list[float]) -> float | None:
    high, low = _percentile(ordered, 0.99), _percentile(ordered, 0.01)
    return None if high is None or low is None else high - low


def _percentile(ordered: list[float], share: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


# -- a trial: processes x tasks through the HTTP clients -------------------------------------------

CLIENTS = ("httpx", "aiohttp", "acquire")
"""How a trial's callers send: through ``RateLimitedTransport``, ``RateLimitedClientMiddleware``,
or ``await limiter.acquire()`` before a plain httpx request."""


@dataclass
class Trial:
    """``processes`` x ``tasks`` callers per partner, each partner keeping ``rate`` per
    ``interval`` s; the limiter is given the same quota and ``margin`` s (what the docs say to
    give a partner that counts arrivals), for ``duration`` s. ``partners`` pairs each partner's
    kind (:data:`KINDS`) with the client its callers use (:data:`CLIENTS`)."""

    redis_url: str
    processes: int = 5
    tasks: int = 4
    rate: int = 10
    interval: float = 1.0
    duration: float = 12.0
    margin: float | None = 0.0  # None: the defaults (the fleet's measured margin)
    partners: tuple[tuple[str, str], ...] = (("sliding", "httpx"),)
    prefix: str = "partner-trial"


def trial(spec: Trial) -> list[Seen]:
    """Runs ``spec``: one partner after the other (their callers' bursts would otherwise
    share the machine's cores at the same instants), each with its own limiter and its
    client in every worker process; returns what each partner saw."""
    return [_one(spec, kind, client) for kind, client in spec.partners]


def _one(spec: Trial, kind: str, client: str) -> Seen:
    partner = Partner(spec.rate, spec.interval, kind)
    with serve(partner, nice=PARTNER_NICE) as url:
        start_at = time.time() + 2.0  # (the workers' imports and connections first)
        context = multiprocessing.get_context("spawn")
        with context.Pool(spec.processes) as pool:
            results = [
                pool.apply_async(_worker, (spec, kind, client, url, start_at))
                for _ in range(spec.processes)
            ]
            worst = [result.get(timeout=spec.duration + 60) for result in results]
    name = f"{spec.prefix}-{kind}-{client}"
    settled = None if spec.margin is not None else settled_margin(spec.redis_url, name)
    margin = spec.margin if spec.margin is not None else settled or 0.0
    result = seen(partner.stats(), start_at, start_at + spec.duration, client, margin)
    result.stall = max(worst, default=0.0)
    result.settled = settled
    return result


def settled_margin(redis_url: str, name: str) -> float | None:
    """The fleet's measured margin the store holds for limiter ``name`` (seconds; None:
    none): the config hash's field ``margin`` (docs/redis-layout.md)."""
    from redis import Redis

    with Redis.from_url(redis_url) as redis:
        value = redis.hget(f"aiolimit:{{{name}}}:config", "margin")
    return None if value is None else int(value) / 1e6


def _worker(spec: Trial, kind: str, client: str, url: str, start_at: float) -> float:
    """One caller process; how late its event loop ran at worst while it called."""
    return asyncio.run(_work(spec, kind, client, url, start_at))


async def stalls(since: float, stop: float, worst: list[float]) -> None:
    """Ticks every 5 ms until ``stop``, keeping in ``worst[0]`` how late a tick ran at most
    from ``since`` on (the steady part: the callers' clients are made before it): how long
    the process did not run (a busy machine), which no limiter can make up for."""
    loop = asyncio.get_running_loop()
    while time.time() < stop:
        due = loop.time() + 0.005
        await asyncio.sleep(0.005)
        if time.time() >= since:
            worst[0] = max(worst[0], loop.time() - due)


async def _work(spec: Trial, kind: str, client: str, url: str, start_at: float) -> float:
    from redis.asyncio import Redis

    from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend

    redis = Redis.from_url(spec.redis_url)
    backend = RedisBackend(redis)
    try:
        limiter = RateLimiter(f"{spec.prefix}-{kind}-{client}", backend)
        await limiter.ensure_rate(
            RateLimiterConfig.build(
                RateType.OVERALL, spec.rate, spec.interval, margin=spec.margin, keep_alive=3600
            )
        )
        stop = start_at + spec.duration
        await asyncio.sleep(max(0.0, start_at - time.time()))
        worst = [0.0]
        if client == "acquire":
            aiolimit.observe(WokeLate())  # (one for the process: its callers' wakes)
        callers = [_caller(client, limiter, url, stop) for _ in range(spec.tasks)]
        await asyncio.gather(stalls(start_at, stop, worst), *callers)
        return worst[0]
    finally:
        await backend.aclose()
        await redis.aclose()


async def _caller(client: str, limiter: RateLimiter, url: str, stop: float) -> None:
    if client == "httpx":
        await _httpx_caller(limiter, url, stop)
    elif client == "aiohttp":
        await _aiohttp_caller(limiter, url, stop)
    else:
        await _acquire_caller(limiter, url, stop)


async def _httpx_caller(limiter: RateLimiter, url: str, stop: float) -> None:
    from aiolimit.httpx import RateLimitedTransport

    transport = RateLimitedTransport(limiter)  # (its own connections: the permit taken late)
    async with httpx.AsyncClient(transport=transport, timeout=30) as client:
        while time.time() < stop:
            await client.get(f"{url}/call", extensions={"trace": stamp_when_written})


async def stamp_when_written(event: str, info: dict[str, Any]) -> None:
    """httpcore's trace, as the caller's own: the request carries the start of the grant it
    is written on (:data:`LATENESS_HEADER`), stamped as its headers are about to be written
    (after the transport took or checked its permit there)."""
    if event == "http11.send_request_headers.started":
        start = granted_start()
        if start is not None:
            info["request"].headers.append((LATENESS_HEADER.encode(), str(start).encode()))


async def _acquire_caller(limiter: RateLimiter, url: str, stop: float) -> None:
    """``await limiter.acquire()``, then the request on the caller's own client; the request
    carries its grant's start: when ``acquire()`` returned, less how late its caller woke
    (:class:`WokeLate`; the limiter's clock is this machine's)."""
    async with httpx.AsyncClient(timeout=30) as client:
        while time.time() < stop:
            woke_late.set(0.0)  # (a grant given at once: no wake)
            await limiter.acquire()
            start = round((time.time() - woke_late.get()) * 1_000_000)
            await client.get(f"{url}/call", headers={LATENESS_HEADER: str(start)})


woke_late: contextvars.ContextVar[float] = contextvars.ContextVar("woke_late", default=0.0)
"""How late this task's caller woke after its last grant's start (s)."""


class WokeLate(aiolimit.Observer):
    """Keeps how late each waiter woke after its grant's start, in its own task's context
    (an observer's ``late`` runs in the call it reports)."""

    __slots__ = ()

    def late(self, name: str, seconds: float) -> None:
        woke_late.set(seconds)


async def _aiohttp_caller(limiter: RateLimiter, url: str, stop: float) -> None:
    import aiohttp

    from aiolimit.aiohttp import RateLimitedClientMiddleware

    async def stamp(request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        start = granted_start()
        if start is not None:
            request.headers[LATENESS_HEADER] = str(start)
        response: aiohttp.ClientResponse = await handler(request)
        return response

    middlewares = (RateLimitedClientMiddleware(limiter), stamp)
    async with aiohttp.ClientSession(middlewares=middlewares) as session:
        while time.time() < stop:
            async with session.get(f"{url}/call") as response:
                await response.read()


def granted_start() -> int | None:
    """The start (limiter clock, us) of the grant the HTTP client just took for this task."""
    from aiolimit._calls import last_grant

    return start_of(last_grant.get())


def start_of(acquired: Acquired | None) -> int | None:
    """When every grant of ``acquired`` has started (limiter clock, us); None: no grant."""
    starts = [a.starts_at for a in getattr(acquired, "attempts", ()) if isinstance(a, Grant)]
    return max(starts, default=None)


def arrival_late(scope: dict[str, Any], now: float) -> float | None:
    """How long after its grant's start a request arrived at ``now`` (s), from the start it
    carries (:data:`LATENESS_HEADER`); None when it carries none."""
    start = dict(scope["headers"]).get(LATENESS_HEADER.encode())
    return None if start is None else now - int(start) / 1e6


class Stamped(httpx.AsyncBaseTransport):
    """An httpx transport whose requests carry their grant's start (:data:`LATENESS_HEADER`),
    for a transport of the caller's own (the permit taken before the request is handed on)."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        start = granted_start()
        if start is not None:
            request.headers[LATENESS_HEADER] = str(start)
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self._transport.aclose()


def summary(results: list[Seen]) -> str:
    """One line per partner."""
    return "\n".join(
        f"{r.kind:8} {r.client:8} 429s {r.refused:3} ({r.unexcused} unexcused)  "
        f"share {r.share:6.1%} over {r.windows} windows  "
        f"late p50/p99 {_ms(r.late_p50)}/{_ms(r.late_p99)} ms  spread {_ms(r.spread)} ms"
        f"  stall {_ms(r.stall)} ms"
        + ("" if r.settled is None else f"  settled margin {_ms(r.settled)} ms")
        for r in results
    )


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f}"
