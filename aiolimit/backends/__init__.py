"""Where limiter state lives: Redis (shared by processes and hosts) or this process's memory.

``Backend`` is the contract a store implements; ``Grant`` and ``Refusal`` are what its
``try_acquire`` returns.
"""

from .base import Attempt, Backend, Grant, Refusal, SetMode
from .memory import MemoryBackend
from .redis import RedisBackend

__all__ = ["Attempt", "Backend", "Grant", "MemoryBackend", "RedisBackend", "Refusal", "SetMode"]
