"""One operation's Lua and how it is sent: a script (``LIBRARY``, the files it uses, then its
own ``lua/<name>.lua``) run with EVALSHA or FCALL, or a plain read command. What each
operation's reply means is in ``_scripts``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Generic, TypeVar

from . import _functions
from ._request import Batch

__all__ = ["LIBRARY", "ReadCommand", "Script", "lua_source"]

R = TypeVar("R")


LIBRARY = (
    "lib",
    "groups",
    "held",
    "sliding_walk",
    "sliding_floors",
    "sliding_log",
    "sliding_window",
    "counters",
    "token_bucket",
    "carries",
    "fixed_window",
)
"""The files every script starts with, in order: the core (``lib``, then ``groups``), then each
algorithm, which adds its functions to the core's ``ALGORITHMS`` table (``held`` is what a
sliding window keeps of reclaimed grants, ``sliding_walk`` how it finds a waiter's slot,
``sliding_floors`` how a sliding window holds a provider's count, ``sliding_log`` the log of
one rate, ``counters`` what the token bucket and fixed windows share, ``carries`` the
provider's floors fixed windows keep). Adding an algorithm adds its file here."""


def lua_source(*names: str) -> str:
    """The files ``lua/<name>.lua`` joined, in order."""
    lua = resources.files("aiolimit.backends.redis") / "lua"
    return "\n".join((lua / f"{name}.lua").read_text() for name in names)


class Script(Generic[R]):
    """One operation's Lua, ``LIBRARY`` + ``uses`` + lib.lua's ``begin_call()`` + ``<name>.lua``:
    run with EVALSHA, or EVAL
    to load it. ``decode`` turns its reply into ``R``; ``heard``, if given, is told the reply
    as soon as it is read (see :class:`~._request.Operation`). Every script is safe to send
    again (``resend``): where a call ran and only its reply was lost, the second admits no
    more than one call would (each says why where it is defined below)."""

    __slots__ = ("batch", "decode", "function", "heard", "name", "sha", "source")

    resend = True

    def __init__(
        self,
        name: str,
        decode: Callable[[Any], R],
        *,
        uses: Sequence[str] = (),
        batch: Batch | None = None,
        heard: Callable[[Any], None] | None = None,
    ) -> None:
        self.name = name
        self.source = f"{lua_source(*LIBRARY, *uses)}\nbegin_call()\n{lua_source(name)}"
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        # Its function in the library of every script, for servers that have Redis Functions.
        self.function: str | None = _functions.register(name, (*LIBRARY, *uses))
        self.decode = decode
        self.batch = batch
        self.heard = heard

    @property
    def library(self) -> str:
        return _functions.library()

    @property
    def what(self) -> str:
        return f"the {self.name} script"

    def command(self, keys: Sequence[Any], args: Sequence[Any], load: bool) -> tuple[Any, ...]:
        if load:
            return ("EVAL", self.source, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


class ReadCommand(Generic[R]):
    """A plain read-only command: it shares round trips as scripts do, and is always safe to
    send again."""

    __slots__ = ("decode", "name")

    resend = True
    batch = None
    heard = None
    function = None
    library = None

    def __init__(self, name: str, decode: Callable[[Any], R]) -> None:
        self.name = name
        self.decode = decode

    @property
    def what(self) -> str:
        return self.name

    def command(self, keys: Sequence[Any], args: Sequence[Any], load: bool) -> tuple[Any, ...]:
        return (self.name, *keys, *args)
