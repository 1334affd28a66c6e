"""A request, as callers make it, and a call, as a round trip carries it.

What the coalescer sends is an :class:`Operation` (a script or a plain command) that says how
to send itself, whether it may be sent again after a lost connection, and, with a
:class:`Batch`, how several requests for it share one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...errors import BackendError, InvalidArgumentError
from ..base import Attempt

__all__ = ["Batch", "Call", "Key", "Operation", "Request", "Sent"]

Key = str | bytes


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """How requests for one operation share a call: up to ``most`` of them go as one call of
    ``carrier``, whose keys and arguments ``merge`` makes from theirs (each request's keys,
    arguments) and whose reply ``split`` cuts into one reply per request, in order."""

    carrier: Operation
    most: int
    merge: Callable[[Sequence[tuple[tuple[bytes, ...], list[bytes]]]], tuple[list[Any], list[Any]]]
    split: Callable[[Any], Sequence[Any]]


class Operation(Protocol):
    """A script or a plain command, as the coalescer sees it."""

    @property
    def name(self) -> str: ...

    @property
    def what(self) -> str:
        """What it is, for error messages: "the acquire script", "ZRANGE"."""

    @property
    def batch(self) -> Batch | None:
        """How requests for it share a call; None: each request is a call of its own."""

    @property
    def heard(self) -> Callable[[Any], None] | None:
        """Told each reply as soon as it is read, before its caller resumes, and also when
        the caller has gone (cancelled): what the reply means for others in this process (a
        release's leases handed to its waiters here). Never raises."""

    @property
    def function(self) -> str | None:
        """A script's function in a Redis Functions library (FCALL); None: no function."""

    @property
    def library(self) -> str | None:
        """The code of that library, for FUNCTION LOAD."""

    @property
    def resend(self) -> bool:
        """Whether a call whose connection was lost may be sent again: where the first call
        ran and only its reply was lost, the second must not admit more than one call would
        (it may admit less)."""

    def command(self, keys: Sequence[Any], args: Sequence[Any], load: bool) -> tuple[Any, ...]:
        """The command that runs it; with ``load``, one that also gives a script to a server
        that replied NOSCRIPT."""


class Request:
    """One caller's request, waiting for its reply."""

    __slots__ = ("args", "future", "keys", "operation", "orphan")

    def __init__(
        self,
        operation: Operation,
        keys: Sequence[Key],
        args: Sequence[Any],
        future: asyncio.Future[Any],
        orphan: Callable[[Any], None] | None,
    ) -> None:
        self.operation = operation
        # Encoded now, in the caller's own call: a key or argument that cannot be sent fails
        # that caller alone, never the round trip its request would share with others.
        # On the hot path both are bytes already, which one C-level join confirms.
        # (a list is a caller's own, made for this request: kept as it is; the types are
        # the join's to confirm, with no cast to call)
        self.keys: tuple[bytes, ...] = tuple(keys)  # type: ignore[arg-type]
        self.args: list[bytes] = args if args.__class__ is list else list(args)
        try:
            b"".join(self.keys)
            b"".join(self.args)
        except TypeError:
            self.keys = tuple(map(_encoded, keys))
            self.args = list(map(_encoded, args))
        self.future = future
        self.orphan = orphan  # called with the reply if the caller was cancelled meanwhile

    def settle(self, reply: Any) -> None:
        heard = self.operation.heard
        if heard is not None and not isinstance(reply, BaseException):
            heard(reply)
        future = self.future
        if future.done():  # the caller was cancelled, or gave up
            if self.orphan is not None and not isinstance(reply, BaseException):
                self.orphan(reply)
        elif isinstance(reply, BaseException):
            future.set_exception(reply)
        else:
            future.set_result(reply)


def _encoded(value: Any) -> bytes:
    """``value`` as redis-py would send it."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"{value!r} cannot be sent to Redis: it does not encode as UTF-8 ({exc.reason})"
            ) from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value).encode()
    raise InvalidArgumentError(f"{value!r} cannot be sent to Redis")


class Call:
    """One command in a pipeline: one request, or several that ``batch`` carries together."""

    __slots__ = ("args", "keys", "operation", "requests", "split")

    def __init__(self, requests: list[Request], batch: Batch | None = None) -> None:
        self.requests = requests
        self.split: Callable[[Any], Sequence[Any]] | None = None
        if batch is None:
            (request,) = requests
            self.operation = request.operation
            self.keys: list[Any] = list(request.keys)
            self.args: list[Any] = list(request.args)
        else:
            self.operation = batch.carrier
            self.keys, self.args = batch.merge([(r.keys, r.args) for r in requests])
            self.split = batch.split

    @property
    def name(self) -> str:
        return self.operation.name

    @property
    def library(self) -> str | None:
        return self.operation.library

    def command(self, load: bool = False, functions: bool = False) -> tuple[Any, ...]:
        """The command that runs the call: with ``functions`` (the server has the library),
        a script's FCALL; with ``load``, one that also gives a script to a server that
        replied NOSCRIPT."""
        function = self.operation.function
        if functions and function is not None and not load:
            return ("FCALL", function, len(self.keys), *self.keys, *self.args)
        return self.operation.command(self.keys, self.args, load)

    def settle(self, reply: Any) -> None:
        if self.split is not None and not isinstance(reply, BaseException):
            try:
                replies = self.split(reply)
                if len(replies) != len(self.requests):
                    raise ValueError(f"{len(replies)} replies to {len(self.requests)} requests")
            except (ValueError, LookupError, TypeError):  # every caller learns it, none waits
                reply = BackendError(
                    f"unexpected reply to {self.operation.what}: {reply!r:.200}", outage=False
                )
            else:
                for request, one in zip(self.requests, replies, strict=True):
                    request.settle(one)
                return
        for request in self.requests:
            request.settle(reply)


class Sent:
    """An acquire request made, its reply awaited later (``RedisBackend.start_acquire``):
    ``call`` awaits ``future`` and decodes its reply. Cancelled unawaited, its grant goes
    back: the reply goes to ``orphan`` (the coalescer sends it there once the future is
    cancelled; this does, when it came already)."""

    __slots__ = ("_call", "_future", "_orphan")

    def __init__(
        self,
        call: Coroutine[Any, Any, Attempt],
        future: asyncio.Future[Any],
        orphan: Callable[[Any], None],
    ) -> None:
        self._call, self._future, self._orphan = call, future, orphan

    def __await__(self) -> Generator[Any, None, Attempt]:
        return self._call.__await__()

    def cancel(self) -> None:
        self._call.close()
        future = self._future
        if not future.cancel() and not future.cancelled() and future.exception() is None:
            self._orphan(future.result())
