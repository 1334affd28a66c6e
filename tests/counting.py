"""Counts a backend's calls and keeps the attempts it answered, for tests of how many round
trips a surface makes.

>>> calls = count_calls(monkeypatch, backend)
>>> await limiter.try_acquire()
>>> calls.count["try_acquire"], calls.attempts       # 1, [Grant(...)]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from aiolimit import Backend
from aiolimit.backends.base import Attempt

__all__ = ["Calls", "count_calls"]

COUNTED = ("try_acquire", "start_acquire", "wait_time", "available_permits", "release")


@dataclass
class Calls:
    count: Counter[str] = field(default_factory=Counter)
    attempts: list[Attempt] = field(default_factory=list)
    """What each ``try_acquire`` answered, in order."""


def count_calls(monkeypatch: pytest.MonkeyPatch, backend: Backend) -> Calls:
    """Counts the calls of :data:`COUNTED` on ``backend``'s class, for the test's length."""
    calls = Calls()
    kind = type(backend)
    for method in COUNTED:
        monkeypatch.setattr(kind, method, _counted(calls, method, getattr(kind, method)))
    return calls


def _counted(calls: Calls, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
    if method == "try_acquire":

        async def attempt(self: Backend, *args: Any, **kwargs: Any) -> Attempt:
            calls.count[method] += 1
            answer: Attempt = await original(self, *args, **kwargs)
            calls.attempts.append(answer)
            return answer

        return attempt

    def counted(self: Backend, *args: Any, **kwargs: Any) -> Any:
        calls.count[method] += 1
        return original(self, *args, **kwargs)

    return counted
