"""A per-process AIMD pacer: what teams write when they do not know a partner's limit.

>>> pacer = AimdPacer(rate=20.0)
>>> async with httpx.AsyncClient(transport=PacedTransport(pacer)) as client: ...

Each process paces its own calls (one start every ``1 / rate`` seconds, from its share of the
fleet's guess, which is also its most), halves its rate on a ``429`` (at most once a
second), adds ``increase`` (0.1/s) per second while calls succeed, and sleeps
the ``Retry-After`` of a refused call before sending it once more. Nothing is shared: N
processes each back off and probe on their own. The benchmark's baseline
(``benchmarks/learn.py``), not part of aiolimit.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from tools.partner import LATENESS_HEADER


class AimdPacer:
    """One process's rate: multiplicative decrease on a 429, additive increase on success."""

    def __init__(
        self, rate: float, *, floor: float = 0.2, increase: float = 0.1, decrease: float = 0.5
    ) -> None:
        self.rate, self.ceiling, self.floor = rate, rate, floor
        self.increase, self.decrease = increase, decrease
        self._next = 0.0  # when the next call may start (monotonic)
        self._cut_at = -1e9
        self._grown_at = time.monotonic()

    async def wait(self) -> float:
        """Waits for this call's turn; returns the time it started (wall clock)."""
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + 1.0 / self.rate
        await asyncio.sleep(start - now)
        return time.time()

    def refused(self) -> None:
        now = time.monotonic()
        if now - self._cut_at >= 1.0:
            self.rate = max(self.floor, self.rate * self.decrease)
            self._cut_at = self._grown_at = now

    def succeeded(self) -> None:
        now = time.monotonic()
        if now - self._grown_at >= 1.0:
            self.rate = min(self.ceiling, self.rate + self.increase)
            self._grown_at = now


class PacedTransport(httpx.AsyncBaseTransport):
    """An httpx transport paced by an :class:`AimdPacer`; a refused call sleeps its
    ``Retry-After`` and is sent once more. Each request carries its start (``x-grant-start``)
    for the partner's lateness count."""

    def __init__(self, pacer: AimdPacer, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._pacer = pacer
        self._transport = transport or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._send(request)
        if response.status_code == 429:
            await response.aclose()
            retry_after = response.headers.get("retry-after", "1")
            await asyncio.sleep(float(retry_after) if retry_after.isdigit() else 1.0)
            response = await self._send(request)
        return response

    async def _send(self, request: httpx.Request) -> httpx.Response:
        started = await self._pacer.wait()
        request.headers[LATENESS_HEADER] = str(round(started * 1e6))
        response = await self._transport.handle_async_request(request)
        if response.status_code == 429:
            self._pacer.refused()
        else:
            self._pacer.succeeded()
        return response

    async def aclose(self) -> None:
        await self._transport.aclose()
