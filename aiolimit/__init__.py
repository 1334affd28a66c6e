"""aiolimit: an asyncio-native, Redis-backed distributed rate limiter with permit acquisition.

>>> from aiolimit import RateLimiter, RedisBackend
>>> limiter = RateLimiter("partner-api", RedisBackend(Redis.from_url("redis://localhost")))
>>> await limiter.try_set_rate("100/hour")
>>> async with limiter:
...     await call_partner()

``RedisBackend`` is imported when first used (``from aiolimit import RedisBackend`` works as
ever): a process that only uses ``MemoryBackend`` does not import ``redis.asyncio``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._acquire import Acquired
from ._breaker import Breaker, BreakerPolicy
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight
from ._learn import Learned, Learner
from ._lease import Lease
from ._limiter import RateLimiter, acquire_all
from ._observe import Observer, observe
from ._sharded import ShardedRateLimiter
from ._types import (
    MAX_DURATION,
    MAX_RATE,
    Algorithm,
    Duration,
    Rate,
    RateLimiterConfig,
    Rates,
    RateType,
)
from .backends import Backend, Grant, MemoryBackend, Refusal, Settlement
from .backends._lease import ConcurrencyConfig
from .backends.base import breaker_of
from .errors import (
    BackendError,
    CredentialsError,
    InvalidArgumentError,
    LeaseLostError,
    LimiterError,
    NotConfiguredError,
    RateLimited,
)

if TYPE_CHECKING:
    from .backends.base import Settlement as Settled  # noqa: F401  # deprecated: warns (below)
    from .backends.redis import RedisBackend

__version__ = "0.1.0"

__all__ = [
    "MAX_DURATION",
    "MAX_RATE",
    "Acquired",
    "Algorithm",
    "Backend",
    "BackendError",
    "Breaker",
    "BreakerPolicy",
    "ConcurrencyConfig",
    "ConcurrencyLimiter",
    "CredentialsError",
    "Duration",
    "Grant",
    "InFlight",
    "InvalidArgumentError",
    "Learned",
    "Learner",
    "Lease",
    "LeaseLostError",
    "LimiterError",
    "MemoryBackend",
    "NotConfiguredError",
    "Observer",
    "Rate",
    "RateLimited",
    "RateLimiter",
    "RateLimiterConfig",
    "RateType",
    "Rates",
    "RedisBackend",
    "Refusal",
    "Settlement",
    "ShardedRateLimiter",
    "__version__",
    "acquire_all",
    "breaker_of",
    "observe",
]


def __getattr__(name: str) -> object:
    if name == "RedisBackend":
        from .backends.redis import RedisBackend

        globals()["RedisBackend"] = RedisBackend
        return RedisBackend
    if name == "Settled":  # (not kept in globals: each use warns)
        from ._deprecated import deprecated

        deprecated("aiolimit.Settled", "aiolimit.Settlement (Acquired.settle's result)")
        return Settlement
    raise AttributeError(f"module 'aiolimit' has no attribute {name!r}")
