"""An LLM provider that keeps a requests and a tokens quota the way providers document it:
each in its own sliding window, counted when a request *arrives*, a request's prompt plus its
``max_tokens`` charged at arrival and adjusted to what it used when it completes (Anthropic's
rule; OpenAI's is alike). Past either quota it answers ``429`` with ``Retry-After`` and
OpenAI's rate-limit headers (``x-ratelimit-remaining-tokens``, ``x-ratelimit-reset-tokens``,
and ``-requests``), which every answer carries.

>>> provider = Provider(tpm=200_000, rpm=400, window=2.0)
>>> with serve(provider) as url:
...     ...  # POST {"prompt_tokens": 800, "max_tokens": 1024} to f"{url}/v1/chat/completions"

A call's ``usage`` is drawn from a skewed distribution of its ``max_tokens``: the completion
is ``max_tokens * r**3`` tokens for a uniform ``r`` (a quarter of ``max_tokens`` on average,
an eighth at the median: most calls use far less than they may), and the call takes the
matching share of ``latency`` (longer answers take longer). The draws come from one seeded
generator, so two providers of one seed answer the same sequence of calls alike. A fake
counts a prompt by its ``prompt_tokens`` field; a real provider tokenizes the messages.

``GET /stats`` answers what it counted as JSON; :func:`seen` reads it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tools.partner import arrival_late, serve

__all__ = ["Provider", "Seen", "seen", "serve"]

SKEW = 3
"""The completion is ``max_tokens * r**SKEW`` for a uniform ``r``."""


class _Entry:
    """One admitted request in the provider's window: when it arrived, what it counts."""

    __slots__ = ("arrived", "in_log", "tokens")

    def __init__(self, arrived: float, tokens: int) -> None:
        self.arrived, self.tokens, self.in_log = arrived, tokens, True


class Provider:
    """An ASGI app keeping ``tpm`` tokens and ``rpm`` requests per ``window`` seconds (a
    sliding window each, by arrival), answering after ``latency`` (the shortest and the
    longest call, in seconds)."""

    def __init__(
        self,
        tpm: int,
        rpm: int,
        window: float,
        latency: tuple[float, float] = (0.01, 0.1),
        seed: int = 0,
    ) -> None:
        self.tpm, self.rpm, self.window, self.latency = tpm, rpm, window, latency
        self.calls: list[tuple[float, int]] = []  # (arrival, usage.total_tokens) of each served
        # (arrival, completion, charge - usage) of each served: how long it counted more
        self.spans: list[tuple[float, float, int]] = []
        self.refused: list[float] = []  # the 429s' arrival times
        self.late: list[tuple[float, float]] = []  # (arrival, s since its grant's start)
        self.requests: list[tuple[float, float | None, bool]] = []  # (arrival, late, served)
        self._log: deque[_Entry] = deque()  # the admitted requests of the last window
        self._tokens = 0  # what the log's entries count
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def admit(self, now: float, prompt: int, max_tokens: int) -> tuple[_Entry | None, float]:
        """Charges a request's prompt + ``max_tokens`` at ``now``: its entry, or None and the
        seconds until both quotas would let it in."""
        charge = prompt + max_tokens
        with self._lock:
            log = self._log
            while log and log[0].arrived <= now - self.window:
                gone = log.popleft()
                gone.in_log = False
                self._tokens -= gone.tokens
            if len(log) < self.rpm and self._tokens + charge <= self.tpm:
                entry = _Entry(now, charge)
                log.append(entry)
                self._tokens += charge
                return entry, 0.0
            self.refused.append(now)
            return None, self._wait(now, charge)

    def _wait(self, now: float, charge: int) -> float:
        log, wait = self._log, 0.0
        if len(log) >= self.rpm:
            wait = log[len(log) - self.rpm].arrived + self.window - now
        counted = self._tokens
        for entry in log:  # the oldest leave first
            if counted + charge <= self.tpm:
                break
            counted -= entry.tokens
            wait = max(wait, entry.arrived + self.window - now)
        return wait

    def complete(self, entry: _Entry, used: int, now: float | None = None) -> None:
        """The call of ``entry`` used ``used`` tokens (completed at ``now``, by default the
        time): its charge becomes that."""
        completed = time.time() if now is None else now
        with self._lock:
            if entry.in_log:
                self._tokens += used - entry.tokens
            self.spans.append((entry.arrived, completed, entry.tokens - used))
            entry.tokens = used
            self.calls.append((entry.arrived, used))

    def draw(self, max_tokens: int) -> tuple[int, float]:
        """A call's completion tokens and how long it takes."""
        with self._lock:
            share = self._random.random() ** SKEW
        shortest, longest = self.latency
        return max(1, round(max_tokens * share)), shortest + (longest - shortest) * share

    def headers(self, now: float) -> list[tuple[bytes, bytes]]:
        """OpenAI's rate-limit headers: what is left, and when each count is back to full."""
        with self._lock:
            newest = self._log[-1].arrived if self._log else now - self.window
            tokens, requests = self.tpm - self._tokens, self.rpm - len(self._log)
        reset = f"{max(0.0, newest + self.window - now) * 1000:.0f}ms".encode()
        return [
            (b"x-ratelimit-limit-tokens", str(self.tpm).encode()),
            (b"x-ratelimit-remaining-tokens", str(max(0, tokens)).encode()),
            (b"x-ratelimit-reset-tokens", reset),
            (b"x-ratelimit-limit-requests", str(self.rpm).encode()),
            (b"x-ratelimit-remaining-requests", str(max(0, requests)).encode()),
            (b"x-ratelimit-reset-requests", reset),
        ]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/stats":
            await _answer(send, 200, [], json.dumps(self.stats()).encode())
            return
        if scope["path"] == "/ping":  # (a caller's connection, opened before the run)
            await _answer(send, 200, [], b"ok")
            return
        body = json.loads(await _body(receive) or b"{}")
        prompt, max_tokens = int(body["prompt_tokens"]), int(body["max_tokens"])
        now = time.time()
        late = arrival_late(scope, now)  # (limiter clock and ours: one machine's)
        if late is not None:
            with self._lock:
                self.late.append((now, late))
        if prompt + max_tokens > self.tpm:
            await _answer(send, 400, [], b"prompt_tokens + max_tokens exceed the quota")
            return
        entry, wait = self.admit(now, prompt, max_tokens)
        with self._lock:
            self.requests.append((now, late, entry is not None))
        if entry is None:
            retry_after = str(max(1, math.ceil(wait))).encode()  # (whole seconds, as most do)
            headers = [(b"retry-after", retry_after), *self.headers(now)]
            await _answer(send, 429, headers, b'{"error": "rate_limit_exceeded"}')
            return
        completion, takes = self.draw(max_tokens)
        await asyncio.sleep(takes)
        total = prompt + completion
        self.complete(entry, total)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
        await _answer(send, 200, self.headers(time.time()), json.dumps({"usage": usage}).encode())

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "tpm": self.tpm,
                "rpm": self.rpm,
                "window": self.window,
                "calls": list(self.calls),
                "spans": list(self.spans),
                "refused": list(self.refused),
                "late": list(self.late),
                "requests": list(self.requests),
            }


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Seen:
    """A provider's view of a run's steady windows."""

    served: int
    refused: int  # the 429s of the whole run
    windows: int
    token_share: float  # the tokens used per window (by arrival), over the tokens quota
    lowest_token_share: float  # ... in the window that had the fewest
    request_share: float  # the requests served per window, over the requests quota
    late_p99: float | None = None  # s from a grant's start to its request's arrival (steady)
    stall: float = 0.0  # the longest any caller's event loop ran late (a busy machine)
    unexcused: int = 0  # the 429s a limiter with the trial's margin is to blame for
    ceiling: float = 1.0  # the most of the tokens quota the calls in flight left (ceiling())


def seen(stats: dict[str, Any], began: float, windows: int, margin: float = 0.0) -> Seen:
    """What a provider's ``stats()`` say about ``windows`` windows from one window after
    ``began`` (the callers' first burst left out); the 429s of the whole run, and those a
    limiter with ``margin`` is to blame for (:func:`unexcused`)."""
    window, tpm, rpm = stats["window"], stats["tpm"], stats["rpm"]
    first = began + window
    tokens, requests = [0] * windows, [0] * windows
    for arrived, used in stats["calls"]:
        number = math.floor((arrived - first) / window)
        if 0 <= number < windows:
            tokens[number] += used
            requests[number] += 1
    late = sorted(late for at, late in stats.get("late", ()) if at >= first)
    return Seen(
        served=len(stats["calls"]),
        refused=len(stats["refused"]),
        windows=windows,
        token_share=sum(tokens) / (tpm * windows) if windows else 0.0,
        lowest_token_share=min(tokens) / tpm if windows else 0.0,
        request_share=sum(requests) / (rpm * windows) if windows else 0.0,
        late_p99=late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
        unexcused=unexcused(stats.get("requests", ()), window, margin),
        ceiling=ceiling(stats.get("spans", ()), first, windows * window, tpm),
    )


def ceiling(
    spans: Iterable[tuple[float, float, int]], first: float, span: float, tpm: int
) -> float:
    """The most of the tokens quota that callers could have used from ``first`` for ``span``
    s, given the calls in flight: the provider counts a call's prompt + ``max_tokens`` from
    its arrival to its completion, so on average ``tpm`` less what the calls in flight
    counted beyond their usage (``spans``: arrival, completion, that excess) was left for
    usage. No limiter that reserves the worst case and settles can use more without 429s."""
    if span <= 0:
        return 1.0
    end = first + span
    held = sum(
        excess * max(0.0, min(done, end) - max(arrived, first)) for arrived, done, excess in spans
    )
    return 1.0 - held / span / tpm


def unexcused(
    requests: Iterable[tuple[float, float | None, bool]], window: float, margin: float
) -> int:
    """The 429s a limiter with ``margin`` is to blame for: those whose request and every
    request the provider served in the window before it arrived within ``margin`` of one
    another's lateness after their grants' starts (the limiter promises its grants' starts;
    a request that landed later than the margin allows, or carries no grant, is the
    callers' spread, as in ``tools.partner.unexcused``)."""
    blamed = 0
    served: deque[tuple[float, float | None]] = deque()
    for arrival, late, ok in sorted(requests, key=lambda request: request[0]):
        while served and served[0][0] <= arrival - window:
            served.popleft()
        if ok:
            served.append((arrival, late))
            continue
        together = [late, *(before for _, before in served)]
        if None not in together:
            known = [value for value in together if value is not None]
            blamed += max(known) - min(known) <= margin
    return blamed
