"""A lease of a concurrency limiter's slots, as its holder keeps it: renewed in the
background while ``async with`` runs, and lost loudly (:class:`~aiolimit.LeaseLostError`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from . import _observe
from ._values import seconds
from .backends._lease import LeaseGrant
from .errors import BackendError, LeaseLostError

if TYPE_CHECKING:
    from .backends import LeaseStore


class Holds(Protocol):
    """What a lease needs of its limiter: its name on its backend."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> LeaseStore: ...


__all__ = ["Lease"]

RETRY_S = 0.05
"""How soon a renewal that failed (the store did not answer) is tried again, until the
lease would have ended."""


class Lease:
    """Slots of a :class:`~aiolimit.ConcurrencyLimiter`, held until released or lost.

    >>> lease = await sem.try_lease(timeout=10)      # the manual form: any task may
    >>> await lease.renew()                          # renew it (LeaseLostError if lost)
    >>> await partner.write(data, fence=lease.fence)
    >>> await lease.release()

    ``async with lease:`` renews it every third of the lease time while the body runs and
    releases it after; when it is lost, the body is cancelled and ``async with`` raises
    :class:`~aiolimit.LeaseLostError`. ``fence`` only grows over the limiter's life (across
    restarts and flushes of the store): a partner that remembers the highest fence it saw can
    refuse a late write from a holder whose lease was lost.
    """

    __slots__ = (
        "_cancelled",
        "_deadline",
        "_holder",
        "_keeper",
        "_lease_s",
        "_limiter",
        "_lost",
        "_released",
        "fence",
        "id",
        "permits",
    )

    def __init__(self, limiter: Holds, grant: LeaseGrant, sent_at: float) -> None:
        self._limiter = limiter
        self.id: str = grant.lease_id
        """Names the lease for the limiter's life (release and renew by it)."""
        self.permits: int = grant.permits
        self.fence: int = grant.fence
        self._lease_s = seconds(grant.lease_us)
        # When the lease ends at the latest, on the event loop's clock: the store started it
        # after the request that led to it left (the attempt that granted it, or the one
        # that queued the ticket it was handed over to), so this is never later than the
        # store's own expiry.
        self._deadline = sent_at + self._lease_s
        self._lost = False
        self._released = False
        self._keeper: asyncio.Task[None] | None = None
        self._holder: asyncio.Task[object] | None = None  # cancelled when the lease is lost
        self._cancelled: asyncio.Task[object] | None = None  # the holder, cancelled when lost

    def __repr__(self) -> str:
        return f"<Lease {self._limiter.name!r} {self.id} fence={self.fence}>"

    @property
    def lost(self) -> bool:
        """Whether the lease was found lost (by :meth:`renew` or the background renewal)."""
        return self._lost

    @property
    def expires_in(self) -> float:
        """Seconds until the lease ends unless renewed (at the latest, by this clock)."""
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def check(self) -> None:
        """:class:`~aiolimit.LeaseLostError` when the lease was found lost."""
        if self._lost:
            raise LeaseLostError(self._limiter.name, self.id)

    async def renew(self) -> None:
        """The lease runs one more lease time from now; :class:`~aiolimit.LeaseLostError`
        when it has ended (a lost lease is never taken again)."""
        if self._lost or self._released:
            raise LeaseLostError(self._limiter.name, self.id)
        sent = asyncio.get_running_loop().time()
        lease_us = await self._limiter.backend.renew_lease(self._limiter.name, self.id)
        if lease_us is None:
            self._lose()
            raise LeaseLostError(self._limiter.name, self.id)
        self._deadline = sent + seconds(lease_us)

    async def release(self) -> bool:
        """Hands the slots back: True when the lease was held until now, False when it had
        ended or was released already. Safe to call twice; frees no one else's slots."""
        self._stop()
        if self._released:
            return False
        self._released = True
        return await self._limiter.backend.release_lease(self._limiter.name, self.id)

    def _lose(self) -> None:
        if not self._lost:
            self._lost = True
            if (observer := _observe.current) is not None:
                observer.lease_lost(self._limiter.name, self.permits)

    # -- held by a task: renewed in the background ------------------------------------------

    async def __aenter__(self) -> Lease:
        if self._keeper is not None or self._released:
            raise RuntimeError("a lease is entered once")
        self._keep_for_this_task()
        return self

    @contextlib.asynccontextmanager
    async def renewing(self) -> AsyncIterator[Lease]:
        """Renewed while the block runs, as ``async with lease:`` renews it, and still held
        after it: for a lease taken before its call can start.

        >>> lease = await sem.try_lease(timeout=10)
        >>> async with lease.renewing():     # held while the call waits for something else
        ...     await partner_rate.acquire()
        >>> async with lease:                # then for the call, released after
        ...     await call_partner(fence=lease.fence)

        A loss cancels the block and raises :class:`~aiolimit.LeaseLostError`, and so does a
        lease that ended meanwhile unseen (the store did not answer): a lease comes out of
        the block held, or not at all. ``acquire_all`` holds its slots so while it waits."""
        if self._keeper is not None or self._released:
            raise RuntimeError("a lease is renewed by one holder at a time")
        self._keep_for_this_task()
        try:
            yield self
        except BaseException as exc:
            await self._stop_keeping(type(exc), exc)
            raise
        await self._stop_keeping(None, None)
        if self._deadline <= asyncio.get_running_loop().time():
            self._lose()
        self.check()

    def _keep_for_this_task(self) -> None:
        self._holder = asyncio.current_task()
        assert self._holder is not None
        self._keeper = asyncio.create_task(self._keep())

    async def _stop_keeping(
        self, exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> None:
        """The end of :meth:`renewing`: the keeper stopped, the lease left as it is (held,
        or lost: raised); a later ``async with`` keeps it again."""
        self._stop()
        holder, self._cancelled = self._cancelled, None
        self._keeper = self._holder = None
        if holder is not None:
            await self._cancelled_by_loss(holder, exc_type, exc)

    def detach(self) -> None:
        """The holder goes on without the lease's guard: the lease is still renewed until it
        is released, but a loss no longer cancels the holder (it is found at ``__aexit__``,
        which raises :class:`~aiolimit.LeaseLostError`, or in :attr:`lost`). For a lease held
        past the task's own frame: an HTTP response whose body is read later.

        >>> await lease.__aenter__()           # held for this task: a loss cancels it
        >>> response = await send(request)
        >>> lease.detach()                     # renewed until __aexit__, when the body closes"""
        self._holder = None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        holder = self._cancelled
        if holder is None:
            await asyncio.shield(self.release())  # (a holder cancelled meanwhile still hands back)
            if self._lost:
                raise LeaseLostError(self._limiter.name, self.id) from exc
            return
        await self._cancelled_by_loss(holder, exc_type, exc)

    async def _cancelled_by_loss(
        self,
        holder: asyncio.Task[object],
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
    ) -> None:
        """The holder was cancelled because the lease was lost: LeaseLostError instead,
        unless someone else cancelled it too (then the cancellation stands)."""
        if exc_type is not asyncio.CancelledError:
            # The body ended before the cancellation reached it: take it now.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)
        uncancel = getattr(holder, "uncancel", None)  # (Python 3.11+)
        if uncancel is not None and uncancel() > 0:  # cancelled by someone else too: stands
            return
        raise LeaseLostError(self._limiter.name, self.id) from exc

    def _stop(self) -> None:
        if self._keeper is not None and self._keeper is not asyncio.current_task():
            self._keeper.cancel()

    async def _keep(self) -> None:
        """Renews every third of the lease time; a lease found lost, or ended while the store
        did not answer, cancels the holder (unless detached)."""
        loop = asyncio.get_running_loop()
        every = self._lease_s / 3
        next_at = self._deadline - 2 * every  # a third of the lease gone since it was renewed
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            left = self._deadline - loop.time()
            try:
                if left <= 0:
                    raise LeaseLostError(self._limiter.name, self.id)
                await asyncio.wait_for(self.renew(), left)
                next_at = loop.time() + every
            except (BackendError, asyncio.TimeoutError):
                next_at = loop.time() + min(RETRY_S, every)
            except LeaseLostError:
                self._lose()
                holder = self._holder
                if holder is not None:
                    self._cancelled = holder
                    holder.cancel(f"lease {self.id} of {self._limiter.name!r} lost")
                return
