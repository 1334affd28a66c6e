"""Rate permits and concurrency slots in one acquisition, all or nothing.

>>> acquired = await acquire_all([(rpm, 1), (tpm, estimate), (sem, 1)], timeout=30)
>>> async with acquired:          # RateLimited when refused; the slot held, renewed
...     await call_model()        # leaving frees the slot; the rate permits stay spent

The slots are taken first, waiting in the concurrency limiters' FIFO order, then the rate
permits with what is left of the timeout: a rate permit is spent only when the call can go
at once, so the partner sees requests at the rate the permits were given. When the rate
limiters refuse, the slots are released; when a slot cannot be had, nothing was taken.
A slot is renewed from the moment it is taken, while the others and the rate permits are
waited for, so that it is still held when it is handed over; one lost meanwhile (the store
forgot it, or did not answer for a whole lease) raises :class:`~aiolimit.LeaseLostError`
after everything taken went back. (Taking the slots last instead would spend rate permits
on calls that then wait for a slot, and reach the partner in a burst when slots free.)
Several concurrency limiters are taken in one order (their store and name), so that two
callers never each hold the slot the other waits for.

The engine (``_acquire``) hands a request with slots here; a concurrency limiter is known
only as :class:`~aiolimit._request.Leasing`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from ._acquired import Acquired, Outcome
from ._attempts import grants_of, release_grants
from ._lease import Lease
from ._request import Request, left_of, now_us, seconds
from ._settling import Limited
from .backends.base import Attempt, Refusal, hand_backs_failed
from .errors import RateLimited

__all__ = ["InFlight", "in_flight"]


class InFlight(Acquired):
    """An :class:`~aiolimit.Acquired` that also holds concurrency slots (``leases``).

    ``async with acquired:`` renews the leases while the body runs and releases them after
    (the rate permits stay spent: the call was made); a lost lease cancels the body and
    raises :class:`~aiolimit.LeaseLostError`. Entering a refused acquisition raises
    :class:`~aiolimit.RateLimited`. :meth:`release` before the call hands everything back:
    the rate grants, each by its member, and the slots.
    """

    __slots__ = ("_exits", "leases", "refused_by")

    def __init__(
        self,
        limiters: tuple[Limited, ...],
        permits: tuple[int, ...],
        attempts: tuple[Attempt, ...],
        waited: float,
        owners: tuple[Limited, ...],
        leases: tuple[Lease, ...],
        refused_by: str | None,
    ) -> None:
        super().__init__(limiters, permits, attempts, waited, owners)
        self.leases = leases
        """The slots held (none when refused)."""
        self.refused_by = refused_by
        """The concurrency limiter that had no slot within the timeout (None: it had)."""
        self._exits: contextlib.AsyncExitStack | None = None

    @property
    def granted(self) -> bool:
        return self.refused_by is None and super().granted

    @property
    def retry_after(self) -> float:
        """As :attr:`Acquired.retry_after`; 0.0 when a concurrency limiter refused (a slot
        is freed when a holder is done, which no one can foretell)."""
        return 0.0 if self.refused_by is not None else super().retry_after

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, leases={len(self.leases)})"

    async def release(self) -> None:
        """Hands back the rate grants and the slots (a call that is not made after all); a
        failure is logged, never raised."""
        outcomes = await asyncio.shield(
            asyncio.gather(
                super().release(),
                *(lease.release() for lease in self.leases),
                return_exceptions=True,
            )
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            hand_backs_failed(failures[0], len(failures))

    def refusal(self) -> RateLimited:
        """The error that says why this acquisition was refused."""
        name = self.refused_by
        if name is None:
            refusing = (
                limiter.name
                for limiter, attempt in zip(self.limiters, self.attempts, strict=True)
                if isinstance(attempt, Refusal)
            )
            name = next(refusing, "")
        return RateLimited(name, self.retry_after)

    def detach(self) -> None:
        """The slots outlive the task's frame that entered them (an HTTP response whose body
        is read later): still renewed until :meth:`__aexit__`, but a loss no longer cancels
        the task (``Lease.detach``)."""
        for lease in self.leases:
            lease.detach()

    def check(self) -> None:
        """:class:`~aiolimit.LeaseLostError` when a lease was found lost."""
        for lease in self.leases:
            lease.check()

    async def __aenter__(self) -> InFlight:
        if not self.granted:
            raise self.refusal()
        if self._exits is not None:
            raise RuntimeError("an acquisition is entered once")
        exits = contextlib.AsyncExitStack()
        for lease in self.leases:
            await exits.enter_async_context(lease)
        self._exits = exits
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        exits = self._exits
        if exits is not None:
            await exits.__aexit__(exc_type, exc, tb)


async def in_flight(request: Request, rates: Callable[[], Awaitable[Outcome]]) -> InFlight:
    """The slots of ``request`` (in its order), then ``rates()`` for its rate permits (none:
    not called), each step with what is left of the request's deadline, all or nothing; see
    the module. Each slot is renewed from the moment it is taken until it is handed over;
    one lost meanwhile raises :class:`~aiolimit.LeaseLostError`, after everything taken went
    back."""
    began = now_us()
    leases: list[Lease] = []
    refused_by: str | None = None
    outcome: Outcome | None = None
    try:
        async with contextlib.AsyncExitStack() as renewed:
            for limiter, permits in request.slots:
                left = left_of(request.deadline)
                timeout = None if left is None else seconds(left)
                lease = await limiter.try_lease(permits, timeout=timeout)
                if lease is None:
                    refused_by = limiter.name
                    break
                leases.append(lease)
                await renewed.enter_async_context(lease.renewing())
            else:
                leased_in = now_us() - began
                outcome = await rates() if request.limiters else Outcome((), (), 0)
    except BaseException:  # (a lease lost meanwhile: LeaseLostError)
        await _let_go(leases)
        if outcome is not None and outcome.granted:
            await release_grants(grants_of(outcome.limiters, outcome.attempts))
        raise
    if outcome is None:  # no slot within the deadline: nothing asked
        await _let_go(leases)
        return InFlight((), (), (), 0.0, (), (), refused_by)
    owners = request.owners or request.limiters
    if not outcome.granted:
        await _let_go(leases)
        waited = seconds(outcome.waited)
        return InFlight(
            outcome.limiters, request.permits, outcome.attempts, waited, owners, (), None
        )
    waited = seconds(leased_in + outcome.waited)
    held = tuple(leases)
    return InFlight(outcome.limiters, request.permits, outcome.attempts, waited, owners, held, None)


async def _let_go(leases: Sequence[Lease]) -> None:
    """Releases leases not used after all, whatever happens to the caller meanwhile."""
    if leases:
        outcomes = await asyncio.shield(
            asyncio.gather(*(lease.release() for lease in leases), return_exceptions=True)
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            hand_backs_failed(failures[0], len(failures))
