"""Where limiter state lives: Redis (shared by processes and hosts) or this process's memory.

Two contracts: ``Backend``, the rate store (``RateLimiter`` and the rest), and
``LeaseStore``, the lease store (``ConcurrencyLimiter``); ``MemoryBackend`` and
``RedisBackend`` are both. Each store (and every ``with_client`` view of it) has one
``StoreContext``: its breakers, clock maps and background tasks. ``Grant`` and ``Refusal``
are what a backend's ``try_acquire`` returns, ``Started`` what its ``start_acquire`` (and
``start_foresee``) does, ``InTask`` one that runs in a task.
``RedisBackend`` is imported when first used, so that ``import aiolimit`` does not import
``redis.asyncio``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._context import Store, StoreContext
from ._lease import LeaseStore
from .base import Attempt, Backend, Grant, InTask, Refusal, SetMode, Settlement, Started
from .memory import MemoryBackend

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = [
    "Attempt",
    "Backend",
    "Grant",
    "InTask",
    "LeaseStore",
    "MemoryBackend",
    "RedisBackend",
    "Refusal",
    "SetMode",
    "Settlement",
    "Started",
    "Store",
    "StoreContext",
]


def __getattr__(name: str) -> object:
    if name == "RedisBackend":
        from .redis import RedisBackend

        globals()["RedisBackend"] = RedisBackend
        return RedisBackend
    raise AttributeError(f"module 'aiolimit.backends' has no attribute {name!r}")
