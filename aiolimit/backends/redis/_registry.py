"""The PER_CLIENT registry's walks: a reset retires every client of the old registry, and
``expire``/``clear_expire`` give every client the TTLs the config gives it, a chunk of clients
per script call (retire.lua, refresh.lua), so that no call holds Redis long."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from . import _scripts as scripts
from ._keys import Keys
from ._script import ReadCommand, Script

__all__ = ["refresh_clients", "retire_clients"]

R = TypeVar("R")

# PER_CLIENT clients handled by one retire.lua or refresh.lua call: well under 1 ms of server
# time (about four commands each), so that no call holds Redis long.
_CLIENTS_PER_CALL = 100


class _Runs(Protocol):
    def _now_arg(self) -> str: ...

    async def _run(
        self, script: Script[R] | ReadCommand[R], keys: Sequence[Any], args: Sequence[Any]
    ) -> R: ...


async def _clients(backend: _Runs, registry: str, start: int) -> list[str]:
    end = start + _CLIENTS_PER_CALL - 1
    return await backend._run(scripts.CLIENTS, (registry,), (start, end))


async def retire_clients(backend: _Runs, keys: Keys, retired: str) -> None:
    """Removes the state of every client of a retired registry, a chunk per call. Each call
    removes its chunk from the registry, and nothing adds to it: this ends."""
    while clients := await _clients(backend, retired, 0):
        chunk = [keys.config, retired, *keys.clients(clients), keys.registry]
        await backend._run(scripts.RETIRE, chunk, [backend._now_arg(), *clients])


async def refresh_clients(backend: _Runs, keys: Keys) -> None:
    """Gives every client in the registry the TTLs the config gives it, a chunk per call.
    Clients that join meanwhile get them from their own grants."""
    start = 0
    while clients := await _clients(backend, keys.registry, start):
        await backend._run(
            scripts.REFRESH,
            [keys.config, keys.registry, *keys.clients(clients)],
            [backend._now_arg(), *clients],
        )
        if len(clients) < _CLIENTS_PER_CALL:
            return
        start += len(clients)
