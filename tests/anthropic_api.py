"""A fake of Anthropic's messages API for the transport's tests, served in process (a
``MockTransport``'s handler, of either flavour): it keeps an input and an output tokens quota
apart, the way Anthropic documents them, each a sliding window by arrival on the event loop's
clock (in whole microseconds, as the limiters count). A request's input tokens (its prompt)
are counted when it arrives; its ``max_tokens`` is reserved of the output quota then and
adjusted to the tokens it wrote when it completes. Past either quota it answers ``429`` with
``Retry-After``; every answer carries ``anthropic-ratelimit-input-tokens-*`` and
``-output-tokens-*`` (``states = False``: none).

>>> api = MessagesAPI(httpx2, input_quota=3000, output_quota=1000, window=60.0)
>>> transport = RateLimitedTransport(requests, httpx2.MockTransport(api.handle), tokens=...)
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import deque
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import Any


class _Entry:
    __slots__ = ("arrived", "input", "output")

    def __init__(self, arrived: int, input: int, output: int) -> None:
        self.arrived, self.input, self.output = arrived, input, output


class MessagesAPI:
    """``handle`` answers ``POST /v1/messages`` (JSON) after ``latency`` seconds, with a
    usage whose ``output_tokens`` is drawn (seeded) up to the request's ``max_tokens``."""

    def __init__(
        self,
        http: ModuleType,
        input_quota: int,
        output_quota: int,
        window: float,
        latency: float = 0.5,
        seed: int = 7,
    ) -> None:
        self.http = http
        self.input_quota, self.output_quota, self.window = input_quota, output_quota, window
        self.latency = latency
        self.random = random.Random(seed)
        self.log: deque[_Entry] = deque()
        self.states = True  # whether answers carry the rate-limit headers
        self.arrivals: list[int] = []  # (µs)
        self.refused = 0
        self.used = {"input": 0, "output": 0}  # what the served calls' usage says

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """What the fake counts of a request's prompt (a real API tokenizes it)."""
        return sum(len(message["content"]) for message in body["messages"]) // 4

    def counted(self, now: int) -> tuple[int, int]:
        """The input and output tokens the window counts at ``now`` (µs)."""
        while self.log and self.log[0].arrived <= now - round(self.window * 1e6):
            self.log.popleft()
        return sum(e.input for e in self.log), sum(e.output for e in self.log)

    async def handle(self, request: Any) -> Any:
        now = _now()
        self.arrivals.append(now)
        body = json.loads(request.content)
        prompt, max_tokens = self.prompt_tokens(body), body["max_tokens"]
        used_in, used_out = self.counted(now)
        if used_in + prompt > self.input_quota or used_out + max_tokens > self.output_quota:
            self.refused += 1
            headers = {"retry-after": "1", **self.headers(now)}
            return self.http.Response(429, headers=headers, json={"type": "error"})
        entry = _Entry(now, prompt, max_tokens)
        self.log.append(entry)
        await asyncio.sleep(self.latency)
        entry.output = written = self.random.randint(1, max_tokens)
        self.used["input"] += prompt
        self.used["output"] += written
        usage = {"input_tokens": prompt, "output_tokens": written}
        return self.http.Response(200, headers=self.headers(_now()), json=_message(body, usage))

    def headers(self, now: int) -> dict[str, str]:
        if not self.states:
            return {}
        used_in, used_out = self.counted(now)
        reset = (datetime.now(timezone.utc) + timedelta(seconds=self.window)).isoformat()
        return {
            "anthropic-ratelimit-input-tokens-limit": str(self.input_quota),
            "anthropic-ratelimit-input-tokens-remaining": str(self.input_quota - used_in),
            "anthropic-ratelimit-input-tokens-reset": reset,
            "anthropic-ratelimit-output-tokens-limit": str(self.output_quota),
            "anthropic-ratelimit-output-tokens-remaining": str(self.output_quota - used_out),
            "anthropic-ratelimit-output-tokens-reset": reset,
        }


def _now() -> int:
    return round(asyncio.get_running_loop().time() * 1e6)


def _message(body: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": "fine"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
