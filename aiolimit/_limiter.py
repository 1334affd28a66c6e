"""``RateLimiter``: a named, distributed rate limiter, and :func:`acquire_all` over several.

A permit's path: ``RateLimiter.try_acquire`` checks its arguments and goes through the engine
(``_acquire``, which :func:`acquire_all` uses too): it asks the backend once
(``Backend.try_acquire``: one Lua script, or its Python twin), and sleeps until a reserved
slot starts. Everything else a limiter does lives in the base (``_base._Limiter``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Hashable, Iterable
from typing import Any, NoReturn, overload

from ._acquire import Acquired, begin_margins, give_back, take, try_one
from ._awaiting import Awaiting, awaiting
from ._base import _Limiter, made_from_parts
from ._breaker import Breaker
from ._checks import check_permits, check_sync, check_take, max_wait_of
from ._code_config import CodeConfig
from ._concurrency import ConcurrencyLimiter
from ._coroutine import returns_coroutine
from ._inflight import InFlight
from ._request import Request, deadline_in
from ._setting import rate_in_code
from ._types import Duration, RateLimiterConfig, shown
from .backends.base import Backend
from .errors import InvalidArgumentError

__all__ = ["RateLimiter", "acquire_all", "view_of"]

_new = object.__new__  # (an Awaiting made without a Python frame: try_acquire's hot path)


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

    ``rate`` (a :class:`RateLimiterConfig` or its text, as :meth:`ensure_rate` takes it:
    ``rate="10/second; keep_alive=3600"``) is checked here and made the stored config by
    the first call (``acquire``, ``try_acquire``,
    ``async with``, the decorator, :func:`acquire_all`, ``wait_time``, ...), once per object:
    the code's rate replaces a stored one. When a call finds the store without a config (a
    ``keep_alive`` that ran out while the limiter idled, a restart, ``FLUSHALL``), the rate is
    written again (one write for all the process's callers) and the call goes on. Without it,
    the limiter uses the stored config (``set_rate``, ``try_set_rate``, ``aiolimit
    set-rate``), and a call finds none (``NotConfiguredError``) while there is none. (The
    loose rate arguments of earlier releases, ``interval=``, ``rate_type=``, ``algorithm=``,
    ``min_spacing=``, ``keep_alive=``, ``margin=``, ``max_debt=`` or an int ``rate``, still
    work, with a DeprecationWarning.)
    """

    __slots__ = ()

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        rate: RateLimiterConfig | str | None = None,
        **legacy_options: Any,
    ) -> None:
        super().__init__(name, backend, rate_in_code(rate, legacy_options, "RateLimiter"))

    def for_client(self, client_id: str) -> RateLimiter:
        """This limiter as client ``client_id`` sees it: for a ``PER_CLIENT`` limiter, that
        client's budget (the backend's ``with_client`` view; one circuit breaker for all).

        >>> per_user = RateLimiter("api-per-user", backend)
        >>> await aiolimit.acquire_all([(everyone, 1), (per_user.for_client(user_id), 1)])
        """
        backend = self.backend.with_client(client_id)
        return view_of(self.name, backend, self.breaker, self.rate_in_code)

    def __repr__(self) -> str:
        return f"RateLimiter({self.name!r}, {type(self.backend).__name__})"

    @returns_coroutine
    def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> Awaiting[bool]:
        """Takes ``permits`` if they can be had within ``timeout`` seconds.

        ``timeout=0`` makes one attempt; ``None`` waits as long as it takes, and so does any
        timeout longer than ``MAX_DURATION`` (10 years; ``math.inf`` included). When the
        permits will not be free within the timeout, returns False at once; otherwise they are
        reserved and this sleeps until they are free, then returns True. A negative or NaN
        timeout raises InvalidArgumentError.
        """
        # A coroutine function to inspect (returns_coroutine): the caller awaits the engine's
        # coroutine itself, one coroutine fewer per call. A bad argument raises in the await.
        # (The Awaiting is made here, not by awaiting(): no frame more per call.)
        max_wait: int | None = 0
        if not (type(permits) is int and permits == 1 and type(timeout) is int and timeout == 0):
            try:  # (the defaults, the common call, need no check: no frame for it)
                permits, max_wait = check_take(permits, timeout)
            except Exception as exc:  # (raised where the call is awaited)
                return awaiting(_raising(exc), "RateLimiter.try_acquire")
        made: Awaiting[bool] = _new(Awaiting)  # (both named RateLimiter.try_acquire, below)
        if not self.rate_in_code.stored or (
            max_wait != 0 and self.name not in self.backend.context.margins.begun
        ):  # (first: the rate in code written; a caller that may wait: the margin begun)
            made.coroutine = self._stored_then_try(permits, max_wait)
        else:
            made.coroutine = try_one(self, permits, max_wait)
        return made

    async def _stored_then_try(self, permits: int, max_wait: int | None) -> bool:
        await self.rate_in_code.store()
        if max_wait != 0:
            await begin_margins((self,))
        return await try_one(self, permits, max_wait)

    _stored_then_try.__qualname__ = "RateLimiter.try_acquire"  # (its never-awaited warning)

    def _take(
        self, permits: int, max_wait: int | None, *, settled: bool = False
    ) -> Coroutine[Any, Any, Acquired]:
        request = Request((self,), (permits,), deadline_in(max_wait))
        return take(request.settled() if settled else request)

    async def _hand_back_latest(self, permits: int) -> None:
        await give_back(self, permits)

    async def cap_remaining(self, remaining: int, *, reset: Duration) -> None:
        """Caps the permits left at a provider's own count: until ``reset`` seconds from now,
        at most ``remaining`` more are granted (for a ``for_client`` view: that client's).
        Never frees the limiter's own grants. A sliding window takes the provider's
        newest count in place of its last one (what it counts beyond the limiter's grants);
        fixed windows and token buckets only ever tighten.

        >>> quota = aiolimit_quota(response.headers)       # x-ratelimit-remaining-tokens, ...
        >>> await tokens.cap_remaining(quota.remaining, reset=quota.reset)
        """
        remaining, reset_us = check_sync(remaining, reset)
        await self._with_config(
            lambda: self.breaker.guard(self.backend.sync(self.name, remaining, reset_us))
        )


@overload
def acquire_all(  # type: ignore[overload-overlap]  # (an InFlight is an Acquired)
    requests: Iterable[tuple[RateLimiter, int]], *, timeout: Duration | None = 0
) -> Awaiting[Acquired]: ...


@overload
def acquire_all(
    requests: Iterable[tuple[RateLimiter | ConcurrencyLimiter, int]],
    *,
    timeout: Duration | None = 0,
) -> Awaiting[InFlight]: ...


def acquire_all(
    requests: Iterable[tuple[RateLimiter | ConcurrencyLimiter, int]],
    *,
    timeout: Duration | None = 0,
) -> Awaiting[Acquired]:
    """Takes permits from several limiters at once, all or nothing.

    >>> if not await aiolimit.acquire_all([(everyone, 1), (per_user, 1)], timeout=0.5):
    ...     return Response(status_code=429)

    ``requests`` are ``(limiter, permits)`` pairs (a ``PER_CLIENT`` limiter for a client is
    ``limiter.for_client(client_id)``). ``timeout`` as for :meth:`RateLimiter.try_acquire`:
    when every limiter can grant within it, each reserves its slot and this sleeps until the
    last one starts; when one cannot, nothing is taken (the others' grants are handed back)
    and the result is false, with ``retry_after``. Errors (``BackendError``,
    ``NotConfiguredError``, ``InvalidArgumentError``) are raised after handing back the
    others' grants. A limiter may appear once (the same name and client id on one store:
    one server and key prefix, or one ``MemoryBackend`` and its views).

    A :class:`ConcurrencyLimiter` among them (``(sem, 1)``: one slot) makes the result an
    :class:`~aiolimit.InFlight` that holds the slots: the slots are taken first (FIFO, within
    the timeout), then the rate permits with what is left of it, each slot renewed from the
    moment it is taken (one lost meanwhile: :class:`~aiolimit.LeaseLostError`, after
    everything taken went back); ``async with acquired:`` holds the slots while the call
    runs, and :meth:`~aiolimit.InFlight.release` before the call hands everything back
    (docs/concurrency.md).
    """
    return awaiting(_acquire_all(requests, timeout), "acquire_all")


async def _acquire_all(
    requests: Iterable[tuple[RateLimiter | ConcurrencyLimiter, int]], timeout: Duration | None
) -> Acquired:
    pairs = requests if requests.__class__ is list else list(requests)
    limiters: list[RateLimiter] = []
    permits: list[int] = []
    leasing: list[tuple[ConcurrencyLimiter, int]] = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            break
        if isinstance(pair[0], RateLimiter):
            limiters.append(pair[0])
            permits.append(check_permits(pair[1]))
        elif isinstance(pair[0], ConcurrencyLimiter):
            leasing.append((pair[0], check_permits(pair[1])))
        else:
            break
    if not pairs or len(limiters) + len(leasing) < len(pairs):
        raise InvalidArgumentError(
            "requests must be a non-empty list of (RateLimiter or ConcurrencyLimiter, permits) "
            f"pairs, not {shown(pairs)}"
        )
    if len(limiters) > 1 and len(set(map(_identity, limiters))) != len(limiters):
        raise InvalidArgumentError("a limiter appears twice in one acquire_all")
    if len({_slots_of(sem) for sem, _ in leasing}) != len(leasing):
        raise InvalidArgumentError("a concurrency limiter appears twice in one acquire_all")
    leasing.sort(key=lambda pair: _slots_of(pair[0]))  # one order for all: no deadlock
    deadline = deadline_in(max_wait_of(timeout))
    request = Request(tuple(limiters), tuple(permits), deadline, tuple(leasing))
    return await take(request.settled())


def view_of(
    name: str,
    backend: Backend,
    breaker: Breaker,
    rate_in_code: CodeConfig[RateLimiterConfig],
) -> RateLimiter:
    """A limiter on ``backend`` made from its parts, the name not checked: a shard of a
    ShardedRateLimiter (its name holds a NUL, which no plain limiter's may, so no plain
    limiter can share its state) or a client's view of a limiter; the rate its code gives is
    its limiter's (written once for all)."""
    return made_from_parts(RateLimiter, name, backend, breaker, rate_in_code)


def _identity(limiter: RateLimiter) -> tuple[Hashable, str, str]:
    """What makes two limiter objects one limiter: the store, the name and the client id."""
    backend = limiter.backend
    return (backend.store_id, limiter.name, backend.client_id)


def _slots_of(limiter: ConcurrencyLimiter) -> tuple[Hashable, str]:
    """What makes two concurrency limiter objects one: the store and the name."""
    return (limiter.backend.store_id, limiter.name)


async def _raising(error: Exception) -> NoReturn:
    """A coroutine that raises ``error`` when awaited: a bad argument's error, where an
    ``async def`` would have raised it."""
    raise error
