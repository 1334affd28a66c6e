"""The config a limiter's code gives it, which the store is to hold while the code runs:
``RateLimiter(rate=...)`` (or its :meth:`ensure_rate`), ``ShardedRateLimiter(rate=...)``,
``ConcurrencyLimiter(limit=...)``, the ASGI middleware's rules.

>>> code = CodeConfig(config, limiter.write_config)    # checked already; nothing written
>>> if not code.stored:
...     await code.store()          # before the limiter's first call
>>> await asked_again(lost, [(name, code)], call)  # a call found it lost: written, called again

One owner per limiter object, shared by its views (``for_client``, a sharded limiter's
shards). A write is single-flight: the callers of the process that need one (the first
calls, or the callers that found the config lost together) wait for one write, and its
failure answers each of them (the next call writes again). The limiter writes
(``write(config, replace)``): the first write replaces a stored config that differs (the
code's config is the code's: ``ensure_rate``); a write after a loss writes only where there
is none, so a config another process or an operator wrote meanwhile stands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from .errors import NotConfiguredError

__all__ = ["CodeConfig", "asked_again"]

C = TypeVar("C")
T = TypeVar("T")


class CodeConfig(Generic[C]):
    """The config the code gives a limiter (``config``; None: it gives none) and whether the
    store holds it as far as this process knows (``stored``: no write before the next
    call)."""

    __slots__ = ("_write", "_writing", "_written", "config", "stored")

    def __init__(self, config: C | None, write: Callable[[C, bool], Awaitable[object]]) -> None:
        self.config = config
        self.stored = config is None
        self._written = False  # once written, a write after a loss replaces nothing
        self._write = write
        self._writing: asyncio.Future[object] | None = None

    def given(self, config: C) -> None:
        """``config`` is the code's from now on, and stored (``ensure_rate`` wrote it or
        found it so)."""
        self.config = config
        self.stored = self._written = True

    async def store(self) -> None:
        """Writes the config unless it is stored (a limiter's first call waits for it)."""
        if not self.stored:
            await self._one_write()

    async def restore(self) -> None:
        """Writes the config again after a call found the store without it; the callers
        that come meanwhile wait for this write instead of asking the store."""
        self.stored = False
        await self._one_write()

    async def _one_write(self) -> None:
        writing = self._writing
        if writing is None or writing.get_loop() is not asyncio.get_running_loop():
            config = self.config
            if config is None:
                raise AssertionError("no config in code to write")  # (callers check)
            writing = self._writing = asyncio.ensure_future(self._write(config, not self._written))
            writing.add_done_callback(self._done)
        await asyncio.shield(writing)  # a caller cancelled meanwhile: the write goes on

    def _done(self, writing: asyncio.Future[object]) -> None:
        if self._writing is writing:
            self._writing = None
        if not writing.cancelled() and writing.exception() is None:
            self.stored = self._written = True


async def asked_again(
    lost: NotConfiguredError,
    owners: Sequence[tuple[str, CodeConfig[Any]]],
    ask: Callable[[], Awaitable[T]],
) -> T:
    """After a call found the store without a config (``lost``): the config the code gives
    the limiter it names (``owners``: each limiter's name and owner) written again, then the
    call (``ask``) made once more; again for each other limiter found without one (a call
    over several that lost theirs together), once per limiter. A loss of a limiter whose
    code gives none is raised."""
    written: set[str] = set()
    while True:
        giving = {id(o): o for name, o in owners if name == lost.name and o.config is not None}
        if not giving or lost.name in written:
            raise lost
        written.add(lost.name)
        await asyncio.gather(*(owner.restore() for owner in giving.values()))
        try:
            return await ask()
        except NotConfiguredError as again:
            lost = again
