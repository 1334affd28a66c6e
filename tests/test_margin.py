"""The fleet's measured margin: kept in the store with the config, begun by a process's first
call that may wait, grown at once by a lateness above it, shrunk slowly by one below it,
capped; a fixed margin, ``margin=0``, ``PER_CLIENT`` limiters, fixed windows and callers that
never wait keep the rates as given.

Each case runs on every store (memory, fakeredis, redis-server, Valkey) with a clock the test
moves (``ManualClock``): the point is what the store decides, not when. Several backends on
one store stand for the processes of a fleet.
"""

from __future__ import annotations

import asyncio

import pytest

from aiolimit import RateLimiter, RateLimiterConfig, RateType
from aiolimit.backends import _margin
from aiolimit.backends._learning import Law
from aiolimit.backends._margin import Margins, next_margin
from aiolimit.backends.memory import MemoryBackend
from tests.conformance import ManualClock, advance

pytestmark = pytest.mark.measured_margin

INTERVAL = 10  # seconds: long, since Redis expires keys on its own clock
RATE = f"10/{INTERVAL} seconds"
START = _margin.START_US / 1e6
CAP = INTERVAL / 10
FLOOR = min(INTERVAL / 100, _margin.FLOOR_US / 1e6)  # (10 ms: a send takes as long)


async def fleet(store, name, clock, processes=2, rate=RATE):
    """``processes`` limiters of one name and rate in code, each on a backend of its own."""
    return [RateLimiter(name, store.backend(clock=clock), rate=rate) for _ in range(processes)]


async def test_a_waiting_callers_first_call_begins_the_margin_for_every_process(store, name):
    clock = ManualClock()
    client, other = await fleet(store, name, clock)
    for _ in range(10):
        await client.acquire()  # (at once: the first ten of the interval)
    # The eleventh starts an interval and the start margin after the first: for this
    # process and for one that never waited.
    assert await client.wait_time() == pytest.approx(INTERVAL + START)
    assert await other.wait_time() == pytest.approx(INTERVAL + START)
    assert (await other.get_config()).interval.total_seconds() == INTERVAL  # as given


async def test_a_lateness_above_the_margin_grows_it_at_once_and_one_below_shrinks_it_slowly(
    store, name
):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    await limiter.rate_in_code.store()
    backend = limiter.backend
    assert await backend.margin(name, None) == _margin.START_US
    assert await backend.margin(name, 200_000) == 200_000  # at once
    assert await backend.margin(name, 1_000) == 200_000  # no time passed: no shrink
    await advance(store, clock, _margin.SHRINK_INTERVALS * INTERVAL / 2)  # half the time
    assert await backend.margin(name, 1_000) == 105_000  # (half way to the floor: 10 ms)
    await advance(store, clock, 20 * INTERVAL)
    assert await backend.margin(name, 400) == FLOOR * 10**6
    assert await limiter.try_acquire(10)
    assert await limiter.wait_time() == pytest.approx(INTERVAL + FLOOR)


async def test_a_lateness_of_hours_is_capped_at_a_tenth_of_the_interval(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    await limiter.rate_in_code.store()
    assert await limiter.backend.margin(name, 3600 * 10**6) == CAP * 10**6
    assert await limiter.backend.margin(name, -(10**9)) == CAP * 10**6  # (no shrink: no time)
    assert await limiter.try_acquire(10)
    assert await limiter.wait_time() == pytest.approx(INTERVAL + CAP)


async def test_a_margin_shrinks_no_lower_than_its_floor(store, name):
    # What a caller adds after its wake (its send) is not measured: a floor covers it.
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    await limiter.rate_in_code.store()
    backend = limiter.backend
    assert await backend.margin(name, None) == _margin.START_US
    assert await backend.margin(name, 300_000) == 300_000
    await advance(store, clock, 20 * INTERVAL)
    assert await backend.margin(name, 1_000) == FLOOR * 10**6
    assert await backend.margin(name, 0) == FLOOR * 10**6
    assert await limiter.try_acquire(10)
    assert await limiter.wait_time() == pytest.approx(INTERVAL + FLOOR)


async def test_grants_made_stay_counted_when_the_margin_changes(store, name):
    clock = ManualClock()
    for algorithm in ("sliding_window", "token_bucket"):
        rate = f"{RATE}; algorithm={algorithm}"
        (limiter,) = await fleet(store, f"{name}-{algorithm}", clock, 1, rate)
        assert await limiter.try_acquire(10)
        await limiter.backend.margin(limiter.name, 500_000)
        assert not await limiter.try_acquire(1)
        assert await limiter.wait_time() >= INTERVAL / 10  # (a bucket refills one by one)
        await limiter.backend.margin(limiter.name, 0)
        assert not await limiter.try_acquire(1)


@pytest.mark.parametrize(
    "rate",
    [
        f"{RATE}; rate_type=per_client",  # a client's budget: no margin
        f"{RATE}; algorithm=fixed_window",  # windows that would move: no margin
    ],
)
async def test_these_limiters_keep_no_margin(store, name, rate):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1, rate)
    for _ in range(10):
        await limiter.acquire()
    assert await limiter.backend.margin(name, 3_000_000) == 0
    assert await limiter.wait_time() == pytest.approx(INTERVAL)


async def test_a_fixed_margin_begins_no_measured_one(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1, f"{RATE}; margin=0")
    for _ in range(10):
        await limiter.acquire()
    assert await limiter.wait_time() == pytest.approx(INTERVAL)


async def test_callers_that_never_wait_begin_no_margin(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    for _ in range(10):
        assert await limiter.try_acquire()  # (timeout=0: a server's check)
    assert await limiter.wait_time() == pytest.approx(INTERVAL)


def test_the_law_grows_at_once_shrinks_over_five_intervals_and_writes_no_small_change() -> None:
    config = RateLimiterConfig.parse("10/second")
    rates = config.rates
    assert next_margin(None, 0, None, 7, rates) == (100_000, 7)  # the start, capped
    assert next_margin(50_000, 7, 80_000, 9, rates) == (80_000, 9)
    assert next_margin(80_000, 0, 0, 2_500_000, rates) == (45_000, 2_500_000)  # half of 5 s
    # (towards the floor, 10 ms)
    assert next_margin(80_000, 0, 0, 10_000, rates) == (80_000, 0)  # (160 µs: waits)
    assert next_margin(10**12, 0, 10**12, 1, rates) == (100_000, 0)  # capped
    tiny = RateLimiterConfig.build(RateType.OVERALL, "10/0.2 seconds").rates
    assert next_margin(None, 0, None, 0, tiny) == (20_000, 0)  # the start, capped too


def test_the_law_keeps_a_floor_of_a_hundredth_of_the_shortest_interval_up_to_10_ms() -> None:
    rates = RateLimiterConfig.parse("10/second").rates
    assert next_margin(80_000, 0, 0, 10**9, rates) == (10_000, 10**9)  # shrunk to the floor
    assert next_margin(3_000, 0, 2_000, 1, rates) == (10_000, 0)  # below it: raised
    tenth = RateLimiterConfig.build(RateType.OVERALL, "10/0.1 seconds").rates
    assert next_margin(3_000, 0, 0, 10**9, tenth) == (1_000, 10**9)  # a hundredth: 1 ms
    # A send takes as long whatever the interval: a minute's floor is a second's, and its
    # margin starts where a second's does and shrinks to what its callers show.
    minute = RateLimiterConfig.parse("10/minute").rates
    assert next_margin(None, 0, None, 0, minute) == (100_000, 0)
    assert next_margin(100_000, 0, 2_000, 10**10, minute) == (10_000, 10**10)


async def test_a_process_reports_a_higher_lateness_at_once_and_a_lower_one_now_and_then():
    reports: list[int | None] = []
    spawned: list[asyncio.Future[None]] = []

    async def report(name: str, late: int | None) -> int:
        reports.append(late)
        return 10_000 if late is None else max(late, 10_000)

    margins = Margins()
    await margins.begin("a", report)
    spawn = spawned.append

    def late(seconds: float) -> None:
        margins.late("a", seconds, report, lambda work: spawn(asyncio.ensure_future(work)))

    late(0.002)  # below the margin heard, the first: reported
    await asyncio.gather(*spawned)
    late(0.003)  # below, within REPORT_EVERY: kept
    late(0.030)  # above: at once
    await asyncio.gather(*spawned)
    late(float("nan"))
    late(-1.0)
    assert reports == [None, 2_000, 30_000]
    margins.late("never-begun", 5.0, report, lambda work: spawn(asyncio.ensure_future(work)))
    assert len(spawned) == 2


async def test_a_memory_backends_schedule_widens_without_a_round_trip_of_its_own() -> None:
    backend = MemoryBackend()
    limiter = RateLimiter("m", backend, rate="2/second")
    await limiter.acquire()
    await limiter.acquire()
    assert await limiter.wait_time() == pytest.approx(1 + START, abs=0.01)


class SlowReplies(MemoryBackend):
    """Decides at once, then holds the n-th reply back by ``lags[n]`` seconds (0 after)."""

    def __init__(self, lags: list[float]) -> None:
        super().__init__()
        self.lags = lags

    async def try_acquire(self, name, permits, max_wait_us=0):
        attempt = await super().try_acquire(name, permits, max_wait_us)
        await asyncio.sleep(self.lags.pop(0) if self.lags else 0.0)
        return attempt


@pytest.mark.looptime
async def test_a_caller_later_than_the_margin_asks_again_and_the_fleet_margin_grows() -> None:
    backend = SlowReplies([0.0, 0.0, 1.3])  # the third reply comes after its grant starts
    limiter = RateLimiter("partner", backend, rate="1/second")
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(2):  # one at once, one at 1.1 s (the start margin): on time
        await limiter.acquire()
    await limiter.acquire()  # booked at 2.2 s, read at 2.4 s
    # Sent at 2.4 s on a grant of 2.2 s, it would land among the next slots' requests:
    # handed back, and asked again (its slot is free again: at once).
    assert loop.time() - began == pytest.approx(2.4, abs=0.001)
    for _ in range(3):
        await asyncio.sleep(0)  # (the lateness report, in the background)
    assert await backend.margin("partner", None) == 100_000  # 200 ms late: at the cap
    assert await limiter.wait_time() == pytest.approx(1.1)  # from its new grant at 2.4 s


async def test_a_server_rule_keeps_the_exact_rate_even_for_requests_that_wait() -> None:
    from aiolimit.asgi import Rule

    config = Rule("api", "10/second").config
    assert config.margin is not None and config.interval.total_seconds() == 1


async def test_a_learning_client_begins_no_margin_beside_its_learned_rate() -> None:
    from aiolimit.httpx import RateLimitedTransport

    backend = MemoryBackend()
    limiter = RateLimiter("learning", backend, rate="2/second")
    RateLimitedTransport(limiter, learn=True)
    await limiter.acquire()
    await limiter.acquire()
    assert await limiter.wait_time() == pytest.approx(1, abs=0.01)


@pytest.mark.looptime
async def test_the_http_client_asks_again_for_a_grant_it_read_later_than_the_margin() -> None:
    import httpx

    from aiolimit._calls import last_grant
    from aiolimit.httpx import RateLimitedTransport

    backend = SlowReplies([0.0, 0.0, 0.3])  # the third reply (a grant at once) comes late
    limiter = RateLimiter("partner", backend, rate="1/second")
    loop = asyncio.get_running_loop()
    began = loop.time()
    starts: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        acquired = last_grant.get()
        assert acquired is not None
        starts.append(acquired.attempts[0].starts_at / 1e6 - began)
        return httpx.Response(200)

    transport = RateLimitedTransport(limiter, httpx.MockTransport(handler))
    async with httpx.AsyncClient(transport=transport) as client:
        await client.get("http://partner/")  # at once
        await client.get("http://partner/")  # at 1.1 s: its wake maps the limiter's clock
        await asyncio.sleep(2.4)  # the window empties
        await client.get("http://partner/")  # granted at 3.5 s, read at 3.8 s: asked again
    assert starts == pytest.approx([0.0, 1.1, 3.8], abs=0.001)


async def test_a_process_keeps_the_margins_of_a_bounded_number_of_limiters(monkeypatch) -> None:
    monkeypatch.setattr(_margin, "REMEMBERED", 4)

    async def report(name: str, late: int | None) -> int:
        return 10_000

    margins = Margins()
    for i in range(10):
        await margins.begin(f"limiter-{i}", report)
    assert len(margins.begun) <= 4
    assert sum(margins.margin(f"limiter-{i}") is not None for i in range(10)) <= 4
    assert margins.margin("limiter-9") == 10_000  # (the latest kept)


async def test_a_learning_client_learns_on_a_limiter_whose_margin_another_process_began(
    store, name
):
    # Two capabilities on one limiter: a waiting process begins the fleet's margin, a
    # learning client (which begins none) then reports a 429. The learned rate is taken at
    # the limiter's exact intervals and read widened by the margin, as the rate it replaced.
    clock = ManualClock()
    waiting, learning = await fleet(store, name, clock)
    await waiting.rate_in_code.store()
    assert await waiting.backend.margin(name, None) == _margin.START_US
    law = Law(floor=100_000, start=1_000_000, decrease=500_000, step=100_000, max_hold=10**7)
    learned = await learning.backend.learn(name, "refused", None, None, None, law)
    assert learned.changed and learned.permits == 5 and learned.interval_us == INTERVAL * 10**6
    config = await learning.get_config()
    assert (config.rates[0].permits, config.interval.total_seconds()) == (5, INTERVAL)
    for _ in range(5):
        assert await waiting.try_acquire()
    assert await waiting.wait_time() == pytest.approx(INTERVAL + START)
    # The margin moves on under the learned rate, and the learned rate under the margin.
    assert await waiting.backend.margin(name, 300_000) == 300_000
    assert await waiting.wait_time() == pytest.approx(INTERVAL + 0.3)
    again = await learning.backend.learn(name, "refused", None, None, None, law)
    assert again.permits in (2, 3, 5)  # (one cut per episode)
    assert (await learning.get_config()).interval.total_seconds() == INTERVAL


@pytest.mark.looptime
async def test_a_reserve_granted_at_once_but_read_late_grows_the_fleet_margin() -> None:
    # reserve() by hand: the engine last sees its caller as it returns the grant, and a
    # partner counting arrivals sees at least that much lateness (the reply's way back, the
    # event loop's other work): it counts for the fleet's margin, as a reservation's wake does.
    backend = SlowReplies([0.0, 0.3])  # the second reply (a grant at once) comes late
    limiter = RateLimiter("partner", backend, rate=f"10/{INTERVAL} seconds")
    await limiter.reserve(1, timeout=30)  # on time: maps the limiter's clock
    await limiter.reserve(1, timeout=30)  # granted at once, read 300 ms after its start
    for _ in range(3):
        await asyncio.sleep(0)  # (the lateness report, in the background)
    assert await backend.margin("partner", None) == 300_000
