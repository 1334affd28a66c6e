"""Where limiter state lives: Redis (shared by processes and hosts) or this process's memory."""

from .base import Attempt, Backend
from .memory import MemoryBackend
from .redis import RedisBackend

__all__ = ["Attempt", "Backend", "MemoryBackend", "RedisBackend"]
