"""Looking inside live limiters on a Redis server: the one place that reads their keys for
the command line (``aiolimit inspect``, ``watch``; ``list`` finds the names: ``glob.py``).

Key names come from ``Keys`` (docs/redis-layout.md), the config from
``RedisBackend.get_config`` and permits available from ``available_permits``, so this keeps
reading correctly whatever the scripts store; what it reads directly (the value key, the
permits ZSET, the clients registry) it reads defensively: state it cannot read counts as
none. An OVERALL token bucket or fixed window has no state key: its state is a field of the
config hash, counted in the config's memory. A block's time left is the backend's
(``block(name, None)`` reads it). Every command here is read-only, and in the least-privilege
ACL line of docs/deployments.md.

>>> snapshot = await inspect_limiter(backend, "partner-api")
>>> state = await budget_state(backend, "partner-api", config, since_us)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from ..._types import Rate, RateLimiterConfig, RateType
from ..._values import US
from ..._values import seconds as to_seconds
from ...backends._protocol import parse_member, parse_value
from ...backends.memory import GROUPS, state_in_config
from ...backends.redis import RedisBackend
from ...backends.redis._compat import is_cluster
from ...backends.redis._keys import Keys

__all__ = [
    "Budget",
    "BudgetNow",
    "Client",
    "Reservations",
    "Snapshot",
    "add_reservations",
    "budget_json",
    "budget_state",
    "config_json",
    "inspect_limiter",
]

CLIENTS_READ = 1000
"""PER_CLIENT clients read at most (the most recent in the registry)."""
_RESERVATIONS_READ = 10_000  # reservations whose permits are summed, at most


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Reservations:
    """Grants scored after now: callers (in any process) sleeping until their slot."""

    count: int = 0
    permits: int = 0
    furthest_s: float = 0.0
    """How far ahead the last reserved slot starts, in seconds."""
    partial: bool = False
    """More than could be summed: ``permits`` counts only the first ones."""


@dataclass
class Budget:
    """One budget's state: the limiter's (OVERALL) or one client's (PER_CLIENT)."""

    grants: int = 0
    """Grants made since the config's generation began (the value key's sequence number)."""
    state: bool = False
    """Whether the budget has state of the config's generation (a grant not forgotten)."""
    reservations: Reservations = field(default_factory=Reservations)
    started: int = 0
    """Grants whose slot started after ``budget_state``'s ``since_us``, up to now, that its
    log still holds: a reservation counts when its slot comes, not when it is made, and a
    grant handed back (a caller cancelled, or sent behind a block to queue again) not at all."""


class BudgetNow(NamedTuple):
    """What ``budget_state`` read, and when."""

    now_us: int
    """The server's clock when it was read."""
    gen: str
    """The generation of the limiter's state ("-": none); ``set-rate`` starts a new one."""
    budget: Budget


@dataclass
class Client:
    """A PER_CLIENT client, as ``inspect`` shows it."""

    client_id: str
    available: int
    reserved: int
    grants: int
    last_grant_ago_s: float


@dataclass
class Snapshot:
    """What ``aiolimit inspect`` shows, read at one moment (``now_us``, the server's TIME)."""

    name: str
    config: RateLimiterConfig
    now_us: int
    ttl_s: float | None
    """Seconds until the config expires (``keep_alive`` or ``expire()``); None: never."""
    available: int | None
    """Permits a request could take now (OVERALL; None for PER_CLIENT: each client's own)."""
    budget: Budget
    """The OVERALL budget, or the PER_CLIENT clients' summed."""
    clients_registered: int = 0
    clients_read: int = 0
    clients_with_state: int = 0
    busiest: list[Client] = field(default_factory=list)
    memory_bytes: int | None = None
    """MEMORY USAGE summed over the keys read (None: the server refused MEMORY USAGE)."""
    memory_keys: int = 0
    blocked_s: float | None = None
    """Seconds until the limiter's block ends (``block()``); None: it is not blocked."""
    ceiling: tuple[Rate, ...] | None = None
    """The ceiling of a rate learned from a partner (``Learner``): the config's rates are
    the learned ones; None: not learned."""
    margin_s: float | None = None
    """The fleet's measured margin (seconds): every interval is read that much longer; None:
    none kept."""
    slot: int = 0
    node: str = ""

    @property
    def per_client(self) -> bool:
        return self.config.rate_type is RateType.PER_CLIENT

    @property
    def in_window(self) -> int | None:
        """Permits taken of the tightest rate (granted in its window, reservations
        included; the rate itself once none is left); None for PER_CLIENT, and while a
        block holds every permit back."""
        if self.available is None or self.blocked_s is not None:
            return None
        return self.config.max_permits - self.available

    @property
    def keeps_a_log(self) -> bool:
        """Whether the algorithm keeps grants (a sliding window's log), so that grants and
        reservations can be counted; a token bucket or fixed windows keep a few numbers."""
        return GROUPS[self.config.algorithm].logs_grants

    def as_json(self) -> dict[str, Any]:
        """What ``inspect --json`` prints: only the fields that exist for the algorithm."""
        shown: dict[str, Any] = {
            "name": self.name,
            "config": {**config_json(self.config), "expires_in_s": self.ttl_s},
            "available": self.available,
            "blocked_s": self.blocked_s,
            "margin_s": self.margin_s,
            "learned": None
            if self.ceiling is None
            else {"ceiling": [str(rate) for rate in self.ceiling]},
        }
        if self.keeps_a_log:
            shown.update(budget_json(self.budget))
        shown["clients"] = None if not self.per_client else self._clients_json()
        shown["memory"] = {"bytes": self.memory_bytes, "keys": self.memory_keys}
        shown["slot"], shown["node"] = self.slot, self.node
        return shown

    def _clients_json(self) -> dict[str, Any]:
        busiest = [vars(client) for client in self.busiest]
        if not self.keeps_a_log:
            busiest = [{"client_id": c["client_id"], "available": c["available"]} for c in busiest]
        return {
            "registered": self.clients_registered,
            "read": self.clients_read,
            "with_state": self.clients_with_state,
            "busiest": busiest,
        }


def config_json(config: RateLimiterConfig) -> dict[str, Any]:
    """A config as ``inspect --json`` prints it."""
    return {
        "rates": [str(rate) for rate in config.rates],
        "algorithm": config.algorithm.value,
        "type": config.rate_type.value,
        "keep_alive_s": config.keep_alive and config.keep_alive.total_seconds(),
        "min_spacing_s": config.min_spacing and config.min_spacing.total_seconds(),
    }


def budget_json(budget: Budget) -> dict[str, Any]:
    """A log's grants and reservations as ``inspect --json`` prints them."""
    ahead = budget.reservations
    return {
        "grants": budget.grants,
        "reservations": {
            "count": ahead.count,
            "permits": ahead.permits,
            "furthest_s": ahead.furthest_s,
        },
    }


async def inspect_limiter(
    backend: RedisBackend, name: str, *, clients: int = CLIENTS_READ, busiest: int = 5
) -> Snapshot | None:
    """Everything ``aiolimit inspect`` shows about ``name``; None when it has no config."""
    config = await backend.get_config(name)
    if config is None:
        return None
    redis = backend.redis
    keys = backend.keys(name)
    (now_us, gen), ttl_ms = await asyncio.gather(_now_and_gen(redis, keys), redis.pttl(keys.config))
    snapshot = Snapshot(
        name=name,
        config=config,
        now_us=now_us,
        ttl_s=ttl_ms / 1000 if ttl_ms is not None and ttl_ms >= 0 else None,
        available=None,
        budget=Budget(),
        slot=backend.slot(name),
        node=_node(redis, keys.config),
    )
    blocked_us = await backend.block(name, None)
    snapshot.blocked_s = to_seconds(blocked_us) if blocked_us > 0 else None
    snapshot.ceiling = await backend.learned(name)
    (margin,) = await redis.hmget(keys.config, "margin")
    snapshot.margin_s = None if margin is None else to_seconds(int(margin))
    memory_keys = [keys.config]
    if config.rate_type is RateType.OVERALL:
        snapshot.available = await backend.available_permits(name)
        if not state_in_config(config):  # (counters keep theirs in the config hash)
            snapshot.budget = await _budget(redis, keys.value, keys.permits, gen, now_us)
            memory_keys += [keys.value, keys.permits]
    else:
        read = await _clients(backend, snapshot, gen, clients, busiest)
        memory_keys += [keys.registry, *keys.clients(read)]
    if GROUPS[config.algorithm].logs_grants:  # a log per rate: the others' keys too
        budget_keys = memory_keys[1:] if config.rate_type is RateType.OVERALL else memory_keys[2:]
        for i in range(2, len(config.rates) + 1):
            memory_keys += [keys.for_rate(key, i) for key in budget_keys]
    snapshot.memory_bytes, snapshot.memory_keys = await _memory(redis, memory_keys)
    return snapshot


async def budget_state(
    backend: RedisBackend, name: str, config: RateLimiterConfig, since_us: int | None = None
) -> BudgetNow:
    """The grants and reservations of a limiter now (PER_CLIENT: its clients' summed, over
    the most recent :data:`CLIENTS_READ`), for ``aiolimit watch``; with ``since_us`` (the
    server's clock), the grants started since then too, read from the log of the longest
    rate (it holds a grant longest: one interval from its start)."""
    redis = backend.redis
    keys = backend.keys(name)
    now_us, gen = await _now_and_gen(redis, keys)
    if not GROUPS[config.algorithm].logs_grants:
        return BudgetNow(now_us, gen, Budget())  # the counters keep no grants to count
    if config.rate_type is RateType.OVERALL:
        logs = [(keys.value, keys.permits)]
    else:
        ids = await _recent_clients(redis, keys.registry, CLIENTS_READ)
        logs = [(keys.client_value(c), keys.client_permits(c)) for c, _ in ids]
    budgets = await asyncio.gather(*(_budget(redis, v, p, gen, now_us) for v, p in logs))
    total = Budget()
    for budget in budgets:
        total.grants += budget.grants
        total.state = total.state or budget.state
        add_reservations(total.reservations, budget.reservations)
    if since_us is not None:
        longest = max(range(len(config.rates)), key=lambda i: config.rates[i].interval_us) + 1
        started = await asyncio.gather(
            *(
                redis.zcount(keys.for_rate(permits, longest), f"({since_us}", now_us)
                for (_, permits), budget in zip(logs, budgets, strict=True)
                if budget.state  # (a log of another generation is dead)
            )
        )
        total.started = sum(int(count) for count in started)
    return BudgetNow(now_us, gen, total)


async def _now_and_gen(redis: Any, keys: Keys) -> tuple[int, str]:
    """The server's clock (us) and the generation its config gives client state ("-": none)."""
    (seconds, micros), (gen,) = await asyncio.gather(redis.time(), redis.hmget(keys.config, "gen"))
    return int(seconds) * US + int(micros), _text(gen) if gen is not None else "-"


def add_reservations(total: Reservations, more: Reservations) -> None:
    """Adds ``more`` to ``total``: reservations of several budgets (clients, shards)."""
    total.count += more.count
    total.permits += more.permits
    total.furthest_s = max(total.furthest_s, more.furthest_s)
    total.partial = total.partial or more.partial


async def _budget(
    redis: Any, value_key: str, permits_key: str, gen: str, now_us: int, log: bool = True
) -> Budget:
    """A budget's grant count (its value key) and reservations (its permits ZSET, members
    scored after now); state of another generation is dead, so counts as none. Without a
    ``log`` (a token bucket's or fixed windows' client), only whether it has state."""
    raw = await redis.get(value_key)
    if raw is None:
        return Budget()
    if not log:
        return Budget(state=_text(raw).split(" ", 1)[0] == gen)
    try:
        state_gen, _used, seq, _cursor = parse_value(_text(raw))
    except ValueError:
        return Budget()  # a value this version cannot read: not counted
    if state_gen != gen:
        return Budget()
    budget = Budget(grants=seq, state=True)
    ahead = budget.reservations
    ahead.count = int(await redis.zcount(permits_key, f"({now_us}", "+inf"))
    if ahead.count:
        reserved = await redis.zrangebyscore(
            permits_key, f"({now_us}", "+inf", start=0, num=_RESERVATIONS_READ, withscores=True
        )
        for member, score in reserved:
            try:
                ahead.permits += parse_member(_text(member))[0]
            except ValueError:
                continue
            ahead.furthest_s = max(ahead.furthest_s, to_seconds(score - now_us))
        ahead.partial = ahead.count > len(reserved)
    return budget


async def _recent_clients(redis: Any, registry: str, most: int) -> list[tuple[str, float]]:
    """The ``most`` clients with the latest grants: (client id, latest grant in µs)."""
    # ZRANGE by rank from the end (not ZREVRANGE): in the least-privilege ACL line.
    reply = list(await redis.execute_command("ZRANGE", registry, -most, -1, "WITHSCORES"))
    if reply and isinstance(reply[0], (list, tuple)):  # RESP3: pairs
        reply = [item for pair in reply for item in pair]
    return [
        (_text(client), float(score)) for client, score in zip(reply[::2], reply[1::2], strict=True)
    ]


async def _clients(
    backend: RedisBackend, snapshot: Snapshot, gen: str, most: int, busiest: int
) -> list[str]:
    """Reads the ``most`` most recent clients into ``snapshot``; returns their ids."""
    redis = backend.redis
    name = snapshot.name
    keys = backend.keys(name)
    snapshot.clients_registered = int(await redis.zcard(keys.registry))
    recent = await _recent_clients(redis, keys.registry, most)
    snapshot.clients_read = len(recent)
    ids = [client for client, _ in recent]
    now_us, log = snapshot.now_us, snapshot.keeps_a_log
    budgets, available = await asyncio.gather(
        asyncio.gather(
            *(
                _budget(redis, keys.client_value(c), keys.client_permits(c), gen, now_us, log)
                for c in ids
            )
        ),
        asyncio.gather(*(backend.with_client(c).available_permits(name) for c in ids)),
    )
    rows = []
    for (client, last_us), budget, left in zip(recent, budgets, available, strict=True):
        snapshot.budget.grants += budget.grants
        add_reservations(snapshot.budget.reservations, budget.reservations)
        if budget.state:
            snapshot.clients_with_state += 1
            rows.append(
                Client(
                    client,
                    left,
                    budget.reservations.permits,
                    budget.grants,
                    max(0.0, to_seconds(snapshot.now_us - last_us)),
                )
            )
    rows.sort(key=lambda row: (row.available - row.reserved, -row.grants))
    snapshot.busiest = rows[:busiest]
    return ids


async def _memory(redis: Any, keys: list[str]) -> tuple[int | None, int]:
    """MEMORY USAGE summed over the keys that exist, and how many do; None when refused."""
    try:
        sizes = await asyncio.gather(*(redis.memory_usage(key) for key in keys))
    except ResponseError:  # NOPERM: a user without +memory|usage; or a server without it
        return None, 0
    present = [size for size in sizes if size is not None]
    return sum(present), len(present)


def _node(redis: Any, key: str) -> str:
    """host:port of the server holding ``key``."""
    if is_cluster(redis):
        node = redis.get_node_from_key(key)
        return f"{node.host}:{node.port}"
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
