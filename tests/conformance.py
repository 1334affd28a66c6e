"""Helpers for the conformance suite: timing tolerances, attempt clocks, the sliding-window audit.

Times in these helpers are seconds of the running event loop's clock: virtual (and exact) on
the memory backend under looptime, real on fakeredis, redis-server and Valkey.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pytest

from aiolimit import Backend, Observer, RateLimiter, RedisBackend
from aiolimit.backends import Grant
from aiolimit.backends._protocol import split_life
from tools import busiest_window

T = TypeVar("T")


def now() -> float:
    return asyncio.get_running_loop().time()


async def until(
    read: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str, within: float = 5.0
) -> T:
    """Reads ``read()`` every 10 ms until ``done`` holds for it (at most ``within`` seconds of
    the loop's clock): for what a background task (a hand-back) or a sleeping one does."""
    deadline = now() + within
    while not done(value := await read()):
        assert now() < deadline, f"{what}: still {value!r} after {within} s"
        await asyncio.sleep(0.01)
    return value


class Sleepers(Observer):
    """The callers of this process sleeping out a reservation, per limiter name (what the
    observer's ``queued`` reports): the barrier for waiters started as tasks, which hold a
    reservation once they sleep (the ``asleep`` fixture attaches one for a test)."""

    def __init__(self) -> None:
        self.by_name: Counter[str] = Counter()

    def queued(self, name: str, change: int) -> None:
        self.by_name[name] += change

    async def reach(self, name: str, count: int) -> None:
        """Waits until ``count`` callers of limiter ``name`` sleep out their reservations."""

        async def sleeping() -> int:
            return self.by_name[name]

        await until(sleeping, lambda n: n >= count, f"{count} callers of {name!r} asleep")


@contextlib.asynccontextmanager
async def writes_paused(admin: Any) -> AsyncIterator[None]:
    """The server ``admin`` is a client of runs no write command (our scripts included) until
    the block ends (``CLIENT PAUSE ... WRITE``, at most 5 s)."""
    await admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    try:
        yield
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")


async def cancelled(task: asyncio.Future[Any]) -> None:
    """Cancels ``task``, still running, and waits until it has ended so."""
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class LoopLag:
    """How late this process's event loop ran, as a ticker task sees it: on a busy machine
    the whole process may not run for a few hundred milliseconds, and any caller due to wake
    then wakes that much late, however exact the limiter. A late event is the limiter's
    fault only by what the loop's own lateness at that moment does not explain.

    The ``store`` fixture runs one for every test on a real clock (``LoopLag.current``);
    :func:`tolerance` hands it to the checks.
    """

    PERIOD = 0.005
    current: ClassVar[LoopLag | None] = None

    def __init__(self) -> None:
        self._ticks: deque[tuple[float, float]] = deque(maxlen=4000)  # (due, woke), 20 s
        self._task: asyncio.Task[None] | None = None
        self._due = 0.0  # when the tick now waiting is due

    def start(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _tick(self) -> None:
        while True:
            self._due = now() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            self._ticks.append((self._due, now()))

    def during(self, start: float, end: float) -> float:
        """How late the loop woke a ticker due between ``start`` and ``end`` at most (one
        period before ``start`` included: a stall that began just before it), the tick still
        waiting to be woken included."""
        ticks = [*self._ticks, (self._due, max(self._due, now()))] if self._task else self._ticks
        lags = (woke - due for due, woke in ticks if start - self.PERIOD <= due <= end)
        return max(lags, default=0.0)


@dataclass(frozen=True)
class Tolerance:
    """How far an observed time may stray from the exact one. With a ``lag`` monitor, an
    event may be late by ``late`` plus how late the event loop itself ran between the exact
    time and the event (see :class:`LoopLag`); that needs times of the loop's clock, not
    durations."""

    early: float
    late: float
    lag: LoopLag | None = None

    def late_by(self, expected: float, actual: float) -> float:
        """``late``, plus how late the loop ran between ``expected`` and ``actual``."""
        stalled = 0.0 if self.lag is None else self.lag.during(expected, actual)
        return self.late + stalled

    def check(self, actual: float, expected: float, what: str = "event") -> None:
        late = self.late_by(expected, actual)
        assert expected - self.early <= actual <= expected + late, (
            f"{what} at {actual:.4f} s, expected {expected:.4f} s "
            f"(-{self.early} s / +{self.late} s, +{late - self.late:.4f} s the loop ran late)"
        )

    def check_span(
        self, actual: tuple[float, float], expected: tuple[float, float], what: str = "event"
    ) -> None:
        """Like :meth:`check` for instants known as spans (earliest, latest): a call that
        read a clock on the server read it somewhere inside the call. The spans must meet,
        give or take the tolerance, however long a call took (a pause of the whole process
        included)."""
        late = self.late_by(expected[1], actual[0])
        assert expected[0] - self.early <= actual[1] and actual[0] <= expected[1] + late, (
            f"{what} at {actual[0]:.4f}..{actual[1]:.4f} s, expected "
            f"{expected[0]:.4f}..{expected[1]:.4f} s (-{self.early} s / +{self.late} s, "
            f"+{late - self.late:.4f} s the loop ran late)"
        )


class ManualClock:
    """A limiter clock (seconds) that moves only when the test moves it: for tests whose point
    is what the store holds or refuses, not when, so that a busy machine, a slow round trip or
    a paused process cannot move the limiter's time between two steps of a test.

    >>> clock = ManualClock()
    >>> limiter = RateLimiter(name, store.backend(clock=clock))  # every backend takes one
    >>> clock.advance(0.3)

    It starts at a whole hour, so fixed windows of any interval dividing an hour start there.
    Redis is sent its readings (``clock=`` a callable), as with ``clock='client'``.
    """

    START = 1_800_000_000.0  # a whole hour (2027-01-15 08:00 UTC), near this era's wall clock

    def __init__(self, start: float = START) -> None:
        self._us = round(start * 1e6)  # whole microseconds, so that steps add up exactly

    def __call__(self) -> float:
        return self._us / 1e6

    def advance(self, seconds: float) -> None:
        self._us += round(seconds * 1e6)


async def advance(store: Any, clock: ManualClock, seconds: float) -> None:
    """Moves the test's clock, and Redis's key expiry with it: Redis expires keys on its own
    clock, which ``clock`` does not move, so every key's TTL is shortened by ``seconds`` (and
    a key whose TTL runs out is deleted), as that much real time would have. The memory
    backend already expires its state on the limiter's clock."""
    clock.advance(seconds)
    if not store.is_redis:
        return
    backend = store.backend()
    assert isinstance(backend, RedisBackend)
    redis, elapsed = backend.redis, round(seconds * 1000)
    for key in await redis.keys("*"):
        ttl = await redis.pttl(key)
        if ttl > elapsed:
            await redis.pexpire(key, ttl - elapsed)
        elif ttl >= 0:
            await redis.delete(key)


def lifeless(attempt: T) -> T:
    """A grant with its member's life left out (other attempts as they are): what two
    limiters of their own, each of its own life, compare equal by."""
    if isinstance(attempt, Grant):
        return attempt._replace(member=split_life(attempt.member)[0])  # type: ignore[return-value]
    return attempt


async def flush(store: Any) -> None:
    """Empties the store, as ``FLUSHALL`` empties a Redis server (the memory backend: every
    limiter, receipt and lease of its shared dict gone)."""
    backend = store.backend()
    if isinstance(backend, RedisBackend):
        await backend.redis.flushall()
        return
    shared = backend._shared
    shared.limiters.clear()
    shared.receipts.clear()
    shared.heap.clear()
    shared.due.clear()
    shared.touched_name = shared.touched = None


def manual_clock(store: Any) -> tuple[ManualClock, Backend]:
    """A clock the test moves, and a backend of the store that reads it (another client of
    it, as ``new_client`` makes)."""
    clock = ManualClock()
    return clock, new_client(store, clock=clock)


def tolerance(store: Any) -> Tolerance:
    """Virtual time is exact but for microsecond rounding and any wake-up jitter; real
    time on a loaded 2-core machine runs late by scheduling and round trips, and early only by
    the drift between the server's clock and the event loop's."""
    if not store.is_redis:
        return Tolerance(2e-6, 0.005)
    return Tolerance(0.01, 0.15, LoopLag.current)


def check_after(store: Any, span: tuple[float, float], offset: float, what: str = "event") -> None:
    """Now is ``offset`` after an event known as a span (a grant: the store stamped it
    somewhere inside the call that made it), to the suite's tolerances. Measuring from the
    call's end instead would read a slow reply as an early grant."""
    at = now()
    tolerance(store).check_span((at, at), (span[0] + offset, span[1] + offset), what)


def xfail_on(request: Any, store: Any, kinds: set[str], reason: str) -> None:
    """Marks this run as a known bug on the given backends (strict: it must fail there)."""
    if store.kind in kinds:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def new_client(store: Any, client_id: str | None = None, **options: Any) -> Backend:
    """Another client of the store, as another process would be: its own backend object (its
    own connection on Redis), hence its own queue of waiting tasks."""
    if store.is_redis:
        options.setdefault("own_connection", True)
    elif not options:
        options["clock"] = now  # MemoryBackend's own default; asks the store for a new object
    return store.backend(client_id, **options)


async def assert_stored_keys(store: Any, count: int) -> None:
    """The Redis store holds ``count`` keys (the fixture flushes it for every test). The memory
    backend's storage is not observable; its tests check the same through the public API."""
    if not store.is_redis:
        return
    backend = store.backend()
    assert isinstance(backend, RedisBackend)
    keys = sorted(await backend.redis.keys("*"))
    assert len(keys) == count, f"expected {count} keys, found {keys}"


_readings: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "readings", default=None
)


class AttemptClock:
    """A backend clock (the event loop's, in seconds) that notes, per calling task, each reading.

    Backends read their clock when they make an attempt, in the caller's task (or one sharing
    its context), and stamp the grant no earlier than that reading (later when they reserve a
    future slot for a waiting caller). The caller returns once the grant has started, within
    ``tolerance.late`` of it, as the timing tests assert. So ``take`` returns the grant's time
    as the span from the later of the first reading and the return less ``late``, to the
    return: a few milliseconds wide in virtual time, a round trip or so on Redis.
    """

    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance
        self.late = tolerance.late

    def __call__(self) -> float:
        reading = now()
        readings = _readings.get()
        if readings is not None:
            readings.append(reading)
        return reading

    async def take(
        self, limiter: RateLimiter, permits: int = 1, *, timeout: float | None = None
    ) -> tuple[float, float] | None:
        """``try_acquire``; returns the (earliest, latest) time of the grant, None if refused."""
        readings: list[float] = []
        token = _readings.set(readings)
        try:
            granted = await limiter.try_acquire(permits, timeout=timeout)
        finally:
            _readings.reset(token)
        if not granted:
            return None
        returned = now()
        # The first reading is the attempt's (a caller that slept out a reservation then reads
        # the block, after its grant started). Later than ``late`` after the grant only by how
        # late the loop itself ran meanwhile.
        late = self.tolerance.late_by(readings[0], returned)
        return max(readings[0], returned - late), returned


async def when_free(limiter: RateLimiter, permits: int = 1) -> tuple[float, float]:
    """The instant ``wait_time`` points at, on the loop's clock, as the span it may lie in
    (the wait is counted from the moment the store read its clock, within the call)."""
    before = now()
    wait = await limiter.wait_time(permits)
    return before + wait, now() + wait


async def take(
    limiter: RateLimiter, permits: int = 1, *, timeout: float | None = 0
) -> tuple[float, float] | None:
    """``try_acquire`` on any clock; returns the span of the call (the grant lies inside it)."""
    start = now()
    granted = await limiter.try_acquire(permits, timeout=timeout)
    return (start, now()) if granted else None


def assert_sliding_window(
    grants: Iterable[tuple[float, float]], rate: int, interval: float, slack: float = 2e-6
) -> None:
    """No window of length ``interval`` holds more than ``rate`` permits.

    Each grant (one entry per permit) is the span ``(earliest, latest)`` in which the limiter
    stamped it. A window is reported only when the overfill is certain: ``rate + 1`` grants
    whose spans all fit in less than ``interval``. ``slack`` absorbs microsecond rounding and
    the drift between the limiter's clock and the loop's.
    """
    spans = list(grants)
    busiest = busiest_window(spans, interval, slack=slack)
    if busiest.most > rate:
        start = busiest.end - (interval - slack)
        inside = sorted(s for s in spans if start < s[0] and s[1] <= busiest.end)
        raise AssertionError(
            f"{busiest.most} grants (rate {rate}) within {busiest.end - inside[0][0]:.6f} s "
            f"< interval {interval} s: {inside}"
        )


def per_permit(span: tuple[float, float] | None, permits: int) -> Sequence[tuple[float, float]]:
    assert span is not None, "the request was refused"
    return [span] * permits


async def reservations(backend: Backend, name: str, count: int) -> list[Grant]:
    """``count`` single permits, each granted at once or reserved (a wait of up to an hour)."""
    queued = []
    for _ in range(count):
        grant = await backend.try_acquire(name, 1, 3_600_000_000)
        assert isinstance(grant, Grant), f"refused: {grant}"
        queued.append(grant)
    return queued
