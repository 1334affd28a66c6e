"""Shared round trips: concurrent calls on one Redis client go together in one pipeline.

The coalescer knows no script by name: it sends :class:`Operation` requests (``_request``),
several of one operation as one call where the operation has a :class:`Batch`, and the calls
of a round trip through the client's :class:`~._wire.Wire`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ... import _observe
from ._compat import AUTH, LOST, UNREACHABLE, is_cluster, slot
from ._deadlines import Deadlines
from ._request import Batch, Call, Key, Operation, Request
from ._wire import Wire

__all__ = ["Batch", "Coalescer", "Key", "Operation", "Request", "coalescer"]

log = logging.getLogger("aiolimit")

# Pauses before sending a round trip again after a lost connection: at once (a killed
# connection), then long enough to ride out a server restart of a few hundred ms.
_RECONNECT_PAUSES = (0.0, 0.02, 0.1, 0.3)
# How long after a round trip's first lost connection it may still be sent again. redis-py
# retries a lost connection itself (10 times over about 4 s with Redis() defaults), so
# resending without a bound multiplies its time to give up; with it, a down server is
# reported about as soon as the client itself reports it.
_RESEND_FOR = 1.0
_IN_FLIGHT = 2  # round trips one Redis client may have in flight at once
_SECOND = 16  # requests waiting that justify a second round trip in flight
_ROUND_TRIP_MOST = 32  # requests one round trip takes while more wait (see _take)


class Coalescer:
    """Shares round trips between concurrent calls on one Redis client.

    When nothing is in flight a call goes out at once. While a round trip is in flight,
    further calls queue, and all of them go together in the next one, in one pipeline:
    requests for an operation with a :class:`Batch` as calls of its carrier, up to its
    ``most`` requests each (per cluster slot), anything else as a call of its own. Each
    caller still gets its own result or error, and with a ``timeout`` stops waiting for it
    after that many seconds.
    """

    __slots__ = (
        "__weakref__",
        "_cluster",
        "_deadlines",
        "_down",
        "_flying",
        "_pumps",
        "_queue",
        "_redis",
        "_wire",
    )

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._cluster = is_cluster(redis)
        self._wire = Wire(redis, self._cluster)
        self._queue: list[Request] = []
        self._pumps: set[asyncio.Task[None]] = set()
        # The limiters of each round trip in flight (see _take).
        self._flying: list[set[Key | None]] = []
        # The callers waiting with a deadline, by their backend's timeout (see _deadlines).
        self._deadlines: weakref.WeakValueDictionary[float, Deadlines] = (
            weakref.WeakValueDictionary()
        )
        # While Redis is unreachable: when that was first seen, and the requests failed since
        # (an outage is logged once when it starts and once when it ends).
        self._down: tuple[float, int] | None = None

    def submit(
        self,
        operation: Operation,
        keys: Sequence[Key],
        args: Sequence[Any],
        orphan: Callable[[Any], None] | None = None,
        deadlines: Deadlines | None = None,
    ) -> asyncio.Future[Any]:
        """Makes the request of ``operation`` on ``keys`` and ``args`` now; returns the future
        of its raw reply. ``orphan`` gets the reply instead when the caller was cancelled (or
        gave up: cancelling the future is cancelling the caller) before it came;
        ``deadlines``: the caller's timeout (:meth:`deadlines`), None for none."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(Request(operation, keys, args, future, orphan))
        # Round trips run in tasks of their own, so a cancelled caller never cuts a reply in
        # half (nor waits on redis-py's cancelled write): its reply goes to `orphan`, which
        # hands back a grant. A second round trip may start while one is in flight once
        # enough requests wait, so this process prepares the next batch while Redis runs the
        # last one.
        if not self._pumps or (
            len(self._pumps) < _IN_FLIGHT and len(self._queue) >= _SECOND and self._flying
        ):
            self._pumps.add(loop.create_task(self._send_queued()))
        if deadlines is not None:
            deadlines.add(future, operation, loop)
        return future

    def deadlines(self, timeout: float | None) -> Deadlines | None:
        """The callers of ``timeout`` seconds on this client (None: no timeout), for
        :meth:`submit`: a backend asks once, not per call."""
        if timeout is None:
            return None
        deadlines = self._deadlines.get(timeout)
        if deadlines is None:
            deadlines = self._deadlines[timeout] = Deadlines(timeout)
        return deadlines

    async def _send_queued(self) -> None:
        try:
            while True:
                while self._queue:
                    batch, flying, more = self._take()
                    if not batch:
                        return  # each waits for a limiter in the other round trip: it sends them
                    if more and len(self._pumps) < _IN_FLIGHT:
                        self._pumps.add(asyncio.get_running_loop().create_task(self._send_queued()))
                    self._flying.append(flying)
                    try:
                        await self._send(self._calls(batch))
                    finally:
                        self._flying = [other for other in self._flying if other is not flying]
                # The callers just answered often call again at once: one turn of the loop
                # lets them, and their round trip goes from here, on this round trip's
                # connection, not from a new task on one taken from the pool again.
                await asyncio.sleep(0)
                if not self._queue:
                    return
        except BaseException as exc:
            for request in self._queue:
                request.settle(exc)
            self._queue = []
            raise
        finally:
            # Leave at once (not in a done callback), so a call arriving next starts a pump.
            self._pumps.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]
            if not self._pumps:  # the last round trip of a burst: its connections go back
                await self._wire.rest()

    def _take(self) -> tuple[list[Request], set[Key | None], bool]:
        """The requests of the next round trip, their limiters, and whether others wait that
        a second round trip could carry at once.

        Two round trips in flight (at most _ROUND_TRIP_MOST requests each while more wait):
        Redis runs one while this process reads the other's replies and prepares the next, so
        neither waits for the other (with 64 tasks over 10 000 limiters, about twice the
        calls/s of one round trip of 64). The two may reach Redis in either order, so a
        limiter's requests never go in both: a request for a limiter of the other round trip
        waits for it, and a limiter's requests go out in the order they were made."""
        # A request's limiter, what its order matters within, is its first key (a limiter's
        # config hash, or the one key of a plain command), None for a request without keys,
        # which goes alone: `request.keys[0] if request.keys else None`, written out below.
        queue = self._queue
        busy: set[Key | None] = set().union(*self._flying) if self._flying else set()
        if not busy and len(queue) <= _ROUND_TRIP_MOST:
            self._queue = []
            return queue, {r.keys[0] if r.keys else None for r in queue}, False
        batch: list[Request] = []
        taken: set[Key | None] = set()
        rest: list[Request] = []
        for request in queue:
            limiter = request.keys[0] if request.keys else None
            if limiter in busy or (limiter is None and busy) or None in taken:
                rest.append(request)
            elif len(batch) >= _ROUND_TRIP_MOST and limiter not in taken:
                rest.append(request)
                busy.add(limiter)  # its later requests wait too, to keep their order
            else:
                batch.append(request)
                taken.add(limiter)
        self._queue = rest
        return batch, taken, bool(rest)

    def _calls(self, requests: list[Request]) -> list[Call]:
        calls: list[Call] = []
        groups: dict[tuple[Batch, int | None], list[Request]] = {}
        for request in requests:
            batch = request.operation.batch
            if batch is None:
                calls.append(Call([request]))
            else:
                where = slot(request.keys[0]) if self._cluster else None
                groups.setdefault((batch, where), []).append(request)
        for (batch, _), group in groups.items():
            # A few calls of at most `most` requests each: one script blocks the whole server
            # while it runs, so Redis serves other clients in between.
            for i in range(0, len(group), batch.most):
                part = group[i : i + batch.most]
                calls.append(Call(part, batch) if len(part) > 1 else Call(part))
        return calls

    async def _send(self, calls: list[Call]) -> None:
        """Sends ``calls`` in one round trip and settles each, sending again while the
        connection is lost (within bounds) the calls that are safe to resend."""
        loop = asyncio.get_running_loop()
        first_failure: float | None = None
        for pause in (*_RECONNECT_PAUSES, None):
            sent = loop.time()
            observer = _observe.current
            if observer is not None:
                observer.round_trip(sum(len(call.requests) for call in calls))
            try:
                replies = await self._round_trip(calls)
            except AUTH as exc:  # (a ConnectionError to redis-py: neither lost nor down)
                error: BaseException = exc
            except LOST as exc:
                now = loop.time()
                first_failure = now if first_failure is None else first_failure
                # Sent again only if, taking as long as this attempt took (redis-py's own
                # retries included), it ends within _RESEND_FOR of the first failure.
                resend = now + (pause or 0.0) + (now - sent) <= first_failure + _RESEND_FOR
                if pause is not None and resend:
                    # A killed or reset connection, or a server restarting: the pool hands
                    # out a fresh connection. A call that is not safe to send twice (the lost
                    # reply may have been its only one) gets the error instead.
                    for call in calls:
                        if not call.operation.resend:
                            call.settle(exc)
                    calls = [call for call in calls if call.operation.resend]
                    if not calls:
                        return
                    log.debug(
                        "connection to Redis lost (%s): sending %d calls again", exc, len(calls)
                    )
                    await asyncio.sleep(pause)
                    continue
                error = exc
            except BaseException as exc:
                error = exc
            else:
                if self._down is not None:
                    self._recovered(loop.time())
                for call, reply in zip(calls, replies, strict=True):
                    call.settle(reply)
                return
            # The whole round trip failed: every caller in it gets the error.
            if isinstance(error, UNREACHABLE) and not isinstance(error, AUTH):
                self._unreachable(error, sum(len(call.requests) for call in calls), loop.time())
            for call in calls:
                call.settle(error)
            if not isinstance(error, Exception):
                raise error
            return

    def _unreachable(self, error: BaseException, requests: int, now: float) -> None:
        """Logs the first failure of an outage (later ones only count)."""
        if self._down is None:
            self._down = (now, requests)
            log.warning(
                "Redis at %s is unreachable (%s); calls raise BackendError until it answers again",
                _where(self._redis),
                error,
            )
        else:
            self._down = (self._down[0], self._down[1] + requests)

    def _recovered(self, now: float) -> None:
        assert self._down is not None
        (since, failed), self._down = self._down, None
        log.warning(
            "Redis at %s answers again after %.1f s unreachable (%d requests failed)",
            _where(self._redis),
            now - since,
            failed,
        )

    async def _round_trip(self, calls: list[Call]) -> list[Any]:
        return await self._wire.round_trip(calls)


def _where(redis: Any) -> str:
    """Where a client connects, to name it in a log line: host:port, or the client."""
    kwargs = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", None)
    if isinstance(kwargs, dict) and "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    if isinstance(kwargs, dict) and "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return type(redis).__name__


# One coalescer per Redis client object, shared by every backend on that client.
_coalescers: weakref.WeakKeyDictionary[Any, Coalescer] = weakref.WeakKeyDictionary()


def coalescer(redis: Any) -> Coalescer:
    """The coalescer of the Redis client ``redis``."""
    pipe = _coalescers.get(redis)
    if pipe is None:
        pipe = _coalescers[redis] = Coalescer(redis)
    return pipe
