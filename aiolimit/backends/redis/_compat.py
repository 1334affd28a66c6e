"""What depends on the client library: redis-py's exception classes and, when it is installed,
valkey-py's (its fork), so that a RedisBackend accepts either library's asyncio client; hash
slots; telling a cluster client from a single-node one."""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from typing import Any

from redis import exceptions as redis_errors
from redis.crc import key_slot

__all__ = [
    "ANY",
    "AUTH",
    "LOST",
    "NOT_SERVING",
    "NO_PERMISSION",
    "NO_SCRIPT",
    "UNREACHABLE",
    "buffered",
    "check_client",
    "is_cluster",
    "node_of",
    "server_of",
    "slot",
    "text_of",
]

AUTH: tuple[type[BaseException], ...] = (
    redis_errors.AuthenticationError,
    redis_errors.AuthenticationWrongNumberOfArgsError,
)
"""The server wants credentials, or refused the ones given (NOAUTH, WRONGPASS, a wrong AUTH).
redis-py makes its AuthenticationError a ConnectionError: check this first."""
NO_PERMISSION: tuple[type[BaseException], ...] = (redis_errors.NoPermissionError,)
"""The ACL refused the command, a key or a channel (NOPERM)."""
NO_SCRIPT: tuple[type[BaseException], ...] = (redis_errors.NoScriptError,)
"""The server does not have the script (``SCRIPT FLUSH``, a restart, a failover)."""
LOST: tuple[type[BaseException], ...] = (redis_errors.ConnectionError,)
"""The connection was lost (killed, reset, refused): the round trip may be sent again."""


def text_of(value: Any) -> str:
    """A reply's element as text (bytes without ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def buffered(connection: Any) -> bool:
    """Whether more has come in on an asyncio ``connection`` than was read yet: redis-py 8's
    ``can_read``, ``can_read_destructive`` before it (and in valkey-py). Neither waits."""
    can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
    return bool(await can_read())


UNREACHABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)
"""No server answered in time."""
NOT_SERVING: tuple[type[BaseException], ...] = (
    redis_errors.ReadOnlyError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.OutOfMemoryError,
)
"""Error replies of a server that cannot serve now, whatever the call (a replica or a cluster
in a failover, a slot moving, no memory left). The client library takes their code (READONLY,
CLUSTERDOWN, MASTERDOWN, TRYAGAIN, OOM) off the message."""
ANY: tuple[type[BaseException], ...] = (
    redis_errors.RedisError,
    redis_errors.RedisClusterException,
)
"""Every error the client library raises."""
try:
    from valkey import exceptions as valkey_errors
except ImportError:  # pragma: no cover - valkey-py is optional
    pass
else:
    AUTH += (
        valkey_errors.AuthenticationError,
        valkey_errors.AuthenticationWrongNumberOfArgsError,
    )
    NO_SCRIPT += (valkey_errors.NoScriptError,)
    NO_PERMISSION += (valkey_errors.NoPermissionError,)
    LOST += (valkey_errors.ConnectionError,)
    UNREACHABLE += (valkey_errors.ConnectionError, valkey_errors.TimeoutError)
    NOT_SERVING += (
        valkey_errors.ReadOnlyError,
        valkey_errors.ClusterDownError,
        valkey_errors.TryAgainError,
        valkey_errors.OutOfMemoryError,
    )
    ANY += (valkey_errors.ValkeyError, valkey_errors.ValkeyClusterException)


def check_client(redis: Any) -> None:
    """Refuses what is not an asyncio client, saying what to pass: a URL (which
    ``RedisBackend.from_url`` takes) or a synchronous client, whose calls would fail only
    later and obscurely ("object list can't be used in 'await' expression")."""
    if isinstance(redis, (str, bytes)):
        raise TypeError(
            f"RedisBackend takes a redis.asyncio client, not a URL ({redis!r}): "
            "RedisBackend.from_url(url) makes one (or pass redis.asyncio.Redis.from_url(url))"
        )
    execute = getattr(type(redis), "execute_command", None)
    if execute is not None and not inspect.iscoroutinefunction(execute):
        kind = f"{type(redis).__module__}.{type(redis).__qualname__}"
        raise TypeError(
            f"RedisBackend takes a redis.asyncio client, not a synchronous {kind}: pass "
            "redis.asyncio.Redis(...) (or valkey.asyncio's), or RedisBackend.from_url(url)"
        )


def slot(key: str | bytes) -> int:
    """The cluster hash slot of ``key`` (0-16383)."""
    found: int = key_slot(key if isinstance(key, bytes) else key.encode())
    return found


def is_cluster(redis: Any) -> bool:
    """Whether ``redis`` is a cluster client (redis-py's or valkey-py's ``RedisCluster``)."""
    return hasattr(redis, "get_node_from_key")


def node_of(redis: Any, key: str) -> Hashable:
    """The node that serves ``key``: None for a single-node client (one server); a cluster
    client's ``host:port``, or the key's hash slot while the client does not know the node."""
    if not is_cluster(redis):
        return None
    try:
        return str(redis.get_node_from_key(key).name)
    except Exception:  # (no slots map yet, or a library that says it otherwise)
        return slot(key)


def server_of(redis: Any) -> Hashable:
    """The server a client talks to, as its connection pool was given it (host, port, socket
    path, database); the client itself when it says none (a cluster client)."""
    where = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", None)
    if isinstance(where, dict) and (where.get("host") or where.get("path")):
        return tuple(str(where.get(key)) for key in ("host", "port", "path", "db"))
    return id(redis)
