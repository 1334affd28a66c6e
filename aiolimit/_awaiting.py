"""A permit call that must be awaited, loud when it is not.

A coroutine is always true, so ``if limiter.try_acquire():`` (the ``await`` forgotten) would
admit every caller. The permit calls return an :class:`Awaiting`: awaited, it is the call's
coroutine; tested for truth, it raises a TypeError that says to await it. Handed to asyncio
(``create_task``, ``gather``, ``wait_for``) it is a coroutine, as it was.

>>> if limiter.try_acquire():          # TypeError: ... is a coroutine: await it
>>> if await limiter.try_acquire():    # the call

Cost, on the hot path: making one is a tuple and the coroutine's ``__await__``; awaiting it
runs no Python frame (``__await__`` is read through C: a property over ``itemgetter``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator
from operator import itemgetter
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Concatenate, NoReturn, ParamSpec, TypeVar

__all__ = ["Awaiting", "awaited", "awaiting"]

_T = TypeVar("_T", covariant=True)
_S = TypeVar("_S")
_P = ParamSpec("_P")


class Awaiting(tuple[Any, ...], Coroutine[Any, Any, _T]):
    """A call's coroutine, as ``(its __await__, the coroutine)``; see the module."""

    __slots__ = ()

    if TYPE_CHECKING:

        def __await__(self) -> Generator[Any, None, _T]: ...
        def send(self, value: Any, /) -> Any: ...
        def throw(self, *args: Any) -> Any: ...
        def close(self) -> None: ...
    else:
        __await__ = property(itemgetter(0))
        send = property(lambda self: self[1].send)
        throw = property(lambda self: self[1].throw)
        close = property(lambda self: self[1].close)

    def __bool__(self) -> NoReturn:
        name = self[1].__qualname__
        call = f"limiter.{name.rsplit('.', 1)[-1]}" if "." in name else name
        raise TypeError(
            f"{name}() is a coroutine, which is always true: await it (`await {call}(...)`)"
        )

    def __repr__(self) -> str:
        return f"<{self[1].__qualname__}() not yet awaited>"


def awaiting(call: Coroutine[Any, Any, _S], name: str) -> Awaiting[_S]:
    """``call`` as an :class:`Awaiting`, its never-awaited warning naming ``name``."""
    assert isinstance(call, CoroutineType)
    call.__qualname__ = name
    return Awaiting((call.__await__, call))


def awaited(
    method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_S, _P], Awaiting[_T]]:
    """An ``async def`` method whose calls return an :class:`Awaiting`, named as the caller's
    class names it (``RateLimiter.reserve``, not the base's)."""
    short = method.__name__

    @functools.wraps(method)
    def call(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> Awaiting[_T]:
        return awaiting(method(self, *args, **kwargs), f"{type(self).__name__}.{short}")

    return call
