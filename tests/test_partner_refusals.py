"""What a partner refused is visible: each 429/503 the HTTP clients receive is reported to the
observer (``partner_refused``) and to OpenTelemetry (``aiolimit.partner.refusals``), and each
pause it starts is logged once (a WARNING on ``aiolimit``), not once per refused request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import aiolimit
from aiolimit import MemoryBackend, Observer, RateLimiter
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx import RateLimitedTransport
from aiolimit.otel import OpenTelemetryObserver
from tools import free_port


class Refusals(Observer):
    """Every ``partner_refused`` report."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, float | None]] = []

    def partner_refused(self, name: str, status: int, pause: float | None) -> None:
        self.seen.append((name, status, pause))


@pytest.fixture
def refusals() -> Iterator[Refusals]:
    observer = Refusals()
    aiolimit.observe(observer)
    try:
        yield observer
    finally:
        aiolimit.observe(None)


class Answers:
    """What the partner answers: ``refusals`` times ``status`` with ``Retry-After``, then 200."""

    def __init__(self, refusals: int, status: int = 429, retry_after: str | None = "0.2") -> None:
        self.refusals, self.status, self.retry_after = refusals, status, retry_after
        self.statuses: list[int] = []

    def next(self) -> tuple[int, dict[str, str]]:
        if self.refusals:
            self.refusals -= 1
            headers = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            self.statuses.append(self.status)
            return self.status, headers
        self.statuses.append(200)
        return 200, {}


def mock_client(limiter: RateLimiter, answers: Answers, **options: Any) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        status, headers = answers.next()
        return httpx.Response(status, headers=headers, json={})

    inner = httpx.MockTransport(handle)
    return httpx.AsyncClient(transport=RateLimitedTransport(limiter, inner, **options))


def pause_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("aiolimit") and record.levelno == logging.WARNING
    ]


@pytest.mark.looptime
async def test_httpx_reports_every_429_and_logs_one_line_per_pause(
    refusals: Refusals, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/min")
    answers = Answers(refusals=3)
    with caplog.at_level(logging.DEBUG, logger="aiolimit"):
        async with mock_client(limiter, answers) as client:
            first = await asyncio.gather(*(client.get("https://partner.example/") for _ in "abc"))
            await asyncio.sleep(5)  # a second episode, long after the first pause ended
            answers.refusals = 1
            second = await client.get("https://partner.example/")
    assert [r.status_code for r in [*first, second]] == [200] * 4  # each retried after its pause
    assert answers.statuses.count(429) == 4
    assert refusals.seen == [("partner", 429, 0.2)] * 4
    lines = pause_lines(caplog)
    assert len(lines) == 2, lines
    for line in lines:
        assert "'partner'" in line and "429" in line and "0.2 s" in line


@pytest.mark.looptime
async def test_a_refusal_without_retry_after_is_reported_with_no_pause(
    refusals: Refusals, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/min")
    answers = Answers(refusals=2, status=503, retry_after=None)
    with caplog.at_level(logging.WARNING, logger="aiolimit"):
        async with mock_client(limiter, answers) as client:
            statuses = [(await client.get("https://partner.example/")).status_code for _ in "ab"]
    assert statuses == [503, 503]  # not retried: nothing said when
    assert refusals.seen == [("partner", 503, None)] * 2
    [line] = pause_lines(caplog)  # the two within a second: one episode
    assert "'partner'" in line and "503" in line and "Retry-After" in line


@pytest.mark.looptime
async def test_otel_counts_the_partner_s_refusals_by_limiter_and_status() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    aiolimit.observe(OpenTelemetryObserver(meter_provider=provider))
    try:
        limiter = RateLimiter("partner", MemoryBackend(), rate="100/min")
        async with mock_client(limiter, Answers(refusals=2)) as client:
            await asyncio.gather(*(client.get("https://partner.example/") for _ in "ab"))
        data = reader.get_metrics_data()
    finally:
        aiolimit.observe(None)
        provider.shutdown()
    assert data is not None
    [metric] = [
        metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "aiolimit.partner.refusals"
    ]
    [point] = metric.data.data_points
    assert dict(point.attributes) == {
        "aiolimit.limiter": "partner",
        "http.response.status_code": 429,
    }
    assert point.value == 2
    assert metric.unit == "{response}"


@pytest.fixture
async def partner_url() -> AsyncIterator[tuple[str, Answers]]:
    answers = Answers(refusals=3, retry_after="0.5")

    async def handle(request: web.Request) -> web.Response:
        status, headers = answers.next()
        return web.json_response({}, status=status, headers=headers)

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/", answers
    finally:
        await runner.cleanup()


async def test_aiohttp_reports_every_429_and_logs_one_line_per_pause(
    partner_url: tuple[str, Answers], refusals: Refusals, caplog: pytest.LogCaptureFixture
) -> None:
    url, answers = partner_url
    assert answers.refusals == 3
    limiter = RateLimiter("partner", MemoryBackend(), rate="100/min")
    middleware = RateLimitedClientMiddleware(limiter)

    async def get(session: aiohttp.ClientSession) -> int:
        async with session.get(url) as response:
            return response.status

    with caplog.at_level(logging.DEBUG, logger="aiolimit"):
        async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
            statuses = await asyncio.gather(*(get(session) for _ in "abc"))
    assert statuses == [200, 200, 200]
    assert answers.statuses.count(429) == 3
    assert refusals.seen == [("partner", 429, 0.5)] * 3
    [line] = pause_lines(caplog)
    assert "'partner'" in line and "429" in line and "0.5 s" in line


def test_an_observer_written_before_the_hook_keeps_working() -> None:
    class Old(Observer):
        def granted(self, name: str, permits: int, waited: float) -> None: ...

    assert Old().partner_refused("partner", 429, 1.0) is None
