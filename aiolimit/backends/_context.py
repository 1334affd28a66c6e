"""What every store has, of either kind (rates: :class:`~aiolimit.backends.Backend`; leases:
:class:`~aiolimit.backends.LeaseStore`): one :class:`StoreContext`, shared by the store and
every ``with_client`` view of it, which owns what belongs to the store and not to one view:
its limiters' circuit breakers, its clock maps (one per clock) and every task it runs in the
background, so that ``aclose()`` waits for all of them.

>>> backend.context.tasks.spawn(backend.release_lease(name, lease_id), "a lease handed back")
>>> await backend.aclose()          # waits for it (and for every other task of the store)
"""

from __future__ import annotations

import abc
import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from .._breaker import DEFAULT_POLICY, BreakerPolicy, Breakers
from ..errors import InvalidArgumentError
from ._clock import ClockMaps
from ._margin import Margins

__all__ = ["CLOSE_WITHIN", "Background", "Store", "StoreContext"]

log = logging.getLogger("aiolimit")
T = TypeVar("T")

CLOSE_WITHIN = 5.0
"""Seconds ``aclose()`` waits at most for a store's background tasks."""


class Background:
    """The tasks a store runs on its own (a cancelled caller's grant or lease handed back, an
    event stream's settle, a slot released from a callback): referenced until they end, so
    that none is collected half-way, and waited for by :meth:`aclose`.

    >>> tasks.spawn(store.release(name, permits, member), "a hand-back")
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        work: Awaitable[T],
        what: str,
        failed: Callable[[BaseException], None] | None = None,
    ) -> asyncio.Future[T]:
        """Runs ``work`` in a task of its own (a task is taken as it is). A failure is
        given to ``failed``; without one, logged as a warning that starts with ``what``."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

        def done(ended: asyncio.Future[T]) -> None:
            self._tasks.discard(ended)
            if ended.cancelled() or (error := ended.exception()) is None:
                return
            if failed is None:
                log.warning("%s: %s", what, error)
            else:
                failed(error)

        task.add_done_callback(done)
        return task

    async def aclose(self, within: float = CLOSE_WITHIN) -> None:
        """Waits (at most ``within`` seconds) for this event loop's tasks under way, and
        for those they start meanwhile. (Tasks of a loop that has closed are forgotten.)"""
        loop = asyncio.get_running_loop()
        self._tasks = {task for task in self._tasks if not task.get_loop().is_closed()}
        deadline = loop.time() + within
        while running := {task for task in self._tasks if task.get_loop() is loop}:
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.wait(running, timeout=left)


class StoreContext:
    """What a store owns for itself and every ``with_client`` view of it (one per store):

    ``breakers``, its limiters' circuit breakers by name, with the store's
    :class:`~aiolimit.BreakerPolicy`; ``clocks``, where each clock its limiters run on
    stands on this process's (``backends/_clock.py``); ``tasks``, its background tasks
    (:class:`Background`); ``margins``, what this process keeps of its limiters' measured
    margins (``backends/_margin.py``). A third party's store makes none of its own: the base class's
    ``__init__`` does, and a view is given its store's (``context=``).
    """

    __slots__ = ("breakers", "clocks", "margins", "tasks")

    def __init__(self, breaker_policy: BreakerPolicy | None = None) -> None:
        if breaker_policy is not None and not isinstance(breaker_policy, BreakerPolicy):
            raise InvalidArgumentError(f"breaker must be a BreakerPolicy, not {breaker_policy!r}")
        self.breakers = Breakers(DEFAULT_POLICY if breaker_policy is None else breaker_policy)
        self.clocks = ClockMaps()
        self.tasks = Background()
        self.margins = Margins()

    async def aclose(self) -> None:
        """Waits (at most :data:`CLOSE_WITHIN` seconds) for the background tasks."""
        await self.tasks.aclose()


class Store(abc.ABC):  # noqa: B024 (a base: a store is a Backend, a LeaseStore or both)
    """What every store has, whatever it keeps: its :class:`StoreContext` (``context``),
    where its state lives (``store_id``), its breakers' back-offs (``breaker_policy``) and
    :meth:`aclose`.

    ``breaker``: the store's :class:`~aiolimit.BreakerPolicy` (the default when None).
    ``context``: a ``with_client`` view passes its store's, and so shares it (with no
    ``breaker`` of its own).
    """

    __slots__ = ("__weakref__", "_context")

    def __init__(
        self, breaker: BreakerPolicy | None = None, *, context: StoreContext | None = None
    ) -> None:
        if context is None:
            context = StoreContext(breaker)
        elif breaker is not None:
            raise InvalidArgumentError("a view shares its store's context: it takes no breaker")
        self._context = context

    @property
    def context(self) -> StoreContext:
        """What this store owns, shared by its ``with_client`` views (:class:`StoreContext`)."""
        return self._context

    @property
    def store_id(self) -> Hashable:
        """Where the state lives: stores with equal ``store_id`` share every limiter's state
        (a store and its ``with_client`` views do), so a name on them is one limiter;
        :func:`aiolimit.acquire_all` takes a limiter once. This default, for a store that does
        not say: the store's class (every store of it one store)."""
        return type(self)

    @property
    def breaker_policy(self) -> BreakerPolicy:
        """The back-offs of its limiters' circuit breakers (the ``breaker`` option); each
        limiter's own :class:`~aiolimit.Breaker` is ``limiter.breaker``."""
        return self._context.breakers.policy

    @property
    def breaker(self) -> BreakerPolicy:
        """Deprecated: :attr:`breaker_policy` (this name goes in the next release)."""
        warnings.warn(
            "backend.breaker is now backend.breaker_policy (a BreakerPolicy; limiter.breaker "
            "is the limiter's Breaker); the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.breaker_policy

    async def aclose(self) -> None:
        """Waits (at most 5 s) for the store's background tasks: of this store and of every
        ``with_client`` view of it, those of the thousands of views an ASGI middleware keeps
        included. The Redis client stays open: it belongs to whoever made it."""
        await self._context.aclose()
