"""Observing limiters: what an Observer is told, the OpenTelemetry adapter's values read back
through the SDK's in-memory reader, and the log lines of an outage.

Memory-backend tests run on virtual time (looptime), so waits are exact; round trips and the
outage need a real redis-server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis.asyncio import Redis

import aiolimit
from aiolimit import (
    BackendError,
    InvalidArgumentError,
    LimiterError,
    MemoryBackend,
    NotConfiguredError,
    Observer,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
)
from aiolimit.otel import OpenTelemetryObserver
from tools import LocalRedis

looptime = pytest.mark.looptime


class Recorder(Observer):
    """Every report, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.trips: list[int] = []

    def granted(self, name: str, permits: int, waited: float) -> None:
        self.events.append(("granted", name, permits, waited))

    def refused(self, name: str, permits: int) -> None:
        self.events.append(("refused", name, permits))

    def failed(self, name: str, permits: int, error: LimiterError) -> None:
        self.events.append(("failed", name, permits, type(error)))

    def queued(self, name: str, change: int) -> None:
        self.events.append(("queued", name, change))

    def round_trip(self, requests: int) -> None:
        self.trips.append(requests)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    assert aiolimit.observe(recorder) is None
    try:
        yield recorder
    finally:
        aiolimit.observe(None)


@looptime
async def test_grants_refusals_and_a_reservation_s_exact_wait_are_reported(recorder):
    limiter = RateLimiter("api", MemoryBackend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    assert await limiter.try_acquire(2)
    assert not await limiter.try_acquire(1)
    assert not await limiter.try_acquire(1, timeout=0.5)  # the wait would be 1 s
    waiter = asyncio.create_task(limiter.acquire(1))
    await asyncio.sleep(0.25)
    assert recorder.events[-1] == ("queued", "api", 1)  # waiting now
    await waiter
    assert recorder.events == [
        ("granted", "api", 2, 0.0),
        ("refused", "api", 1),
        ("refused", "api", 1),
        ("queued", "api", 1),
        ("queued", "api", -1),
        ("granted", "api", 1, 1.0),  # the 2 permits of t=0 left the window at t=1
    ]


@looptime
async def test_a_cancelled_waiter_leaves_the_queue_and_is_neither_granted_nor_refused(
    recorder,
):
    limiter = RateLimiter("api", MemoryBackend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 10))
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert recorder.events[1:] == [("queued", "api", 1), ("queued", "api", -1)]


@looptime
async def test_errors_are_reported_by_type_and_still_raised(recorder):
    backend = MemoryBackend()
    with pytest.raises(NotConfiguredError):
        await RateLimiter("nothing", backend).try_acquire()
    limiter = RateLimiter("small", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 1))
    with pytest.raises(InvalidArgumentError):
        await limiter.try_acquire(4)
    assert recorder.events == [
        ("failed", "nothing", 1, NotConfiguredError),
        ("failed", "small", 4, InvalidArgumentError),
    ]


@looptime
async def test_a_sharded_limiter_reports_under_its_own_name_never_a_shard_s(recorder):
    limiter = ShardedRateLimiter("search", MemoryBackend(), shards=2)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 1))
    for _ in range(4):
        assert await limiter.try_acquire()
    assert not await limiter.try_acquire()
    await limiter.acquire()  # waits on one shard until t=1
    names = {event[1] for event in recorder.events}
    assert names == {"search"}
    assert recorder.events[-3:] == [
        ("queued", "search", 1),
        ("queued", "search", -1),
        ("granted", "search", 1, 1.0),
    ]
    assert [e[0] for e in recorder.events[:5]] == ["granted"] * 4 + ["refused"]


@looptime
async def test_nothing_is_reported_once_detached_and_only_observers_attach():
    recorder = Recorder()
    aiolimit.observe(recorder)
    assert aiolimit.observe(None) is recorder
    limiter = RateLimiter("quiet", MemoryBackend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 1))
    assert await limiter.try_acquire()
    assert recorder.events == []
    with pytest.raises(InvalidArgumentError, match=r"observer must be an aiolimit\.Observer"):
        aiolimit.observe(print)  # type: ignore[arg-type]


async def test_round_trips_report_how_many_requests_each_carried(redis_server, recorder):
    redis = Redis.from_url(redis_server.url)
    try:
        limiter = RateLimiter("trips", RedisBackend(redis))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        recorder.trips.clear()
        assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(50))))
    finally:
        await redis.aclose()
    assert sum(recorder.trips) == 50  # every request went in exactly one round trip
    assert 1 <= len(recorder.trips) < 50  # shared: at least one carried several
    assert max(recorder.trips) > 1


# -- OpenTelemetry -------------------------------------------------------------------------------


class Metrics:
    """The SDK's in-memory reader, with its points by instrument."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def points(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "aiolimit"
                for metric in scope.metrics:
                    found[metric.name] = list(metric.data.data_points)
        return found


def by_attributes(points: list[Any]) -> dict[frozenset[tuple[str, Any]], Any]:
    return {frozenset(point.attributes.items()): point for point in points}


@pytest.fixture
def otel() -> Iterator[Metrics]:
    metrics = Metrics()
    aiolimit.observe(OpenTelemetryObserver(meter_provider=metrics.provider))
    try:
        yield metrics
    finally:
        aiolimit.observe(None)
        metrics.provider.shutdown()


def limiter_is(name: str, **more: str) -> frozenset[tuple[str, str]]:
    return frozenset({"aiolimit.limiter": name, **more}.items())


@looptime
async def test_otel_requests_permits_waits_and_queue_read_back(otel):
    backend = MemoryBackend()
    limiter = RateLimiter("partner-api", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 1))
    assert await limiter.try_acquire(2)
    assert await limiter.try_acquire(1)
    assert not await limiter.try_acquire(1)
    with pytest.raises(NotConfiguredError):
        await RateLimiter("unset", backend).try_acquire()
    waiters = [asyncio.create_task(limiter.acquire(1)) for _ in range(2)]
    await asyncio.sleep(0.5)

    queued = by_attributes(otel.points()["aiolimit.queued"])
    assert queued[limiter_is("partner-api")].value == 2
    await asyncio.gather(*waiters)
    points = otel.points()

    requests = by_attributes(points["aiolimit.requests"])
    assert requests[limiter_is("partner-api", **{"aiolimit.result": "granted"})].value == 4
    assert requests[limiter_is("partner-api", **{"aiolimit.result": "refused"})].value == 1
    error = limiter_is("unset", **{"aiolimit.result": "error", "error.type": "NotConfiguredError"})
    assert requests[error].value == 1
    assert len(requests) == 3
    permits = by_attributes(points["aiolimit.permits"])
    assert permits[limiter_is("partner-api")].value == 5
    assert by_attributes(points["aiolimit.queued"])[limiter_is("partner-api")].value == 0
    (wait,) = points["aiolimit.wait.duration"]  # only the two callers that waited
    assert dict(wait.attributes) == {"aiolimit.limiter": "partner-api"}
    assert wait.count == 2
    assert wait.sum == pytest.approx(1.0 + 1.0)  # both freed at t=1, asked at t=0
    assert wait.explicit_bounds[:3] == (0.001, 0.005, 0.01)


@looptime
async def test_otel_never_carries_a_client_id(otel):
    backend = MemoryBackend()
    await RateLimiter("per-user", backend).set_rate(
        RateLimiterConfig.build(RateType.PER_CLIENT, 1, 1)
    )
    for user in ("user-42", "user-43"):
        assert await RateLimiter("per-user", backend.with_client(user)).try_acquire()
    requests = otel.points()["aiolimit.requests"]
    assert [(dict(p.attributes), p.value) for p in requests] == [
        ({"aiolimit.limiter": "per-user", "aiolimit.result": "granted"}, 2)
    ]


async def test_otel_round_trips_and_requests_read_back(redis_server, otel):
    redis = Redis.from_url(redis_server.url)
    try:
        limiter = RateLimiter("batched", RedisBackend(redis))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        points = otel.points()
        trips_before = points["aiolimit.redis.round_trips"][0].value
        sent_before = points["aiolimit.redis.requests"][0].value
        assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(40))))
    finally:
        await redis.aclose()
    points = otel.points()
    (trips,) = points["aiolimit.redis.round_trips"]
    (sent,) = points["aiolimit.redis.requests"]
    assert dict(trips.attributes) == {} and dict(sent.attributes) == {}
    assert sent.value - sent_before == 40  # each request in exactly one round trip
    assert 1 <= trips.value - trips_before < 40  # shared
    assert "aiolimit.redis.batch.size" not in points  # off by default: a record per trip


async def test_otel_batch_size_histogram_when_asked(redis_server):
    metrics = Metrics()
    aiolimit.observe(OpenTelemetryObserver(metrics.provider, batch_sizes=True))
    redis = Redis.from_url(redis_server.url)
    try:
        limiter = RateLimiter("histogram", RedisBackend(redis))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(40))))
    finally:
        aiolimit.observe(None)
        await redis.aclose()
    points = metrics.points()
    (batch,) = points["aiolimit.redis.batch.size"]
    assert batch.count == points["aiolimit.redis.round_trips"][0].value
    assert batch.sum == points["aiolimit.redis.requests"][0].value == 40 + 1  # and set_rate
    assert batch.max > 1
    metrics.provider.shutdown()


# -- logs ---------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_an_outage_is_logged_once_and_its_recovery_once(caplog):
    caplog.set_level(logging.DEBUG, logger="aiolimit")
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        try:
            limiter = RateLimiter("outage", RedisBackend(redis))
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
            assert await limiter.try_acquire()  # the scripts' first load: NOSCRIPT, at debug
            caplog.clear()
            for _ in range(20):
                assert await limiter.try_acquire()
            assert caplog.records == []  # never a line per grant
            server.kill()
            for _ in range(3):
                with pytest.raises(BackendError, match="unreachable"):
                    await limiter.try_acquire()
            down = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(down) == 1, [r.getMessage() for r in down]
            resends = [r for r in caplog.records if r.levelno == logging.DEBUG]
            assert any("connection to Redis lost" in r.getMessage() for r in resends)
            assert f"Redis at 127.0.0.1:{server.port} is unreachable" in down[0].getMessage()
            server.start()  # same port; a fresh server without the config
            # The first failure opened the limiter's circuit breaker: the two calls after it
            # failed at once, without reaching Redis, and so does any call for its back-off.
            await asyncio.sleep(aiolimit.breaker_of(limiter.backend, "outage").first_backoff)
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
            assert await limiter.try_acquire()
            up = [r for r in caplog.records if r.levelno >= logging.WARNING][1:]
            assert len(up) == 1, [r.getMessage() for r in up]
            assert "answers again after" in up[0].getMessage()
            assert "(1 requests failed)" in up[0].getMessage()
            # The fresh server had no scripts (nor functions): loaded again, said at debug only.
            debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
            assert any("NOSCRIPT" in line or "not found" in line for line in debug), debug
            caplog.clear()
            for _ in range(20):
                assert await limiter.try_acquire()
            assert caplog.records == []
        finally:
            await redis.aclose()


@looptime
async def test_otel_reports_a_learned_rate_and_its_ceiling(otel):
    limiter = RateLimiter(
        "learned-api", MemoryBackend(), rate=RateLimiterConfig.build(RateType.OVERALL, 20, 2)
    )
    assert await limiter.try_acquire()
    await aiolimit.Learner(limiter).refused()  # 10 (half the ceiling), cut to 5
    points = otel.points()
    assert by_attributes(points["aiolimit.learned.rate"])[limiter_is("learned-api")].value == 2.5
    ceiling = by_attributes(points["aiolimit.learned.ceiling"])[limiter_is("learned-api")]
    assert ceiling.value == 10
