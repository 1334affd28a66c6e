"""A response body passing to its caller, kept for the usage that settles the call's tokens,
and settled once at its end: what the two HTTP clients' stream wrappers share.

>>> tap = settle.tap(reread)        # made by the call's flow (_client_flow.Settle)
>>> tap.feed(chunk)                 # each chunk as the caller reads it
>>> await tap.end()                 # the body ended or closed: the usage settles, once

The wrappers cannot be one class: httpx's client takes a body only as a subclass of its
own module's ``AsyncByteStream`` (iterated, then closed with ``aclose``), while aiohttp's
caller reads a ``StreamReader`` through ten methods, and its end comes as a callback of
the response (released, closed). Each is a pass-through over this tap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ._meter import MAX_BODY
from .backends._context import Background

__all__ = ["BodyTap", "Ending", "Keeper", "KeptBody"]


class Keeper(Protocol):
    """What a tap keeps of the bytes that pass: the body itself (:class:`KeptBody`) or an
    event stream's usage (``_meter.UsageTail``)."""

    def feed(self, chunk: bytes) -> None: ...

    def finish(self) -> object: ...


Ending = Callable[[object], Awaitable[None] | None]
"""What settles once the body ended, given what the keeper kept (None: nothing to do)."""


class KeptBody:
    """The body's bytes, up to ``MAX_BODY``; past it, None (the estimate stands)."""

    __slots__ = ("_body",)

    def __init__(self) -> None:
        self._body: bytearray | None = bytearray()

    def feed(self, chunk: bytes) -> None:
        if self._body is not None:
            if len(self._body) + len(chunk) > MAX_BODY:
                self._body = None
            else:
                self._body += chunk

    def finish(self) -> bytes | None:
        return None if self._body is None else bytes(self._body)


class BodyTap:
    """Feeds ``keeper`` with the bytes the caller reads; :meth:`end` (or :meth:`end_soon`
    from a callback, in ``tasks``: the store's background, which its ``aclose()`` waits
    for) settles by what it kept, once."""

    __slots__ = ("_ending", "_keeper", "_tasks")

    def __init__(self, keeper: Keeper, ending: Ending, tasks: Background) -> None:
        self._keeper = keeper
        self._ending: Ending | None = ending
        self._tasks = tasks

    def feed(self, chunk: bytes) -> None:
        self._keeper.feed(chunk)

    def end(self) -> Awaitable[None] | None:
        """The settle, the first time (None after it, or when nothing is to settle)."""
        ending, self._ending = self._ending, None
        return None if ending is None else ending(self._keeper.finish())

    def end_soon(self) -> None:
        """:meth:`end` from a plain callback: the settle runs in the store's background."""
        ending = self.end()
        if ending is not None:
            self._tasks.spawn(ending, "a stream's usage")
