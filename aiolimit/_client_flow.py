"""One outgoing call's steps, written once for both HTTP clients as values (httpx's
``Auth.auth_flow`` is the model): the flow takes the permits and settles them, yields what
the client is to do with its library's objects, and is told what came back.

>>> calls = ClientCalls(limiter, permits=1, timeout=None, retry=True, ...)   # per client
>>> response = await drive(calls.flow(request, unsent, resendable), exchange)

``exchange`` (an :class:`Exchange`) is the library's part of one call: it sends the request,
holds the response, closes it. :func:`drive` meets the flow's steps in this order:

- :class:`Send`: send the request now (its permits taken; its slot, if any, held: a lost
  slot cancels the send). The flow is told the :data:`Answer` (status, headers), or the
  error is thrown into it: a request that never left hands back what it took. Mid-send, a
  library that reports its connections tells it ``CONNECTING`` (a new connection: the
  permits go back, its set-up is not the call's) and ``CONNECTED`` (taken again as the
  request is written), each answered ``PROCEED``; or, told ``CONNECTED`` on permits later
  than the fleet's measured margin covers, ``AGAIN``: they went back, the library's send is
  to stop unsent (:class:`AskAgain`), and the flow asks again, then sends anew.
- ``DISCARD``: a ``429``/``503`` with ``Retry-After`` paused every caller and the request
  goes once more: the answer is closed unread; its tokens go back, and a permit of its own
  is taken after the pause (then ``Send`` again).
- :class:`Settle` (with ``tokens=``): the call's tokens settle by its body, read now
  (:meth:`Settle.read`) or as the caller reads it (:meth:`Settle.tap`, :meth:`Settle.events`:
  a :class:`~aiolimit._body_tap.BodyTap` that the library's stream wrapper feeds).

Whatever fails, or a caller cancelled meanwhile, the response the client holds is closed
(``Exchange.close``): its connection goes back, and with it its slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypeAlias, TypeVar

from ._acquired import Acquired
from ._body_tap import BodyTap, KeptBody
from ._calls import DEFAULT_MAX_PAUSE, STALE_RETRIES, CallGuard
from ._concurrency import ConcurrencyLimiter
from ._inflight import InFlight
from ._learn import Learner
from ._limiter import RateLimiter
from ._meter import TokenMeter, Used, meter_of
from ._sharded import ShardedRateLimiter
from ._types import Duration
from .backends._context import Background

__all__ = [
    "AGAIN",
    "CONNECTED",
    "CONNECTING",
    "DEFAULT_MAX_PAUSE",
    "DISCARD",
    "PROCEED",
    "SEND",
    "Answer",
    "AskAgain",
    "ClientCalls",
    "Exchange",
    "Flow",
    "Held",
    "Send",
    "Settle",
    "Tell",
    "drive",
]

R = TypeVar("R", covariant=True)


Answer: TypeAlias = "tuple[int, Mapping[str, str]]"
"""What came back for a request: its status and its headers (case-insensitive)."""


class Held:
    """A call's concurrency slot, held from the answer until its body is closed (by the
    library's stream wrapper, or its callback)."""

    __slots__ = ("_acquired", "_tasks")

    def __init__(self, acquired: InFlight, tasks: Background) -> None:
        self._acquired, self._tasks = acquired, tasks

    def check(self) -> None:
        """:class:`~aiolimit.LeaseLostError` when the slot was lost (while the body is read)."""
        self._acquired.check()

    async def release(self) -> None:
        """The body is closed: the slot goes back (LeaseLostError if it was lost)."""
        await self._acquired.__aexit__(None, None, None)

    def release_soon(self) -> None:
        """:meth:`release` from a plain callback, in the store's background (its
        ``aclose()`` waits for it)."""
        self._tasks.spawn(self.release(), "a response's concurrency slot")


class Send(NamedTuple):
    """Send the request now; ``held``: the slot to hold until the answer's body is closed."""

    held: Held | None


SEND = Send(None)
"""Send the request now (no slot)."""


class _Named:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


DISCARD = _Named("DISCARD")
"""Close the answer unread: the request goes once more."""

CONNECTING = _Named("CONNECTING")
"""Told during a send (by the library's trace): a new connection is being made for it."""

CONNECTED = _Named("CONNECTED")
"""Told during a send: the connection (new or kept alive) is ready, the request is about to
be written: the permit is taken then, or, taken before, checked (``CallGuard.late``)."""

AGAIN = _Named("AGAIN")
"""The flow's step after ``CONNECTED`` on permits later than the fleet's measured margin
covers (a process the machine did not run since they were read): they went back; the
library's send stops unsent (it raises :class:`AskAgain`), and the call asks again."""


class AskAgain(Exception):
    """Raised by a library's trace when the flow answered ``AGAIN``: the request is not
    written (its library lets the connection go), and the flow asks again for its permits
    (waiting, if it must, without holding a connection that the partner may close)."""


PROCEED = _Named("PROCEED")
"""The flow's step after ``CONNECTING`` or ``CONNECTED``: the send goes on."""


class Settle:
    """The call's tokens, to settle by its answer's body (the flow's last step); ``came``:
    when its headers came (the event loop's clock), from which their counts' resets run."""

    __slots__ = ("_acquired", "_came", "_headers", "_meter")

    def __init__(
        self, meter: TokenMeter, acquired: Acquired, headers: Mapping[str, str], came: float
    ) -> None:
        self._meter, self._acquired, self._headers = meter, acquired, headers
        self._came = came

    async def read(self, response: object) -> None:
        """Settled now by ``usage(response)``, its body read (None: not readable, the
        estimate stands); then the provider's counts of tokens left taken as floors."""
        await self._meter.settle(self._acquired, response, self._headers, self._came)

    def tap(self, reread: Callable[[bytes], object]) -> BodyTap:
        """For a body the caller reads later: up to ``MAX_BODY`` of it kept; once it ends,
        ``usage(reread(body))`` settles (longer: the estimate stands), then the floors."""
        meter, acquired, headers, came = self._meter, self._acquired, self._headers, self._came

        def ending(body: object) -> Awaitable[None]:
            response = None if body is None else reread(body)  # type: ignore[arg-type]
            return meter.settle(acquired, response, headers, came)

        return BodyTap(KeptBody(), ending, meter.tokens.backend.context.tasks)

    async def events(self) -> BodyTap:
        """For an event stream the caller reads later: the floors now; once it ends, the
        usage of its last event that carries one settles (none: the estimate stands)."""
        meter, acquired = self._meter, self._acquired
        await meter.settle(acquired, None, self._headers, self._came)

        def ending(used: object) -> Awaitable[None] | None:
            return None if used is None else meter.settle_used(acquired, used)

        return BodyTap(meter.tail(), ending, meter.tokens.backend.context.tasks)


Step: TypeAlias = "Send | _Named | Settle"
Told: TypeAlias = "Answer | _Named | None"
Flow: TypeAlias = AsyncGenerator[Step, Told]
Tell = Callable[[_Named], Awaitable[object]]
"""What a library's trace calls during a send: the flow told ``CONNECTING``, ``CONNECTED``;
the flow's answer back (``PROCEED``, or ``AGAIN``: raise :class:`AskAgain`)."""


class Exchange(Protocol, Generic[R]):
    """A library's part of one call: what :func:`drive` does for the flow's steps, with the
    response it holds (``R``: its library's)."""

    @property
    def response(self) -> R | None:
        """The response held (None: none yet, or discarded)."""

    async def send(self, held: Held | None, tell: Tell) -> Answer:
        """The request sent, its response held; with ``held``, the slot held until the
        response's body is closed. Where the library reports its connections (a trace),
        ``tell(CONNECTING)`` as a new one is made; where it can, ``tell(CONNECTED)`` once
        the connection (new or kept alive) is ready, before the request is written (the flow
        takes the permit then, or checks it), and :class:`AskAgain` raised, the request
        unwritten, when the flow answers ``AGAIN``."""

    async def discard(self) -> None:
        """The response closed unread and let go (the request is sent again)."""

    async def settle(self, settle: Settle) -> None:
        """The call's tokens settled by the response's body, now or as it is read."""

    async def close(self) -> None:
        """A step failed (or the caller was cancelled): the response held, if any, is
        closed, since no one else will (its connection and its slot go back)."""


async def drive(flow: Flow, exchange: Exchange[R]) -> R:
    """Runs ``flow`` with ``exchange`` doing its steps; the response for the caller."""

    ended = False  # (the flow raised mid-send: the send raises the same, not to be thrown in)

    async def tell(event: _Named) -> object:
        nonlocal ended
        try:
            return await flow.asend(event)
        except BaseException:
            ended = True
            raise

    try:
        step = await flow.asend(None)
        while True:
            reply: Answer | None = None
            try:
                if isinstance(step, Send):
                    reply = await exchange.send(step.held, tell)
                elif isinstance(step, Settle):
                    await exchange.settle(step)
                else:  # DISCARD
                    await exchange.discard()
            except BaseException as exc:  # the flow's to judge (what never left goes back)
                if ended:
                    raise
                step = await flow.athrow(exc)
            else:
                step = await flow.asend(reply)
    except StopAsyncIteration:
        response = exchange.response
        assert response is not None
        return response
    except BaseException:
        await exchange.close()
        raise


class ClientCalls:
    """What an HTTP client's options make, once per client: :meth:`flow`, each call's."""

    __slots__ = ("_guard",)

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int,
        timeout: Duration | None,
        retry: bool,
        max_pause: Duration,
        tokens: RateLimiter | Mapping[str, RateLimiter] | None,
        estimate: Callable[[Any], int | Mapping[str, int]] | None,
        usage: Callable[[Any], Used | Awaitable[Used]] | None,
        concurrency: ConcurrencyLimiter | None,
        learn: bool | Learner,
        defaults: tuple[Callable[[Any], object], Callable[[Any], object]],
        kinds_defaults: tuple[Callable[[Any], object], Callable[[Any], object]],
    ) -> None:
        meter = meter_of(tokens, limiter, estimate, usage, defaults, kinds_defaults)
        self._guard = CallGuard(
            limiter,
            permits=permits,
            timeout=timeout,
            retry=retry,
            max_pause=max_pause,
            concurrency=concurrency,
            meter=meter,
            learn=learn,
        )

    @property
    def limiter(self) -> RateLimiter | ShardedRateLimiter:
        return self._guard.limiter

    async def flow(
        self, request: object, unsent: tuple[type[BaseException], ...], resendable: bool
    ) -> Flow:
        """``request``'s steps (see the module): permits, send, sync and pause, once more
        after a pause, settle. ``unsent``: the library's errors of a request that never
        left; ``resendable``: whether its body can be sent again after a pause."""
        guard = self._guard
        again = guard.retry and resendable
        late_left = STALE_RETRIES  # (a machine that keeps stalling: sent late after these)
        while True:
            acquired = await guard.before_call(request)
            slot = acquired if isinstance(acquired, InFlight) else None
            held = None
            if slot is not None and guard.concurrency is not None:
                await slot.__aenter__()  # (its slot, for this task: a loss cancels the send)
                held = Held(slot, guard.concurrency.backend.context.tasks)
            taken: Acquired | None = acquired
            connecting = False  # (a new connection's set-up is not in the grant, if it is long)
            try:
                told = yield SEND if held is None else Send(held)
                while told is CONNECTING or told is CONNECTED:  # (a trace, mid-send)
                    if told is CONNECTING:
                        connecting = held is None
                    elif taken is None:
                        taken = await guard.before_call(request)  # as the request is written
                    elif connecting and await guard.late(taken, connected=True):
                        taken = None  # (a slow connect: handed back, asked anew on it)
                        taken = await guard.before_call(request)
                    elif not connecting and late_left and await guard.late(taken):
                        taken, late_left = None, late_left - 1
                        told = yield AGAIN  # (answered by AskAgain, thrown in)
                    told = yield PROCEED
            except AskAgain:
                continue  # unsent: its permits went back; asked again, then sent anew
            except BaseException as exc:
                if slot is not None and held is not None:
                    await slot.__aexit__(type(exc), exc, exc.__traceback__)
                if taken is not None and isinstance(exc, unsent):  # the partner never saw it
                    await guard.unsent(taken)  # all goes back
                raise
            if taken is None:  # (a library that told of a connection but not that it was ready)
                taken = await guard.before_call(request)
            acquired = taken
            assert isinstance(told, tuple)
            status, headers = told
            came = asyncio.get_running_loop().time()  # (the counts' resets run from here)
            if slot is not None and held is not None:  # held on: until the body is closed
                slot.detach()
            await guard.after_headers(headers, status, acquired)
            if not (await guard.pause_for(status, headers.get("retry-after")) and again):
                break
            again = False
            yield DISCARD
            if guard.meter is not None:
                await guard.meter.unused(acquired, headers)  # it used no tokens
        if guard.meter is not None:
            yield Settle(guard.meter, acquired, headers, came)
