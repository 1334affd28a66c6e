from __future__ import annotations

import abc
import asyncio
import logging
import uuid
from collections.abc import Callable, Generator, Hashable
from typing import Any, Literal, NamedTuple, Protocol

from .._breaker import Breaker, BreakerPolicy
from .._types import Rate, RateLimiterConfig
from .._values import check_text
from ..errors import BackendError, InvalidArgumentError
from ._clock import ClockMap
from ._context import Store, StoreContext
from ._learning import Event, Law, Learned
from ._protocol import parse_grant

__all__ = [
    "Attempt",
    "Backend",
    "Grant",
    "InTask",
    "Refusal",
    "SetMode",
    "Settlement",
    "Started",
    "breaker_of",
    "hand_backs_failed",
]

log = logging.getLogger("aiolimit")

SetMode = Literal["try", "set", "update"]
"""How ``set_rate`` writes: ``"try"`` only where no config exists, ``"set"`` always,
``"update"`` only where one exists."""


class Grant(NamedTuple):
    """An attempt that was granted. Times are integer microseconds (exact at any rate)."""

    starts_in: int
    """Time from now until the grant starts: 0, or a reservation the caller sleeps out."""
    starts_at: int
    """When the grant starts, on the limiter's clock (Redis ``TIME`` by default)."""
    left: int
    """Permits left after it (negative while reservations are queued)."""
    member: str
    """Names this grant for the limiter's life: ``release(name, permits, member)`` hands back
    exactly what of it still counts against the limit."""
    blocked_until: int | None = None
    """The end of the limiter's latest ``block()`` (limiter's clock), if it has one: a caller
    that sleeps out a reservation then asks ``block_left`` whether a block came meanwhile."""
    binding: int = 0
    """Which of the config's rates has the fewest permits left (``left``): its place in
    ``RateLimiterConfig.rates``, the first of several such (always 0 for a single rate). A
    store that does not say keeps the default."""

    @property
    def granted(self) -> Literal[True]:
        return True


class Refusal(NamedTuple):
    """An attempt that was refused: nothing was taken. Times are integer microseconds."""

    retry_in: int
    """Time from now until enough permits for the request would be free."""
    at: int
    """When it was decided, on the limiter's clock."""
    left: int
    """Permits left (negative while reservations are queued)."""
    binding: int = 0
    """Which of the config's rates has the fewest permits left, as ``Grant.binding``."""

    @property
    def granted(self) -> Literal[False]:
        return False


Attempt = Grant | Refusal
"""What one ``Backend.try_acquire`` returns."""


class Settlement(NamedTuple):
    """What a settle did to a grant (``Acquired.settle``'s result; ``Backend.settle``'s)."""

    handed_back: int
    """Permits given back (settled for fewer than reserved): only what still counted."""
    charged: int
    """Permits charged beyond the reservation (settled for more), at the settle's time."""
    member: str
    """The grant's member from now on, what a later ``release`` or ``settle`` names (the
    one given when nothing changed; ``""`` for an acquisition that holds no grant)."""
    cut: int = 0
    """Permits asked for but not charged, because the limiter reached ``max_debt``."""


class Started(Protocol):
    """An attempt whose request is made (:meth:`Backend.start_acquire`): ``await`` it once
    for its :class:`Grant` or :class:`Refusal`, or :meth:`cancel` it when it will not be
    awaited (a grant it made, or makes, goes back)."""

    def __await__(self) -> Generator[Any, None, Attempt]: ...

    def cancel(self) -> None: ...


class InTask:
    """A started attempt that runs in a task of its own (``Backend.start_acquire``'s default:
    :meth:`Backend.try_acquire`; a store's :meth:`Backend.start_foresee`)."""

    __slots__ = ("_backend", "_name", "_task")

    def __init__(self, backend: Backend, name: str, task: asyncio.Future[Attempt]) -> None:
        self._backend, self._name, self._task = backend, name, task

    def __await__(self) -> Generator[Any, None, Attempt]:
        return self._task.__await__()

    def cancel(self) -> None:
        task = self._task
        if not task.done():
            task.cancel()  # a grant it makes meanwhile goes back (try_acquire's contract)
        elif not task.cancelled() and task.exception() is None:
            attempt = task.result()
            if isinstance(attempt, Grant):
                self._backend.hand_back(self._name, attempt.member)


class Backend(Store):
    """Where limiter state lives: the rate store, the contract every store of rates implements.

    A backend serves one client id (``client_id``, the budget ``PER_CLIENT`` limiters use);
    ``with_client`` returns a view of the same store for another id. Names are the limiters'
    names as given; a store keeps each name apart from every other. Durations are integer
    microseconds, so every value is exact however large the rate.

    The algorithm is the same in every store (``RedisBackend`` runs it in Lua,
    ``MemoryBackend`` in Python); a third-party store is checked by running the conformance
    suite (``tests/test_conformance.py``) on it. Every method raises only
    :class:`~aiolimit.LimiterError` subclasses: ``NotConfiguredError`` for a name with no
    config, ``InvalidArgumentError`` for permits above the rate, ``BackendError`` when the
    store fails: with ``outage=False`` when the store answered with an error about the call
    (a key holding foreign data), which a limiter's circuit breaker does not count.

    Concurrency limiters need the other contract, :class:`~aiolimit.backends.LeaseStore`; a
    store that keeps both (``MemoryBackend``, ``RedisBackend``) subclasses both.

    ``breaker``: the back-offs of its limiters' circuit breakers (:class:`BreakerPolicy`;
    the default when None; read back as ``breaker_policy``). A ``with_client`` view is made
    with ``context=`` its store's :class:`~aiolimit.backends.StoreContext`, and so shares
    its breakers, clock maps and background tasks (:meth:`aclose` of either waits for all of
    them, those of the thousands of views an ASGI middleware keeps included).
    """

    __slots__ = ("_random_id", "client_id")

    def __init__(
        self,
        client_id: str | None,
        breaker: BreakerPolicy | None = None,
        *,
        context: StoreContext | None = None,
    ) -> None:
        self.client_id: str = (
            uuid.uuid4().hex if client_id is None else check_text(client_id, "client_id")
        )
        # No id given: each backend (each process) is a client of its own, with its own
        # PER_CLIENT budget; said once (per_client_used), as it is seldom what was meant.
        self._random_id = client_id is None
        super().__init__(breaker, context=context)

    @abc.abstractmethod
    def with_client(self, client_id: str) -> Backend:
        """The same store seen by another client id (for ``PER_CLIENT`` limiters): the
        primitive under :meth:`RateLimiter.for_client`, which is how a limiter's user names
        a client. The view shares the store's context (made with ``context=self.context``)."""

    def per_client_used(self, name: str) -> None:
        """A store calls this when it serves a ``PER_CLIENT`` limiter's budget: on a random
        client id (no ``client_id`` given), a warning is logged once per process."""
        if self._random_id and not _said_random_client:
            _say_random_client(name, self.client_id)

    def clock_of(self, name: str) -> Hashable:
        """Which clock stamps ``name``'s grants: by default its own (one client may push it)."""
        return name

    def clock_map(self, name: str) -> ClockMap:
        """The limiter ``name``'s clock seen from this process's (``aiolimit._wakeup``)."""
        return self.context.clocks.of(self.clock_of(name))

    def slot(self, name: str) -> int | None:
        """Where the name's state lives, for stores spread over several nodes (Redis Cluster:
        the hash slot, 0-16383); None for a store in one place."""
        return None

    @abc.abstractmethod
    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        """Writes the config as ``mode`` says; returns whether it did. A config where none
        was, another rate type, or ``keep_state=False`` starts every budget full; with
        ``keep_state`` the grants inside the new window keep counting."""

    @abc.abstractmethod
    async def get_config(self, name: str) -> RateLimiterConfig | None:
        """The name's config, None when it has none."""

    @abc.abstractmethod
    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Attempt:
        """One attempt for ``permits``: a :class:`Grant` or a :class:`Refusal`.

        When the permits are not free now but will be within ``max_wait_us`` (None: any
        wait), they are reserved: a ``Grant`` with ``starts_in`` > 0, after every earlier
        reservation. A refusal takes nothing.

        If the caller is cancelled while the attempt is in flight and it grants, the backend
        hands that exact grant back (:meth:`hand_back`), so a cancelled caller holds nothing.
        """

    def start_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Started:
        """:meth:`try_acquire` with its request made now, its answer awaited later: how the
        attempts of several limiters go out together (on Redis, in one round trip) without a
        task each. This default runs ``try_acquire`` in a task."""
        task = asyncio.ensure_future(self.try_acquire(name, permits, max_wait_us))
        return InTask(self, name, task)

    def start_foresee(self, name: str, permits: int) -> Started | None:
        """A foresight, its request made now: what :meth:`try_acquire` of ``permits`` would
        answer once the attempts started before it (:meth:`start_acquire`) are decided, as a
        :class:`Refusal` whose ``retry_in`` is 0 when they would be free at once; nothing is
        taken. On Redis it goes in the same script call as the attempt before it, so a
        waiter next in line learns when it may be granted without a call of its own. None:
        this store foresees nothing (the default; the waiter then asks)."""
        return None

    @abc.abstractmethod
    async def wait_time(self, name: str, permits: int) -> int:
        """Microseconds until ``permits`` could be granted (0: now); takes nothing."""

    @abc.abstractmethod
    async def available_permits(self, name: str) -> int:
        """Permits a request could take now (for ``PER_CLIENT``: this client's), at least 0."""

    @abc.abstractmethod
    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        """Hands back ``permits`` from the newest grants that have started, or the grant
        ``member``: only what it still holds against the limit (nothing once it has left a
        sliding window, its tokens have come back, or its fixed window has ended); returns
        how many. Safe to send twice: a grant comes back once."""

    async def settle(self, name: str, member: str, permits: int, *, kept: int = 0) -> Settlement:
        """The grant ``member`` now counts as ``permits`` instead of what it reserved
        : fewer hands the difference back (only what still counts against
         the limit, by the algorithm's rule for ``release``); more charges the difference
         now, into debt if need be, at most the config's ``max_debt`` below zero per rate
         (the rest is ``cut``). Later grants wait, in order, until a debt is paid off;
         reservations already made keep their starts. Safe to send twice: a resend changes
         nothing. A member the store no longer knows hands back nothing (more still charges).
         What it hands back is told to this limiter's paced waiters in other processes
         (:meth:`watch_refunds`): all of it, or, when it covers ``kept`` (what a waiter of
         the settling process lacks, and takes first), only the rest."""
        raise NotImplementedError(f"{type(self).__name__} cannot settle a grant")

    async def sync(self, name: str, remaining: int, reset_us: int) -> None:
        """Takes a provider's own count as a floor: from now until now + ``reset_us``, at
        most ``remaining`` more permits are granted (for ``PER_CLIENT``: this client's).
        Never frees what the limiter itself counts (docs/token-budgets.md says how each
        algorithm holds it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot sync a limiter")

    async def settle_and_sync(
        self,
        name: str,
        member: str,
        permits: int,
        remaining: int,
        reset_us: int,
        *,
        kept: int = 0,
    ) -> Settlement:
        """:meth:`settle`, then :meth:`sync` (a metered call's usage, then the provider's
        count its response carried, which counts that call already): one call to the store
        where it can (Redis: one script). A resend settles nothing more and syncs again.
        This default makes the two calls."""
        settled = await self.settle(name, member, permits, kept=kept)
        await self.sync(name, remaining, reset_us)
        return settled

    async def learn(
        self,
        name: str,
        event: Event,
        value: int | None,
        per: int | None,
        ceiling: tuple[Rate, ...] | None,
        law: Law,
    ) -> Learned:
        """Learns the limiter's rate from a partner's answer (``backends._learning``: the
        law, and what ``value`` and ``per`` are for each ``event``), rewriting the config's
        rates (grants made stay counted) when the rate in force changes; ``ceiling`` None:
        the one stored (else the config's rates). One atomic step for the whole fleet."""
        raise BackendError(f"{type(self).__name__} cannot learn a rate", outage=False)

    async def margin(self, name: str, late_us: int | None) -> int:
        """The fleet's measured margin (``backends._margin``: the law): ``late_us`` None
        begins it where none is; else a process reports that its callers were ``late_us``
        late after their grants' start. Returns the margin in force (µs), by which every
        interval of the config is widened when a grant is decided; changing it keeps what
        was granted, as ``set_rate(..., keep_state=True)`` does. ``NotConfiguredError``
        without a config. This default, for a store that keeps no margin: 0."""
        return 0

    async def learned(self, name: str) -> tuple[Rate, ...] | None:
        """The ceiling of the limiter's learned state; None when it has none (this default:
        a store that cannot learn)."""
        return None

    @abc.abstractmethod
    async def block(self, name: str, duration_us: int | None) -> int:
        """No grant starts before now + ``duration_us`` (a later block never shortens an
        earlier one; ``None`` only reads). Returns the microseconds until the block ends (0:
        none). Cleared by ``delete`` and ``set_rate``."""

    async def unblock(self, name: str) -> bool:
        """Ends the limiter's block at once (grants may start now again); returns whether one
        was in force. Reservations the block already moved stay where they are."""
        raise BackendError(f"{type(self).__name__} cannot unblock a limiter", outage=False)

    async def block_left(self, name: str) -> int:
        """Microseconds until the limiter's block ends (0: none), one read: what ``inspect``
        and ``watch`` show."""
        return await self.block(name, None)

    async def blocked_until(self, name: str) -> int | None:
        """When the limiter's block ends, on the limiter's clock (as ``Grant.starts_at``);
        None without a block (or a config). One read that needs no clock: a caller that
        slept out a reservation asks it when it wakes, and if the block ends after its
        grant's start (a block set meanwhile, by any process), hands the grant back and asks
        again behind it. (This default, for stores that keep no end, answers a time after
        every grant while a block is in force.)"""
        return None if await self.block_left(name) == 0 else 2**63

    @abc.abstractmethod
    async def delete(self, name: str) -> bool:
        """Removes the config and every client's state; returns whether anything existed."""

    @abc.abstractmethod
    async def expire(self, name: str, ttl_us: int) -> bool:
        """The whole limiter disappears after ``ttl_us``; False when it has no config."""

    @abc.abstractmethod
    async def clear_expire(self, name: str) -> bool:
        """Removes a TTL :meth:`expire` set; returns whether there was one."""

    def watch_refunds(self, name: str, heard: Callable[[int], None]) -> Callable[[], None] | None:
        """From now on, ``heard(permits)`` is called when another client of the store (another
        process) hands back ``permits`` of ``name`` (a settle for less, a release), until the
        function returned is called. None: this store tells no one (the default; a waiter
        then sees a refund made elsewhere when it asks again). ``PER_CLIENT`` budgets are
        not told. A store may lose a message: a waiter still asks again by itself."""
        return None

    def hand_back(self, name: str, member: str) -> None:
        """Releases exactly the grant ``member`` in the background: the grant of a caller
        that was cancelled before it could use it. A failure is logged, never raised."""
        permits = parse_grant(member)[0]
        self.context.tasks.spawn(
            self.release(name, permits, member), "a hand-back", failed=hand_backs_failed
        )

    async def aclose(self) -> None:
        """Waits (at most 5 s) for the store's background tasks, its hand-backs among them
        (of this backend and of every ``with_client`` view of it), so that a process that
        shuts down leaves no cancelled caller's permits taken, and logs those that failed.
        The Redis client stays open: it belongs to whoever made it."""
        await super().aclose()
        _failed_hand_backs.report()


def breaker_of(backend: Store, name: str) -> Breaker:
    """The circuit breaker of limiter ``name`` on ``backend`` (made on first use), shared by
    every limiter object of that name on the backend and its ``with_client`` views: to read
    (``is_open``, ``failed_fast``). Each name has its own, so a failing node of a cluster (or
    shard) does not fail the others' calls; its back-offs are the backend's
    ``breaker_policy`` (its ``breaker`` option)."""
    if not isinstance(backend, Store):
        raise InvalidArgumentError(f"backend must be a Backend, not {type(backend).__name__}")
    return backend.context.breakers.get(name)


class _FailedHandBacks:
    """Hand-backs that failed (a cancelled caller's, a refused request's), counted and logged
    as one warning per ``REPORT_AFTER`` seconds, not a line (or a traceback) each: a store
    that went away fails them all, and one line says so."""

    REPORT_AFTER = 5.0

    __slots__ = ("_count", "_error", "_loop")

    def __init__(self) -> None:
        self._count = 0
        self._error: BaseException | None = None  # the first of those counted
        self._loop: asyncio.AbstractEventLoop | None = None  # where the report is due

    def add(self, error: BaseException, count: int) -> None:
        loop = asyncio.get_running_loop()
        if self._count and (self._loop is not loop or loop.is_closed()):
            self.report()  # due on a loop that has gone: say it now
        if not self._count:
            self._error = error
            self._loop = loop
            loop.call_later(self.REPORT_AFTER, self.report)
        self._count += count

    def report(self) -> None:
        if self._count:
            log.warning(
                "could not hand back %d grants (of cancelled callers or refused requests); "
                "each counts until it leaves its window: %s",
                self._count,
                self._error,
            )
        self._count = 0
        self._error = None
        self._loop = None


_failed_hand_backs = _FailedHandBacks()

_said_random_client = False


def _say_random_client(name: str, client_id: str) -> None:
    global _said_random_client
    _said_random_client = True
    log.warning(
        "PER_CLIENT limiter %r is used by a backend made without a client_id: it counts the "
        "budget of this backend's random id %s, one per process; name the client with "
        "limiter.for_client(client_id) or RedisBackend(..., client_id=...) (said once)",
        name,
        client_id,
    )


def hand_backs_failed(error: BaseException, count: int = 1) -> None:
    """Notes ``count`` hand-backs that failed with ``error`` (logged together, shortly)."""
    _failed_hand_backs.add(error, count)
