"""``ShardedRateLimiter``: one rate split over shards that live on different cluster slots."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import Any

from ._acquire import Acquired, Outcome, give_back, outcome_of, take
from ._awaiting import awaited
from ._base import _Limiter, most_telling
from ._checks import check_permits, check_sync, max_wait_of
from ._limiter import RateLimiter, view_of
from ._request import Request, deadline_in, left_of
from ._setting import rate_in_code
from ._types import Duration, Rate, RateLimiterConfig
from .backends.base import Backend, breaker_of
from .errors import BackendError, InvalidArgumentError, LimiterError, NotConfiguredError

__all__ = ["ShardedRateLimiter", "shard_of"]

MAX_SHARDS = 256
_SLOTS = 16384  # Redis Cluster's hash slots
_MARK = "\x00shard"  # between a sharded limiter's name and a shard's number
_SHARD_NAME = re.compile(r"([^\x00]+)\x00shard(0|[1-9][0-9]*)(?:\.[1-9][0-9]*)?")


def _split_rate(rate: int, shards: int) -> list[int]:
    """Each shard's budget: ``rate // shards``, the remainder spread one by one over the
    first shards, so the budgets sum to ``rate`` exactly (10 over 3: 4, 3, 3)."""
    if rate < shards:
        raise InvalidArgumentError(
            f"a rate of {rate} cannot be split over {shards} shards: every shard needs a "
            f"budget of at least 1 permit (use a rate >= {shards} or fewer shards)"
        )
    return _shares(rate, shards)


def _shares(total: int, shards: int) -> list[int]:
    """``total`` split as :func:`_split_rate` splits a rate, 0 allowed (2 over 3: 1, 1, 0)."""
    base, extra = divmod(total, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def _shard_names(name: str, shards: int, backend: Backend) -> list[str]:
    """The sub-limiters' names: ``f"{name}\\x00shard{i}"``, on a store spread over slots
    (``backend.slot``) suffixed ``.<n>`` when needed so that shard ``i``'s slot lies near the
    middle of the ``i``-th of ``shards`` equal parts of the slot space. ``redis-cli --cluster
    create`` gives M masters M equal slot ranges, so with ``shards <= M`` every shard lands on
    its own master. The names depend only on the name, the shard count and the store's key
    layout: every process computes the same ones. No plain limiter's name may hold a NUL, so
    no plain limiter can be (or touch) a shard.
    """
    base = [f"{name}{_MARK}{i}" for i in range(shards)]
    if backend.slot(base[0]) is None:
        return base
    part = _SLOTS / shards
    reach = max(part / 4, 1.0)
    names = []
    for i, candidate in enumerate(base):
        middle = part * (i + 0.5)
        chosen = candidate
        for n in range(1, 200_000):  # about 2 * shards tries on average
            if abs((backend.slot(chosen) or 0) - middle) <= reach:
                break
            chosen = f"{candidate}.{n}"
        else:  # pragma: no cover - not seen for any name; any slot still works
            chosen = candidate
        names.append(chosen)
    return names


def shard_of(stored: str) -> tuple[str, int] | None:
    """The sharded limiter's name and the shard's number of a name :func:`_shard_names`
    made (``"search\\x00shard2.17"``: ``("search", 2)``); None for any other name (a plain
    limiter's, which holds no NUL). What ``aiolimit list``, ``inspect`` and ``delete`` read
    the shards found on a server by."""
    match = _SHARD_NAME.fullmatch(stored)
    return None if match is None else (match[1], int(match[2]))


class ShardedRateLimiter(_Limiter):
    """One rate split over ``shards`` sub-limiters that live on different cluster slots.

    >>> limiter = ShardedRateLimiter(
    ...     "search-api", RedisBackend(RedisCluster(...)), shards=3, rate="30000/second"
    ... )                                                         # 10_000/s per shard
    >>> async with limiter:
    ...     await call_search()

    One Redis node runs one limiter's scripts one at a time, which caps a plain
    :class:`RateLimiter` at what one node serves. Here each shard is an ordinary limiter with
    its own hash tag, placed so that with ``shards`` ≤ the number of masters (and the slot
    layout ``redis-cli --cluster create`` makes) every shard is on its own master.

    **Guarantee.** The shard budgets sum to the rate exactly (``rate // shards`` each, the
    remainder spread over the first shards), and each shard is an exact sliding window. So in
    any window of ``interval`` the grants of all shards together never exceed ``rate``,
    whichever shards callers pick. While a rate change is applied shard by shard, the sum
    never exceeds the larger of the old and new rates.

    **Choosing a shard.** ``try_acquire`` tries one shard (round robin, from a random start
    per object), and when it refuses, each other shard once, before waiting; so a permit free
    anywhere is found, at the cost of up to ``shards`` round trips for a refusal. It then
    waits on the shard whose wait is shortest, exactly as :class:`RateLimiter` waits.

    **Trade-offs.**

    - A request is served by one shard: ``permits`` may not exceed the largest shard budget
      (``ceil(rate / shards)``), and free permits scattered over shards do not add up (with
      rate 10 over 2 shards and 3 free on each, a request for 4 waits).
    - Fairness is per shard: waiters on one shard in this process are served first come,
      first served, but a waiter does not move to another shard that frees earlier, and
      callers that find a free shard may pass waiters queued on another one. Share one
      object per name within a process so its callers skip shards that have waiters.
    - Minimum per-shard rate: ``rate >= shards`` (else ``InvalidArgumentError``). Small shard
      budgets waste more to fragmentation; keep ``rate / shards`` well above the typical
      request.
    - ``shards`` is part of the limiter's identity (it picks the shard names). Processes
      using different shard counts for one name each admit up to the rate; change it only
      together with the name, or with every user stopped.
    - ``PER_CLIENT`` gives each client id a budget of ``rate`` split the same way.
    - No ``min_spacing``: the set-rate methods refuse it (``InvalidArgumentError``), since
      each shard could space only its own grants.
    """

    __slots__ = ("_last", "_next", "_shards", "_waiting")

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        shards: int,
        rate: RateLimiterConfig | str | None = None,
        **legacy_options: Any,
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise InvalidArgumentError(f"shards must be an int >= 1, not {shards!r}")
        if shards > MAX_SHARDS:
            raise InvalidArgumentError(f"shards must be at most {MAX_SHARDS}, not {shards}")
        given = rate_in_code(rate, legacy_options, "ShardedRateLimiter")
        super().__init__(name, backend, given)
        self._names = _shard_names(self.name, shards, backend)
        self._shards = [  # a shard's lost config is this limiter's: it writes every shard
            view_of(n, backend, breaker_of(backend, n), self.rate_in_code) for n in self._names
        ]
        self._next = random.randrange(shards)
        self._last = 0  # the shard of this object's latest grant, where release starts
        self._waiting = [0] * shards  # this object's tasks waiting on each shard
        if given is not None:
            self._configs(given)  # a rate the shards cannot split fails here

    @property
    def shards(self) -> Sequence[RateLimiter]:
        """The sub-limiters, one per shard."""
        return tuple(self._shards)

    def __repr__(self) -> str:
        return (
            f"ShardedRateLimiter({self.name!r}, {type(self.backend).__name__}, "
            f"shards={len(self._shards)})"
        )

    def _configs(self, config: RateLimiterConfig) -> list[RateLimiterConfig]:
        """Each shard gets its share of every rate. A ``min_spacing`` is refused: each shard
        could keep it only among its own grants, and grants of different shards would start
        together."""
        if config.min_spacing is not None:
            raise InvalidArgumentError(
                f"min_spacing ({config.min_spacing}) cannot be kept by a ShardedRateLimiter: "
                "each shard spaces only its own grants, and grants of different shards may "
                "start together; use a RateLimiter for a spacing"
            )
        shards = len(self._shards)
        shares = [_split_rate(rate.permits, shards) for rate in config.rates]
        configs = []
        for i in range(shards):
            rates = tuple(
                Rate(share[i], rate.interval)
                for share, rate in zip(shares, config.rates, strict=True)
            )
            debt = None if config.max_debt is None else _shares(config.max_debt, shards)[i]
            configs.append(replace(config, rates=rates, max_debt=debt))
        return configs

    @awaited
    async def try_acquire(self, permits: int = 1, *, timeout: Duration | None = 0) -> bool:
        """Takes ``permits`` from one shard if some shard can give them within ``timeout``.

        Tries every shard once (starting with the next in turn), then waits on the shard with
        the shortest wait. ``timeout=0`` never waits; ``None`` (or a timeout longer than
        ``MAX_DURATION``) waits as long as it takes; when even the shortest wait is longer
        than ``timeout``, returns False at once. A shard whose node fails is skipped;
        ``BackendError`` is raised only when no shard answers.
        """
        return (await self._take(check_permits(permits), max_wait_of(timeout))).granted

    def _take(
        self, permits: int, max_wait: int | None, *, settled: bool = False
    ) -> Coroutine[Any, Any, Acquired]:
        """The shard's acquisition (a refusal: the shard that could grant soonest), reported
        under this limiter's name (the engine asks :meth:`serve`; a grant to be settled
        reserves on its shard as any grant does: it is not paced)."""
        return take(Request((self,), (permits,), deadline_in(max_wait)))

    async def serve(self, request: Request) -> Outcome:
        """How the engine takes a request of this limiter's (``try_acquire``, ``reserve``,
        the HTTP clients): a grant at once from the first shard that has one, else the wait
        on the shard whose wait is shortest (the observer sees its caller queued there, under
        this limiter's name), else the refusal of that shard."""
        permits = request.permits
        count = len(self._shards)
        start = self._next
        self._next = (start + 1) % count
        refused: dict[int, Outcome] = {}  # shard -> its refusal
        queued: list[int] = []  # shards where tasks of this process already wait
        errors: list[LimiterError] = []  # why the other shards cannot serve this request
        at_once = deadline_in(0)
        for i in [(start + k) % count for k in range(count)]:
            if self._waiting[i]:
                queued.append(i)  # do not pass the tasks waiting there
                continue
            try:
                outcome = await outcome_of(Request((self._shards[i],), permits, at_once))
            except (NotConfiguredError, InvalidArgumentError, BackendError) as exc:
                errors.append(exc)  # no config, permits > this shard's budget, node down
                continue
            if outcome.granted:
                self._last = i
                return outcome
            refused[i] = outcome
        if not refused and not queued:
            raise most_telling(errors, permits[0], count)
        if refused:
            best = min(refused, key=lambda i: refused[i].retry_in)
            left = left_of(request.deadline)
            if left == 0 or (left is not None and refused[best].retry_in > left):
                return refused[best]
        else:  # every shard that answers has waiters here: queue behind the fewest
            best = min(queued, key=self._waiting.__getitem__)
        self._waiting[best] += 1
        try:
            shard = Request((self._shards[best],), permits, request.deadline, owners=(self,))
            outcome = await outcome_of(shard)
        finally:
            self._waiting[best] -= 1
        if outcome.granted:
            self._last = best
        return outcome

    async def cap_remaining(self, remaining: int, *, reset: Duration) -> None:
        """A provider's count as a cap (:meth:`RateLimiter.cap_remaining`), split over the
        shards by their share of the rate, as the rate is (10 over 3 shards: 4, 3, 3): the
        shards together grant at most ``remaining`` more until ``reset``."""
        remaining, reset_us = check_sync(remaining, reset)
        shares = _shares(remaining, len(self._shards))
        await self._with_config(
            lambda: asyncio.gather(
                *(
                    shard.breaker.guard(self.backend.sync(shard.name, share, reset_us))
                    for shard, share in zip(self._shards, shares, strict=True)
                )
            )
        )

    async def _hand_back_latest(self, permits: int) -> None:
        """The most recent grants of the shard this object granted from last, then of the
        following shards, until ``permits`` are handed back."""
        count = len(self._shards)
        left = permits
        for k in range(count):
            if left <= 0:
                break
            left -= await give_back(self._shards[(self._last + k) % count], left)
