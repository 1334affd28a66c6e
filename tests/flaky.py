"""A memory store that fails on demand, for tests of the circuit breaker.

>>> backend = Flaky()
>>> backend.down = True       # each try_acquire takes 0.5 s, then raises BackendError
>>> backend.reached           # the attempts that reached the store
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiolimit import BackendError, MemoryBackend
from aiolimit.backends.base import Attempt

__all__ = ["Flaky"]


class Flaky(MemoryBackend):
    """A memory store that fails while ``down``, counting the attempts that reach it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.down = False
        self.reached = 0

    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Attempt:
        self.reached += 1
        if self.down:
            await asyncio.sleep(0.5)  # a call's deadline
            raise BackendError("the store is unreachable")
        return await super().try_acquire(name, permits, max_wait_us)
