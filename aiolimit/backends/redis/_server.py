"""What a :class:`~aiolimit.RedisBackend` and its ``with_client`` views share besides the
store's context (one store, one key layout), made once from the constructor's arguments,
checked: the client and its round trips, the clock, the prefix, each caller's deadline, and
what was learnt of each limiter (its keys, its rate type), so that a view's first call on a
``PER_CLIENT`` limiter is one round trip, not two (an ASGI middleware makes a view per
request)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from ..._types import RateType
from ..._values import Duration, check_text
from ...errors import InvalidArgumentError
from ._coalescer import Coalescer, coalescer
from ._deadlines import Deadlines, call_timeout
from ._keys import Keys, Recent

__all__ = ["Clock", "Server"]

Clock = Literal["server", "client"] | Callable[[], float]


class Server(NamedTuple):
    """A Redis store as its backend and the backend's views reach it (see the module)."""

    redis: Any
    pipe: Coalescer
    clock: Callable[[], float] | None  # None: the server's TIME
    prefix: str
    deadlines: Deadlines | None
    keys: Recent[str, Keys]
    types: Recent[str, RateType]

    @classmethod
    def of(cls, redis: Any, clock: Clock, prefix: str, timeout: Duration | None) -> Server:
        """The ``RedisBackend`` options ``clock``, ``prefix`` and ``timeout``, checked."""
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise InvalidArgumentError(f"prefix must be a str without braces, not {prefix!r}")
        if prefix:
            check_text(prefix, "prefix")
        timeout_s = call_timeout(timeout)
        if clock == "client":
            clock = time.time
        elif clock != "server" and not callable(clock):
            raise InvalidArgumentError(
                f"clock must be 'server', 'client' or a callable, not {clock!r}"
            )
        pipe = coalescer(redis)
        return cls(
            redis,
            pipe,
            None if clock == "server" else clock,
            prefix,
            pipe.deadlines(timeout_s),  # its callers' (one per timeout)
            Recent(),
            Recent(),
        )
