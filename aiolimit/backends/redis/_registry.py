"""The PER_CLIENT registry's walks: a reset retires every client of the old registry, and
``expire``/``clear_expire`` give every client the TTLs the config gives it, a chunk of clients
per script call (retire.lua, refresh.lua), so that no call holds Redis long."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from . import _scripts as scripts
from ._keys import Keys
from ._script import ReadCommand, Script

__all__ = ["Now", "Run", "refresh_clients", "retire_clients"]

R = TypeVar("R")

# PER_CLIENT clients handled by one retire.lua or refresh.lua call: well under 1 ms of server
# time (about four commands each), so that no call holds Redis long.
_CLIENTS_PER_CALL = 100


class Run(Protocol):
    """Runs a script or read command (``RedisBackend._run``): its decoded reply."""

    def __call__(
        self, script: Script[R] | ReadCommand[R], keys: Sequence[Any], args: Sequence[Any]
    ) -> Awaitable[R]: ...


Now = Callable[[], str]
"""The clock reading a script is sent (``''``: the server's ``TIME``)."""


async def _clients(run: Run, registry: str, start: int) -> list[str]:
    end = start + _CLIENTS_PER_CALL - 1
    return await run(scripts.CLIENTS, (registry,), (start, end))


async def retire_clients(run: Run, now: Now, keys: Keys, retired: str) -> None:
    """Removes the state of every client of a retired registry, a chunk per call. Each call
    removes its chunk from the registry, and nothing adds to it: this ends."""
    while clients := await _clients(run, retired, 0):
        chunk = [keys.config, retired, *keys.clients(clients), keys.registry]
        await run(scripts.RETIRE, chunk, [now(), *clients])


async def refresh_clients(run: Run, now: Now, keys: Keys) -> None:
    """Gives every client in the registry the TTLs the config gives it, a chunk per call.
    Clients that join meanwhile get them from their own grants."""
    start = 0
    while clients := await _clients(run, keys.registry, start):
        await run(
            scripts.REFRESH,
            [keys.config, keys.registry, *keys.clients(clients)],
            [now(), *clients],
        )
        if len(clients) < _CLIENTS_PER_CALL:
            return
        start += len(clients)
