"""``RateLimiter``: a named, distributed rate limiter.

A permit's path: ``RateLimiter.try_acquire`` checks its arguments and goes through the one
acquire (``_acquire``, which :func:`aiolimit.acquire_all` uses too): it asks the backend once
(``Backend.try_acquire``: one Lua script, or its Python twin), and sleeps until a reserved
slot starts. Everything else a limiter does lives in the base (``_base._Limiter``).
"""

from __future__ import annotations

from . import _observe
from ._acquire import acquire, attempt_one, check_permits, max_wait_of
from ._base import _Limiter
from ._breaker import Breaker
from ._setup import setup_of
from ._types import Algorithm, Duration, Rates, RateType
from .backends.base import Backend, Grant

__all__ = ["RateLimiter"]


class RateLimiter(_Limiter):
    """A named, distributed rate limiter: at most ``rate`` permits in any sliding ``interval``.

    >>> limiter = RateLimiter("partner-api", RedisBackend(Redis()), rate="100/hour")
    >>> async with limiter:          # waits for one permit
    ...     await call_partner()
    >>> if not await limiter.try_acquire(3, timeout=2.5):
    ...     raise TooBusy(retry_after=await limiter.wait_time(3))

    Waiting is exact and fair: a request that cannot be served now is given the first slot
    in which enough permits are free, after every request that asked before it, in any
    process, and sleeps until then. Objects are cheap; create one wherever convenient.

    ``rate`` (with ``interval`` for an int; ``rate_type``, ``algorithm``, ``min_spacing``,
    ``keep_alive`` as :meth:`ensure_rate` takes them) is checked here and made the stored
    config by the first permit call (``acquire``, ``try_acquire``, ``async with``, the
    decorator, :func:`acquire_all`), once per object: the code's rate replaces a stored
    one. Without it, the limiter uses the stored config (``set_rate``, ``try_set_rate``,
    ``aiolimit set-rate``).
    """

    __slots__ = ()

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        rate: Rates | None = None,
        interval: Duration | None = None,
        rate_type: RateType | str | None = None,
        algorithm: Algorithm | str | None = None,
        min_spacing: Duration | None = None,
        keep_alive: Duration | None = None,
    ) -> None:
        super().__init__(name, backend)
        self._setup = setup_of(rate, interval, rate_type, algorithm, min_spacing, keep_alive)

    @classmethod
    def _view(cls, name: str, backend: Backend, breaker: Breaker) -> RateLimiter:
        """A limiter on ``backend`` without checking the name: a shard of a
        ShardedRateLimiter (its name holds a NUL, which no plain limiter's may, so no plain
        limiter can share its state) or a client's view of a limiter."""
        limiter = cls.__new__(cls)
        limiter._name = name
        limiter._backend = backend
        limiter._breaker = breaker
        limiter._names = [name]
        limiter._setup = None
        return limiter

    def for_client(self, client_id: str) -> RateLimiter:
        """This limiter as client ``client_id`` sees it: for a ``PER_CLIENT`` limiter, that
        client's budget (the backend's ``with_client`` view; one circuit breaker for all).

        >>> per_user = RateLimiter("api-per-user", backend)
        >>> await aiolimit.acquire_all([(everyone, 1), (per_user.for_client(user_id), 1)])
        """
        view = RateLimiter._view(self._name, self._backend.with_client(client_id), self._breaker)
        view._setup = self._setup  # the rate given at construction: stored once for all
        return view

    def __repr__(self) -> str:
        return f"RateLimiter({self._name!r}, {type(self._backend).__name__})"

    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        """Takes ``permits`` if they can be had within ``timeout`` seconds.

        ``timeout=0`` makes one attempt; ``None`` waits as long as it takes, and so does any
        timeout longer than ``MAX_DURATION`` (10 years; ``math.inf`` included). When the
        permits will not be free within the timeout, returns False at once; otherwise they are
        reserved and this sleeps until they are free, then returns True. A negative or NaN
        timeout raises InvalidArgumentError.
        """
        permits = check_permits(permits)
        max_wait = max_wait_of(timeout)
        setup = self._setup
        if setup is not None and not setup.done:
            await setup.ensure(self)
        observer = _observe.current
        if observer is not None:
            return (await acquire([self], [permits], max_wait, observer)).granted
        # The common case in this frame: a grant at once, or a refusal. A reservation (to
        # sleep out, then check for a block) goes on along the one path.
        attempt = await attempt_one(self, permits, max_wait)
        if not isinstance(attempt, Grant):
            return False
        if attempt.starts_in <= 0:
            return True
        return (await acquire([self], [permits], max_wait, None, first=[attempt])).granted

    async def release(self, permits: int) -> None:
        """Hands back ``permits`` from the most recent grants, as if they had not happened."""
        await self._backend.release(self._name, check_permits(permits))
