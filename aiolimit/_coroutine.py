"""A method that returns a coroutine without being an ``async def`` (``RateLimiter.try_acquire``:
the caller awaits the engine's coroutine itself, one coroutine fewer per call), marked so that
``inspect.iscoroutinefunction`` says what calling it gives, with no call of its own between the
caller and the method.

>>> class RateLimiter:
...     @returns_coroutine
...     def try_acquire(self, permits: int = 1) -> Coroutine[Any, Any, bool]: ...
>>> inspect.iscoroutinefunction(limiter.try_acquire)     # True, as for an async def
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["returns_coroutine"]

F = TypeVar("F", bound=Callable[..., Any])


def returns_coroutine(method: F) -> F:
    """``method``, marked as a coroutine function (``inspect.markcoroutinefunction`` where
    Python has it, 3.12 on)."""
    if sys.version_info >= (3, 12):
        return inspect.markcoroutinefunction(method)
    if sys.version_info >= (3, 11):
        # Python 3.11 makes a coroutine where the code says so (its first instruction,
        # RETURN_GENERATOR), never from the code's flags: a plain function whose code is
        # flagged CO_COROUTINE still runs at once, and is still called as any method is
        # (no binding of its own per call, as _Marked's: ~1 400 instructions a call).
        code = method.__code__
        method.__code__ = code.replace(co_flags=code.co_flags | inspect.CO_COROUTINE)
        return method
    return cast(F, _Marked.of(method))  # (called, it is ``method``)


class _Marked(property):
    """On Python 3.10, a method that ``inspect`` takes for a coroutine function: it reads
    a function's attributes, here ``method``'s with a ``__code__`` flagged ``CO_COROUTINE``
    (read, never run). Each is of a class of its own whose ``__call__`` is ``method`` itself
    (a staticmethod: a call goes straight to it), and a property whose getter binds it to
    the instance (C code: no frame either)."""

    @classmethod
    def of(cls, method: Callable[..., Any]) -> _Marked:
        kind = type(method.__name__, (cls,), {"__call__": staticmethod(method)})
        marked: _Marked = property.__new__(kind)
        bind = functools.partial(types.MethodType, cast(Callable[..., Any], marked))
        property.__init__(marked, bind)
        code = method.__code__
        vars(marked).update(
            {name: getattr(method, name) for name in _READ},
            __wrapped__=method,
            __code__=code.replace(co_flags=code.co_flags | inspect.CO_COROUTINE),
        )
        return marked


_READ = (
    "__module__",
    "__name__",
    "__qualname__",
    "__doc__",
    "__annotations__",
    "__defaults__",
    "__kwdefaults__",
)
"""What ``inspect`` and ``help()`` read of a function, besides its code."""
