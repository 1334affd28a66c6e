"""Where a settled acquisition waits: its process's callers of the same limiters, one at a
time, in the order they came (the engine's ``paced``, ``_acquire``).

>>> turns = turns_of(request.paced)          # this loop's turns of these limiters
>>> if await turns.wait(request.deadline):   # this caller's turn
...     ...                                  # ask no further ahead than HORIZON; pause
>>> refunded(tokens, 900)                    # 900 came back: its holder asks, if enough

A grant that will be settled (``reserve()``, ``acquire_all``, a metered HTTP call) reserves
no further ahead than ``HORIZON``: a reservation is placed on what the store knew when it
was made and is not moved earlier by later refunds, so worst cases queued far ahead would
keep places their settled predecessors no longer need. The caller whose turn it is asks;
when refused it pauses: it asks again a little before the store said it could grant (then
up to ``DUE_HORIZON`` ahead: another process's caller told that time asks too), at
once when settles or releases of this process have handed back what it lacked, else after
``HORIZON``, then twice as long each time up to ``MAX_ASK_EVERY`` (a refund in another
process is seen that late at most). Only the turn's holder asks, so a process asks at most
once per pause, however many wait; one whose deadline comes before the holder can be
granted stops waiting. A refund made elsewhere (another process, another client of the
store) wakes it as one of its process does, where the store tells of refunds
(``Backend.watch_refunds``: a Redis store on its limiter's refund channel): the turn's
holder watches them from its first pause until its process has no caller of these
limiters left; a lost message is seen at the next ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from functools import partial

from ._request import left_of, micros, now_us, seconds
from ._settling import Limited
from .backends.base import Refusal

__all__ = [
    "DUE_HORIZON",
    "HORIZON",
    "MAX_ASK_EVERY",
    "MAX_ASK_HEARING",
    "Foresight",
    "Turns",
    "kept",
    "refunded",
    "turns_of",
]

HORIZON = 0.01
"""How far ahead (seconds) a settled acquisition reserves: further, and it asks again after
at most this long, then twice as long each time, up to ``MAX_ASK_EVERY`` (a settle or
release of its process handing back what it lacks wakes it at once)."""

DUE_HORIZON = 0.05
"""How far ahead (seconds) a settled acquisition reserves when it asks again at the time
the store said it could grant (its pause ended then, no refund woke it): callers of other
processes told the same time ask at once too, and the one that comes second reserves the
next place within this, rather than being refused and asking once more. Still near: a
refund meanwhile delays it by this at most, and goes to whoever asks next."""

MAX_ASK_EVERY = 0.25
"""The longest a waiting settled acquisition waits between two asks: how late, at most, it
sees permits handed back in another process whose message it missed (or on a store that
tells no one of refunds). Every process's first waiter asks at least
this often while the limit binds, so a fleet of N processes asks N / MAX_ASK_EVERY times a
second. Where the store tells of refunds made elsewhere (``Backend.watch_refunds``), up to
``MAX_ASK_HEARING`` instead: the poll is then only the bound for a lost message."""

MAX_ASK_HEARING = 1.0
"""The longest pause between two asks of a caller that hears refunds made elsewhere."""

Key = tuple[tuple[Hashable, str, str], ...]

Foresight = tuple[Refusal, int]
"""What the store foresaw for the caller next in line, on the ask that granted the caller
before it (``Backend.start_foresee``), and when it was heard (µs, the loop's clock)."""

# Each loop's turns, by the limiters they are for (while a caller holds or waits for them).
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Key, Turns]] = (
    weakref.WeakKeyDictionary()
)


def _identity(limiter: Limited) -> tuple[Hashable, str, str]:
    """What makes two limiter objects one: the store, the name and the client id."""
    backend = limiter.backend
    return (backend.store_id, limiter.name, backend.client_id)


def turns_of(limiters: Sequence[Limited]) -> Turns:
    """This loop's turns of ``limiters`` (made when none is held or waited for)."""
    by_key = _turns.get(asyncio.get_running_loop())
    if by_key is None:
        by_key = _turns[asyncio.get_running_loop()] = {}
    key = tuple(map(_identity, limiters))
    turns = by_key.get(key)
    if turns is None:
        turns = by_key[key] = Turns(key, by_key)
    return turns


def refunded(limiter: Limited, permits: int) -> None:
    """``permits`` of ``limiter`` came back in this process: the caller whose turn it is, on
    every turns of this loop that ``limiter`` is among, asks again at once when they may be
    enough for it (:meth:`Turns.pause`)."""
    identity = _identity(limiter)
    for turns in _turns_among(identity):
        turns.refunded(identity, permits)


def kept(limiter: Limited) -> int:
    """The permits of ``limiter`` that a refund this process is about to make goes first to
    its own paused caller, if it covers them: what that caller lacks of ``limiter`` (and of
    no other limiter), once per pause; 0 when none lacks them. A store tells other processes
    only of the rest of such a refund (``Backend.settle``'s ``kept``): their waiters would
    ask for permits this process takes first, and be refused."""
    identity = _identity(limiter)
    for turns in _turns_among(identity):
        short = turns.keeps(identity)
        if short > 0:
            return short
    return 0


def _turns_among(identity: tuple[Hashable, str, str]) -> list[Turns]:
    """This loop's turns that the limiter of ``identity`` is among."""
    by_key = _turns.get(asyncio.get_running_loop())
    return [turns for key, turns in by_key.items() if identity in key] if by_key else []


class Turns:
    """An event loop's callers of some limiters, one at a time, in the order they came."""

    __slots__ = (
        "_at_due",
        "_busy",
        "_by_key",
        "_every",
        "_foreseen",
        "_free_at",
        "_kept",
        "_key",
        "_lacking",
        "_paused",
        "_probed",
        "_since",
        "_waiting",
        "_watching",
    )

    def __init__(self, key: Key, by_key: dict[Key, Turns]) -> None:
        self._key, self._by_key = key, by_key
        self._busy = False
        self._at_due = False  # the last pause ended when the store said it could grant
        # Each waiting caller: its turn (True: it came; False: it cannot come in time), its
        # deadline, and the permits it asks (None: of several limiters).
        self._waiting: deque[tuple[asyncio.Future[bool], int | None, int | None]] = deque()
        # The turn of the caller next in line when the turn's caller last asked (the one
        # its foresight was for), and the foresight handed to the caller whose turn it is.
        self._probed: asyncio.Future[bool] | None = None
        self._foreseen: Foresight | None = None
        self._paused: asyncio.Future[None] | None = None
        self._every = HORIZON  # the longest pause now: it grows while pauses end unwoken
        self._free_at = 0  # µs (loop clock): the turn's caller cannot be granted before
        # What the turn's caller lacks of each limiter that refused it, less the permits
        # handed back in this process since (none known: any refund wakes it).
        self._lacking: dict[tuple[Hashable, str, str], int] = {}
        self._kept = False  # a refund of this process was told to keep what it lacks
        # The permits handed back while the turn's caller was asking, not paused: its
        # answer may not know them yet, and its next pause counts them.
        self._since: dict[tuple[Hashable, str, str], int] = {}
        # What stops each limiter's refund watch (None: its store tells no one).
        self._watching: dict[tuple[Hashable, str, str], Callable[[], None] | None] = {}

    async def pause(self, due: float, lacking: Sequence[tuple[Limited, int]] = ()) -> bool:
        """The caller whose turn it is sleeps until a little before ``due`` seconds from
        now, when the store said it could grant (asked within the horizon then, a caller
        of another process asking too gets the next place, not a refusal), or for the
        longest pause now, or until :meth:`wake`: whether woken. A pause that ended on
        its own and short of ``due`` doubles the next ones, up to ``MAX_ASK_EVERY`` (or
        ``MAX_ASK_HEARING`` where refunds made elsewhere are heard), for
        every caller of these turns until they are idle. Callers waiting behind it whose
        deadline comes before ``due`` stop waiting (:meth:`wait`). ``lacking``: the permits
        it lacks of each limiter (asked less what the refusal said was left): a refund in
        this process wakes it once they are handed back, a smaller one does not (left below
        none counts as none: ``paced``)."""
        self._not_before(due)
        since, self._since = self._since, {}
        self._lacking, self._kept = {}, False
        for limiter, short in lacking:
            identity = _identity(limiter)
            self._lacking[identity] = short - since.get(identity, 0)
            self._watch(identity, limiter)
        if lacking and all(short <= 0 for short in self._lacking.values()):
            return True  # (handed back while it asked: it asks again now)
        due = max(due - HORIZON / 2, 0.001)
        paused = self._paused = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((paused,), timeout=min(due, self._every))
            woken = paused.done() and not paused.cancelled()
            self._at_due = not woken and due <= self._every
        finally:
            self._paused = None
            paused.cancel()
        if not woken and due > self._every:
            hearing = bool(self._lacking) and all(map(self._watching.get, self._lacking))
            self._every = min(self._every * 2, MAX_ASK_HEARING if hearing else MAX_ASK_EVERY)
        return woken

    def foreseen(self) -> Foresight | None:
        """What the ask before this caller's turn foresaw for it (once: then None)."""
        foreseen, self._foreseen = self._foreseen, None
        return foreseen

    @property
    def horizon(self) -> float:
        """How far ahead the caller whose turn it is reserves now: ``DUE_HORIZON`` when its
        last pause ended at the time the store said it could grant, else ``HORIZON``."""
        return DUE_HORIZON if self._at_due else HORIZON

    async def hold(self, seconds: float) -> None:
        """The caller whose turn it is sleeps ``seconds``, whatever comes back meanwhile (a
        limiter held it whose grants are not settled); callers waiting behind it whose
        deadline comes first stop waiting."""
        self._not_before(seconds)
        await asyncio.sleep(seconds)

    def _not_before(self, seconds: float) -> None:
        """The caller whose turn it is cannot be granted within ``seconds`` from now: nor
        can any behind it, and those whose deadline comes first stop waiting."""
        self._free_at = now_us() + micros(seconds)
        for turn, deadline, _ in self._waiting:
            if deadline is not None and deadline < self._free_at and not turn.done():
                turn.set_result(False)

    def _watch(self, identity: tuple[Hashable, str, str], limiter: Limited) -> None:
        """Refunds of ``limiter`` made elsewhere are heard from now on, until these turns
        are forgotten (:meth:`next`)."""
        if identity not in self._watching:
            heard = partial(self.refunded, identity)
            self._watching[identity] = limiter.backend.watch_refunds(limiter.name, heard)

    def keeps(self, identity: tuple[Hashable, str, str]) -> int:
        """What the paused caller whose turn it is lacks of one limiter, if it lacks
        nothing of the others: a refund of this process that covers it wakes it, and need
        not wake others for it (:func:`kept`). Once per pause (0 after): two refunds made
        together would not both keep it."""
        if self._paused is None or self._kept:
            return 0
        short = self._lacking.get(identity, 0)
        if short <= 0 or any(n > 0 for i, n in self._lacking.items() if i != identity):
            return 0
        self._kept = True
        return short

    def refunded(self, identity: tuple[Hashable, str, str], permits: int) -> None:
        """``permits`` of a limiter came back, in this process or elsewhere: a :meth:`pause`
        ends if the caller may have all it lacks now (one asking meanwhile counts them in
        its next pause)."""
        if self._paused is None:
            if self._busy:
                self._since[identity] = self._since.get(identity, 0) + permits
            return
        lacking = self._lacking
        if identity in lacking:
            lacking[identity] -= permits
        if all(short <= 0 for short in lacking.values()):
            self.wake()

    def wake(self) -> None:
        """Ends a :meth:`pause`."""
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    async def wait(self, deadline: int | None, permits: int | None = None) -> bool:
        """Waits for this caller's turn until ``deadline`` (µs on the loop's clock; None: for
        as long as it takes); whether it came (then :meth:`next` passes it on). False at
        once when the caller whose turn it is cannot be granted before ``deadline`` by what
        the store knows (in this process's order, this one cannot be either). ``permits``:
        what it asks of the one limiter of these turns (None: it asks several), what the
        caller before it asks a foresight of (:meth:`behind`)."""
        if not self._busy:
            self._busy = True
            return True
        if deadline is not None and deadline < self._free_at:
            return False
        waiting = (asyncio.get_running_loop().create_future(), deadline, permits)
        turn = waiting[0]
        self._waiting.append(waiting)
        left = left_of(deadline)
        try:
            await asyncio.wait((turn,), timeout=None if left is None else seconds(left))
        except BaseException:  # (cancelled: a turn that came meanwhile is passed on)
            if _came(turn):
                self.next()
            else:
                turn.cancel()
                self._forget(waiting)
            raise
        if _came(turn):
            return True
        turn.cancel()  # (timed out, or it cannot come in time)
        self._forget(waiting)
        return False

    def _forget(self, waiting: tuple[asyncio.Future[bool], int | None, int | None]) -> None:
        with contextlib.suppress(ValueError):  # (passed over by next() already)
            self._waiting.remove(waiting)

    def behind(self) -> int | None:
        """The permits the caller next in line asks of the one limiter of these turns, for a
        foresight to ride on the ask of the caller whose turn it is (None: none waits, or
        it asks several limiters); :meth:`next` hands that foresight on to it."""
        for turn, _, permits in self._waiting:
            if not turn.done():
                self._probed = turn
                return permits
        self._probed = None
        return None

    def next(self, foreseen: Foresight | None = None) -> None:
        """The turn passes to the next caller waiting, if any (none: these turns are
        forgotten, until a caller comes again), with ``foreseen``: the foresight the ask
        that granted the caller before it made for the caller :meth:`behind` named, if the
        turn passes to that caller (:meth:`foreseen`)."""
        self._free_at, self._lacking, self._since, self._at_due = 0, {}, {}, False
        probed, self._probed, self._foreseen = self._probed, None, None
        while self._waiting:
            turn, _, _ = self._waiting.popleft()
            if not turn.done():
                turn.set_result(True)
                if turn is probed:
                    self._foreseen = foreseen
                return
        self._busy = False
        if self._by_key.get(self._key) is self:
            del self._by_key[self._key]
        watching, self._watching = self._watching, {}
        for stop in watching.values():
            if stop is not None:
                stop()


def _came(turn: asyncio.Future[bool]) -> bool:
    """Whether a waiting caller's turn came (not: cancelled, timed out, or not in time)."""
    return turn.done() and not turn.cancelled() and turn.result()
