"""aiolimit: an asyncio-native, Redis-backed distributed rate limiter with permit acquisition.

>>> from aiolimit import RateLimiter, RateType, RedisBackend
>>> limiter = RateLimiter("partner-api", RedisBackend(Redis.from_url("redis://localhost")))
>>> await limiter.try_set_rate(RateType.OVERALL, 100, timedelta(hours=1))
>>> async with limiter:
...     await call_partner()
"""

from ._limiter import RateLimiter, ShardedRateLimiter
from ._observe import Observer, observe
from ._types import MAX_DURATION, MAX_RATE, Algorithm, Duration, Rate, RateLimiterConfig, RateType
from .backends import Backend, MemoryBackend, RedisBackend
from .errors import (
    BackendError,
    InvalidArgumentError,
    LimiterError,
    NotConfiguredError,
    RateLimited,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_DURATION",
    "MAX_RATE",
    "Algorithm",
    "Backend",
    "BackendError",
    "Duration",
    "InvalidArgumentError",
    "LimiterError",
    "MemoryBackend",
    "NotConfiguredError",
    "Observer",
    "Rate",
    "RateLimited",
    "RateLimiter",
    "RateLimiterConfig",
    "RateType",
    "RedisBackend",
    "ShardedRateLimiter",
    "__version__",
    "observe",
]
