"""A LangChain rate limiter that shares one quota across every process of a fleet.

>>> from aiolimit.langchain import LangChainRateLimiter
>>> requests = RateLimiter("openai-requests", RedisBackend(redis), rate="500/minute")
>>> model = ChatOpenAI(model="gpt-4o-mini", rate_limiter=LangChainRateLimiter(requests))
>>> await model.ainvoke("hello")  # takes a permit of the shared limiter first

LangChain's own ``InMemoryRateLimiter`` keeps one process to its rate; every worker that
runs a chat model with this one takes its permits from the same limiter, so the fleet keeps
the provider's quota together, first come first served. ``await model.ainvoke(...)`` (and
``astream``, ``abatch``) take the permit on the caller's event loop. The sync methods
(``invoke``, ``stream``, ``batch``) take it on an event loop of the adapter's own, in a
thread it starts at the first sync call: give a limiter used that way a backend of its own
(a Redis client is bound to the event loop it first ran on). Needs
``pip install 'aiolimit-redis[langchain]'``.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    from langchain_core.rate_limiters import BaseRateLimiter
except ImportError as exc:
    raise missing_extra("aiolimit.langchain", "langchain") from exc

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._checks import check_permits
from ._limiter import RateLimiter
from ._sharded import ShardedRateLimiter
from ._types import Duration

__all__ = ["LangChainRateLimiter"]

_T = TypeVar("_T")


class LangChainRateLimiter(BaseRateLimiter):
    """A LangChain ``BaseRateLimiter`` over ``limiter``: each model call takes ``permits``.

    ``blocking=True`` (what chat models ask) waits for the permits, up to ``timeout``
    seconds when one is given (None: as long as it takes), and returns whether they were
    granted; ``blocking=False`` takes them only if they are free now. The wait is the
    limiter's own: the caller is given its slot, in order, across every process."""

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int = 1,
        timeout: Duration | None = None,
    ) -> None:
        if not isinstance(limiter, (RateLimiter, ShardedRateLimiter)):
            raise TypeError(
                f"limiter must be a RateLimiter or a ShardedRateLimiter, not {limiter!r}"
            )
        self.limiter = limiter
        self.permits = check_permits(permits)
        self.timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    async def aacquire(self, *, blocking: bool = True) -> bool:
        if not blocking:
            return await self.limiter.try_acquire(self.permits)
        return await self.limiter.try_acquire(self.permits, timeout=self.timeout)

    def acquire(self, *, blocking: bool = True) -> bool:
        """:meth:`aacquire` for sync callers, run on the adapter's own event loop."""
        return self._run(self.aacquire(blocking=blocking))

    def _run(self, call: Coroutine[Any, Any, _T]) -> _T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._loop.run_forever, name="aiolimit-langchain", daemon=True
                )
                thread.start()
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(call, loop).result()

    def close(self) -> None:
        """Stops the adapter's own event loop (if a sync call started one)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
