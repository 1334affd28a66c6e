"""How a waiter of this process learns that a release granted its ticket a lease: in the
release's reply when this process released (``hand_over``), else through its process's wake
channel on one pub/sub connection per client (``Subscriber``, tickets ending in ``:p``), or,
for a cluster client or a user the ACL does not let subscribe, its wake list and one BLPOP
per limiter (``Waker``, tickets ending in ``:h``).

A wake-up published while the process's channel was not subscribed (before its first wait,
while the connection is re-made) reached nobody: the release's script put it on the wake list
instead, which the subscriber reads whenever the server confirms a subscription. A waiter also
looks again on its own (``_concurrency._next_look``), which bounds the wait for a wake-up lost
otherwise (its ``take_lease`` collects the lease granted meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .._context import Background
from .._lease import LeaseGrant, Woken
from ._compat import ANY, NO_PERMISSION, buffered, text_of

__all__ = ["Subscriber", "Waiter", "Waker", "hand_over", "woken"]

log = logging.getLogger("aiolimit")

WAKE_BLOCK_S = 1
"""How long one BLPOP of a waker, or one read of a subscriber, blocks before the next."""
LINGER_S = 0.5
"""How long a subscriber with no waiters left stays subscribed, for the next waiter: a process
whose waiters come and go subscribes once, not once per waiter."""
DRAIN_BATCH, DRAIN_ROUNDS = 100, 10
"""Wake-ups read off a wake list at once, and at most how many times, when subscribed."""

_waiting: dict[str, Waiter] = {}  # this process's waiters, by ticket: a release hands to them


def hand_over(handed: list[tuple[str, LeaseGrant]]) -> None:
    """The leases a release granted to waiters of this process, handed to them. A waiter
    gone meanwhile has handed its grant back, or will (``cancel_ticket``)."""
    for ticket, grant in handed:
        waiter = _waiting.get(ticket)
        if waiter is not None:
            waiter.hand(grant)


class Waiter:
    """One waiter's wake-ups (the :class:`~aiolimit.backends.LeaseWaiter` of a Redis store),
    from its ``source``: a :class:`Subscriber`'s channel or a :class:`Waker`'s list."""

    __slots__ = ("_source", "_tasks", "_woken", "ticket")

    def __init__(self, source: Subscriber | Waker, ticket: str, tasks: Background) -> None:
        self._source, self.ticket, self._woken = source, ticket, Woken()
        self._tasks = tasks  # (its store's: aclose() waits for the ends it spawns)
        _waiting[ticket] = self

    @property
    def grant(self) -> LeaseGrant | None:
        """The lease handed over and not waited for yet."""
        return self._woken.grant

    async def wait(self, timeout: float) -> LeaseGrant | None:
        self._source.listen(self._tasks)
        return await self._woken.wait(timeout)

    def hand(self, grant: LeaseGrant | None) -> None:
        """Wakes the waiter, ``grant`` the lease its ticket was granted (None: it asks for
        it). From any thread: a release in another event loop of the process hands it too."""
        self._woken.hand_threadsafe(grant)

    async def aclose(self) -> None:
        if _waiting.get(self.ticket) is self:
            del _waiting[self.ticket]
        ending = self._source.remove(self)
        if ending is not None:
            # In the background: the client library lets go of a BLPOP cancelled while it
            # connects only when its block is up (a second), which a caller granted at once
            # must not wait for.
            self._tasks.spawn(ending, "a lease waker's end")


class _Channel:
    __slots__ = ("heard", "waiters", "watchers")

    def __init__(self) -> None:
        self.waiters: dict[str, Waiter] = {}  # (its waiters here)
        self.heard = False  # (it was subscribed: a new subscription is a reconnection)
        # (who is told each message, instead: a channel that is not a wake channel)
        self.watchers: dict[object, Callable[[Any], None]] = {}


class Subscriber:
    """This process's wake channels on one client (``T:wake:<process>``, one per limiter with
    waiters here): one pub/sub connection and one task reading it, while there are waiters
    (and ``LINGER_S`` longer, still subscribed: a waiter that comes meanwhile finds it so).
    What a release published while the channel was not subscribed (before the first wait,
    while the connection is re-made) went to its wake list instead: read once subscribed."""

    __slots__ = (
        "_idle_since",
        "_lock",
        "_pubsub",
        "_reader",
        "_redis",
        "_sent",
        "_watched",
        "channels",
        "refused",
    )

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self.channels: dict[str, _Channel] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._sent: set[str] = set()  # (the channels asked for on the connection)
        self._watched: set[str] = set()  # (the channels watched: not wake channels)
        self._lock = asyncio.Lock()
        self._idle_since: float | None = None  # (when the last waiter left, loop time)
        self.refused = False
        """The server refused a subscription (an ACL without the channels): no more."""

    def add(self, channel: str, ticket: str, tasks: Background) -> Waiter:
        found = self._channel(channel)
        waiter = found.waiters[ticket] = Waiter(self, ticket, tasks)
        return waiter

    def _channel(self, channel: str) -> _Channel:
        """``channel``'s entry, made if it has none (heard already when still subscribed:
        the reader lingering)."""
        found = self.channels.get(channel)
        if found is None:
            found = self.channels[channel] = _Channel()
            found.heard = channel in self._sent
        return found

    def watch(
        self, channel: str, heard: Callable[[Any], None], tasks: Background
    ) -> Callable[[], None]:
        """``heard(data)`` for each message on ``channel`` (subscribed from now on, on the
        same connection as the wake channels), until the function returned is called."""
        found = self._channel(channel)
        token = object()
        found.watchers[token] = heard
        self._watched.add(channel)
        self.listen(tasks)

        def stop() -> None:
            watched = self.channels.get(channel)
            if watched is None or watched.watchers.pop(token, None) is None:
                return
            if not watched.waiters and not watched.watchers:
                del self.channels[channel]
            ending = self._left()
            if ending is not None:
                tasks.spawn(ending, "a refund channel")

        return stop

    def listen(self, tasks: Background) -> None:
        """From a waiter's first wait on: its channel subscribed, the connection read (a
        caller granted at once subscribes to nothing)."""
        if self.refused:
            return
        if self._reader is None and self.channels:
            self._pubsub = self._redis.pubsub()
            self._reader = asyncio.create_task(self._read(self._pubsub))
        elif not self._sent.issuperset(self.channels):
            tasks.spawn(self._subscribe(self._pubsub), "a lease wake channel")

    def remove(self, waiter: Waiter) -> Awaitable[None] | None:
        """Forgets the waiter; what it leaves to be done (awaited in the background): the
        reader ended when it was the last waiter, its channel dropped when the last there."""
        for name, channel in list(self.channels.items()):
            if channel.waiters.get(waiter.ticket) is waiter:
                del channel.waiters[waiter.ticket]
                if not channel.waiters and not channel.watchers:
                    del self.channels[name]
        return self._left()

    def _left(self) -> Awaitable[None] | None:
        """What a waiter or watcher that left leaves to be done (see :meth:`remove`)."""
        if self._reader is None:
            return None
        if self.channels:
            return None if self._sent.issubset(self.channels) else self._subscribe(self._pubsub)
        # No one left to wake: the reader stays subscribed a while (LINGER_S), then ends and
        # the connection goes back (end()).
        self._idle_since = asyncio.get_running_loop().time()
        return None

    def end(self) -> Awaitable[None] | None:
        """A reader lingering with no waiter ended now (its client is closing); what is left
        to await."""
        reader = self._reader
        if reader is None or self.channels:
            return None
        reader.cancel()
        self._reader, self._pubsub, self._sent, self._watched = None, None, set(), set()
        return reader

    def _lingered(self) -> bool:
        """No waiter since LINGER_S ago (or no read yet that would tell)."""
        if self.channels:
            self._idle_since = None
            return False
        idle = self._idle_since
        return idle is None or asyncio.get_running_loop().time() - idle >= LINGER_S

    async def _subscribe(self, pubsub: Any) -> None:
        """The channels with waiters subscribed on ``pubsub``, and no others."""
        async with self._lock:
            if pubsub is not self._pubsub:
                return  # (a reader that has ended)
            wanted = set(self.channels)
            if not wanted:
                return  # (lingering: still subscribed, for the next waiter)
            if added := wanted - self._sent:
                await pubsub.subscribe(*added)
            if dropped := self._sent - wanted:
                await pubsub.unsubscribe(*dropped)
            self._sent = wanted

    async def _read(self, pubsub: Any) -> None:
        try:
            while not self.refused and not self._lingered():
                try:
                    await self._subscribe(pubsub)
                    block = WAKE_BLOCK_S if self.channels else LINGER_S
                    message = await pubsub.get_message(timeout=block)
                    if message is not None:
                        await self._deliver(message)
                        # Once what came in one read is delivered, the waiters it woke run
                        # (all on one turn) before the next read is set up (a few dozen µs
                        # of Python): their slots are idle until they do.
                        if not await buffered(pubsub.connection):
                            await asyncio.sleep(0)
                except ANY as exc:  # the waiters' own looks still wake them
                    self._cut_off(exc)
                    await asyncio.sleep(0.1)
        finally:
            if self._pubsub is pubsub:  # (it ended by itself: refused)
                self._reader, self._pubsub, self._sent = None, None, set()
                self._watched = set()
            await pubsub.aclose()

    async def _deliver(self, message: dict[str, Any]) -> None:
        kind, name = message["type"], message["channel"]
        text = name.decode() if isinstance(name, bytes) else name
        channel = self.channels.get(text)
        if kind == "message":
            if text not in self._watched:
                _wake(message["data"])
            elif channel is not None:  # (else still subscribed, no one watching now)
                for heard in list(channel.watchers.values()):
                    heard(message["data"])
            return
        if channel is None:
            return
        if kind == "unsubscribe":
            channel.heard = False
        elif kind == "subscribe":
            # What was published while the channel was not subscribed reached nobody, and
            # waits on the list. Subscribed again (the client library re-made the
            # connection): a message sent just before the connection failed may be lost
            # too, so every waiter asks (``take_lease`` collects a lease granted meanwhile).
            if channel.heard:
                for waiter in channel.waiters.values():
                    waiter.hand(None)
            channel.heard = True
            if not channel.watchers:  # (a refund channel keeps no list: nothing to read)
                await self._drain(name)

    async def _drain(self, channel: Any) -> None:
        """The wake-ups published to ``channel`` while nobody heard, off its list."""
        redis = self._redis
        for _ in range(DRAIN_ROUNDS):
            popped = await redis.lpop(channel, DRAIN_BATCH) or []
            for wake_up in popped:
                _wake(wake_up)
            if len(popped) < DRAIN_BATCH:
                return

    def _cut_off(self, exc: BaseException) -> None:
        """The connection failed (the client library subscribes again when it re-makes it);
        a refusal (NOPERM) ends the subscriber, and its waiters ask now."""
        log.debug("lease wake channels: %s", exc)
        self._sent = set()
        self.refused = isinstance(exc, NO_PERMISSION)
        for channel in self.channels.values():
            channel.heard = not self.refused  # (each waiter asks once subscribed again)
            if self.refused:
                for waiter in channel.waiters.values():
                    waiter.hand(None)


def woken(message: Any) -> tuple[str, LeaseGrant | None]:
    """A wake-up heard on a process's wake channel or popped off its wake list: the ticket,
    and the lease granted to it (``"<ticket> <lease id> <lease us>"``), or None (an older
    client's script names the ticket only)."""
    text = text_of(message)
    ticket, _, lease = text.partition(" ")
    if not lease:
        return ticket, None
    lease_id, _, lease_us = lease.partition(" ")
    return ticket, LeaseGrant(lease_id, int(lease_us))


def _wake(wake_up: Any) -> None:
    """The waiter of this process a wake-up names, handed its lease (whichever client of
    the process heard it: a process's waiters share its channels)."""
    ticket, grant = woken(wake_up)
    waiter = _waiting.get(ticket)
    if waiter is not None:
        waiter.hand(grant)


class Waker:
    """The wake list of one limiter for this process (``T:wake:<process>``): one task, one
    connection blocked in BLPOP, while the process has waiters on the limiter; each ticket
    popped wakes its waiter."""

    __slots__ = ("_key", "_redis", "_task", "waiters")

    def __init__(self, redis: Any, key: str) -> None:
        self._redis, self._key = redis, key
        self.waiters: dict[str, Waiter] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, ticket: str, tasks: Background) -> Waiter:
        waiter = self.waiters[ticket] = Waiter(self, ticket, tasks)
        return waiter

    def listen(self, tasks: Background) -> None:
        """Its BLPOP runs from the first wait on (a caller granted at once sends none: a
        wake-up pushed before waits in the list)."""
        if self._task is None and self.waiters:
            self._task = asyncio.create_task(self._run())

    def remove(self, waiter: Waiter) -> asyncio.Task[None] | None:
        """Forgets the waiter; the task it ends when it was the last (to be awaited)."""
        if self.waiters.get(waiter.ticket) is waiter:
            del self.waiters[waiter.ticket]
        task = self._task
        if self.waiters or task is None:
            return None
        # No one left to wake: the BLPOP ends now, its connection with it (a wake-up pushed
        # meanwhile waits in the list for the next waiter's BLPOP, which skips it).
        task.cancel()
        self._task = None
        return task

    async def _run(self) -> None:
        redis = self._redis
        try:
            while self.waiters:
                try:
                    popped = await redis.blpop([self._key], timeout=WAKE_BLOCK_S)
                except ANY as exc:  # the waiters' own timers still wake them
                    log.debug("waker of %s: %s", self._key, exc)
                    await asyncio.sleep(0.1)
                    continue
                if popped:
                    _wake(popped[1])
        finally:
            if self._task is asyncio.current_task():
                self._task = None
