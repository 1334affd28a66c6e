"""A permit call that must be awaited, loud when it is not.

A coroutine is always true, so ``if limiter.try_acquire():`` (the ``await`` forgotten) would
admit every caller. The permit calls return an :class:`Awaiting`: awaited, it is the call's
coroutine; tested for truth, it raises a TypeError that says to await it. Handed to asyncio
(``create_task``, ``gather``, ``wait_for``) it is a coroutine, as it was.

>>> if limiter.try_acquire():          # TypeError: ... is a coroutine: await it
>>> if await limiter.try_acquire():    # the call

Cost, on the hot path: no Python frame (made with ``object.__new__``; ``__await__`` read
through C, a property over ``attrgetter``), but about 2 500 instructions a call (CPython
3.11: the coroutine's end comes back through its wrapper as a StopIteration).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Concatenate, NoReturn, ParamSpec, TypeVar

from ._coroutine import returns_coroutine

__all__ = ["Awaiting", "awaited", "awaiting"]

_T = TypeVar("_T", covariant=True)
_S = TypeVar("_S")
_P = ParamSpec("_P")


class Awaiting(Coroutine[Any, Any, _T]):
    """A call's ``coroutine``; see the module. Made without ``__init__`` on the hot path:
    ``awaiting = object.__new__(Awaiting); awaiting.coroutine = call``."""

    __slots__ = ("coroutine",)

    coroutine: Coroutine[Any, Any, _T]

    if TYPE_CHECKING:

        def __await__(self) -> Generator[Any, None, _T]: ...
        def send(self, value: Any, /) -> Any: ...
        def throw(self, *args: Any) -> Any: ...
        def close(self) -> None: ...
    else:  # (read through C: no Python frame when awaited)
        __await__ = property(attrgetter("coroutine.__await__"))
        send = property(attrgetter("coroutine.send"))
        throw = property(attrgetter("coroutine.throw"))
        close = property(attrgetter("coroutine.close"))

    def __bool__(self) -> NoReturn:
        name = self._name()
        call = f"limiter.{name.rsplit('.', 1)[-1]}" if "." in name else name
        raise TypeError(
            f"{name}() is a coroutine, which is always true: await it (`await {call}(...)`)"
        )

    def __repr__(self) -> str:
        return f"<{self._name()}() not yet awaited>"

    def _name(self) -> str:
        """The public call's name (its coroutine's, which its never-awaited warning says)."""
        return str(getattr(self.coroutine, "__qualname__", "the permit call"))


def awaiting(call: Coroutine[Any, Any, _S], name: str) -> Awaiting[_S]:
    """``call`` as an :class:`Awaiting`, its never-awaited warning naming ``name``."""
    call.__qualname__ = name  # type: ignore[attr-defined]  # (a coroutine's is writable)
    made: Awaiting[_S] = object.__new__(Awaiting)
    made.coroutine = call
    return made


def awaited(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_S, _P], Awaiting[_T]]:
    """An ``async def`` method whose calls return an :class:`Awaiting`, named as the caller's
    class names it (``RateLimiter.reserve``, not the base's); a coroutine function still, to
    ``inspect`` (``returns_coroutine``)."""
    short = method.__name__

    @functools.wraps(method)
    def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> Awaiting[_T]:
        return awaiting(method(self, *args, **kwargs), f"{type(self).__name__}.{short}")

    return returns_coroutine(call)
