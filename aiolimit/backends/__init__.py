"""Where limiter state lives: Redis (shared by processes and hosts) or this process's memory.

``Backend`` is the contract a store implements; ``Grant`` and ``Refusal`` are what its
``try_acquire`` returns, ``Started`` what its ``start_acquire`` does. ``RedisBackend`` is
imported when first used, so that ``import aiolimit`` does not import ``redis.asyncio``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Attempt, Backend, Grant, Refusal, SetMode, Settlement, Started
from .memory import MemoryBackend

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = [
    "Attempt",
    "Backend",
    "Grant",
    "MemoryBackend",
    "RedisBackend",
    "Refusal",
    "SetMode",
    "Settlement",
    "Started",
]


def __getattr__(name: str) -> object:
    if name == "RedisBackend":
        from .redis import RedisBackend

        globals()["RedisBackend"] = RedisBackend
        return RedisBackend
    raise AttributeError(f"module 'aiolimit.backends' has no attribute {name!r}")
