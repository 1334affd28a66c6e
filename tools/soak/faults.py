"""The server side of a soak: Redis commands counted from ``INFO commandstats`` (summed over
restarts), and the faults injected while the workers run (``--fault``): a script cache
flush, the workers' connections killed, the server crashed and restarted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..server import LocalRedis

__all__ = ["FAULTS", "SERVER_FAULTS", "Commands", "Injector"]

FAULTS = ("script-flush", "client-kill", "restart", "clock-skew")
# The faults sent to the server itself, and what they do to it: only on a server the soak
# started, or one whose owner says it may (``--i-own-this-server``). ``restart`` needs the
# soak's own server in any case (the process it crashes); ``clock-skew`` is the workers' own.
SERVER_FAULTS = {
    "script-flush": "SCRIPT FLUSH empties its script cache, for every client",
    "client-kill": "CLIENT KILL drops connections on it",
}
# Commands the tool itself sends to watch and disturb the server; not the limiter's cost.
_OWN_COMMANDS = {"info", "script|flush", "client|list", "client|kill", "ping"}


class Commands:
    """INFO commandstats deltas, summed over server restarts (a restart resets the counters)."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self._base: Counter[str] = Counter()

    @staticmethod
    def read(redis: Any) -> Counter[str]:
        stats = redis.info("commandstats")
        return Counter(
            {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in stats.items()}
        )

    def begin(self, redis: Any) -> None:
        self._base = self.read(redis)

    def end(self, redis: Any) -> None:
        now = self.read(redis)
        now.subtract(self._base)
        self.total.update({k: v for k, v in now.items() if v > 0 and k not in _OWN_COMMANDS})


@dataclass
class Injector:
    redis: Any
    server: LocalRedis | None
    faults: list[str]
    every: float
    client_prefix: str
    commands: Commands
    done: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    downtime: float = 0.0
    _turn: int = 0
    _next: float = 0.0

    def start(self, now: float) -> None:
        self._next = now + self.every / 2

    def tick(self, now: float, end: float) -> None:
        if not self.faults or now < self._next or now > end - self.every / 4:
            return
        self._next = now + self.every
        fault = self.faults[self._turn % len(self.faults)]
        self._turn += 1
        try:
            self._inject(fault)
            self.done[fault] += 1
        except Exception as exc:  # the tool keeps going; the table says what failed
            self.failed[f"{fault}: {type(exc).__name__}"] += 1

    def _inject(self, fault: str) -> None:
        if fault == "script-flush":
            self.redis.script_flush()
        elif fault == "client-kill":
            for client in self.redis.client_list():
                if client.get("name", "").startswith(self.client_prefix):
                    self.redis.client_kill_filter(_id=client["id"])
        elif fault == "restart":
            assert self.server is not None
            self.commands.end(self.redis)
            self.downtime += self.server.crash_and_restart()
            self.redis.connection_pool.disconnect()
            self.commands.begin(self.redis)
