"""The Redis commands a limiter sends, and the least-privilege ACL user that may send them
(docs/deployments.md, ``aiolimit acl``). ``tests/test_acl.py`` reads the Lua scripts and the
modules that send commands and fails when one sends a command missing here; it runs every
operation as this user, on redis-server and Valkey, and finds no refusal in the ACL log."""

from __future__ import annotations

import re

__all__ = [
    "ADMIN_COMMANDS",
    "CLIENT_COMMANDS",
    "COMMANDS",
    "FUNCTION_COMMANDS",
    "NEWER",
    "SCRIPT_COMMANDS",
    "acl_rules",
    "acl_setuser",
]

SCRIPT_COMMANDS = (
    "del", "exists", "get", "hdel", "hgetall", "hmget", "hset", "lpush", "persist", "pexpire",
    "pexpireat", "pttl", "publish", "rename", "set", "time", "type", "unlink", "zadd", "zcard",
    "zcount", "zrange", "zrangebyscore", "zrem", "zremrangebyrank", "zremrangebyscore",
    "zrevrangebyscore", "zscore",
)  # fmt: skip
"""What the scripts (``lua/*.lua``) call: Redis checks a script's commands against the ACL."""

FUNCTION_COMMANDS = ("fcall", "function|load")
"""The scripts as a Redis Functions library (``_functions``): loaded once, then called.
Without them the scripts go with EVALSHA (``_wire``)."""

CLIENT_COMMANDS = (
    *FUNCTION_COMMANDS,
    "evalsha",  # the scripts without Redis Functions (``_script``)
    "eval",  # a script the server lacks (SCRIPT FLUSH, a restart, a failover)
    "hget",  # a block, read after sleeping out a reservation (``_scripts.BLOCKED_UNTIL``)
    "hgetall",  # the config (``_scripts.CONFIG``)
    "hmget",  # a concurrency limiter's limit (``_lease_scripts.CONFIG``)
    "blpop",  # a process's wake list, while it has waiters on a concurrency limiter (cluster)
    "subscribe",  # a process's wake channels, while it has waiters on concurrency limiters,
    # and the refund channels of the limiters its paced callers wait for (``_refunds``)
    "unsubscribe",
    "lpop",  # the wake-ups published while a channel was not subscribed, read once it is
    "zrange",  # a PER_CLIENT limiter's clients (``_scripts.CLIENTS``)
    # redis-py and valkey-py name their library on each new connection (Redis >= 7.2,
    # Valkey); refused, it is ignored, but every connection adds a refusal to the ACL log.
    "client|setinfo",
)
"""What the backend sends itself."""

ADMIN_COMMANDS = (
    "get", "hmget", "memory|usage", "pttl", "scan", "time", "zcard", "zcount", "zrange",
    "zrangebyscore",
)  # fmt: skip
"""What ``aiolimit inspect``, ``list`` and ``watch`` read (``_tools/admin/reading.py``)
besides the backend's own operations."""

COMMANDS = tuple(sorted({*CLIENT_COMMANDS, *SCRIPT_COMMANDS, *ADMIN_COMMANDS}))
"""Every command a limiter and the admin commands send, lower case, sorted."""

NEWER = {"fcall": (7, 0), "function|load": (7, 0), "client|setinfo": (7, 2)}
"""The commands older servers lack, with the version that has them (as a server's INFO gives
``redis_version``: Valkey 8 says 7.2). ``ACL SETUSER`` refuses a whole line that names a
command the server does not know; without them, a limiter works all the same (EVALSHA; no
library name on its connections)."""


def acl_rules(
    prefix: str = "aiolimit:", password: str = "PASSWORD", server: tuple[int, int] | None = None
) -> list[str]:
    """The rules of ``ACL SETUSER`` for a user that may send :data:`COMMANDS` to the keys and
    channels of ``prefix`` (its glob characters escaped; the channels: concurrency limiters'
    wake-ups, rate limiters' refunds), and nothing else; for a ``server`` version (say
    ``(7, 0)``), without the commands it lacks (:data:`NEWER`)."""
    key_pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"
    access = ["on", f">{password}", "resetkeys", f"~{key_pattern}", "resetchannels"]
    access += [f"&{key_pattern}", "-@all"]
    known = [c for c in COMMANDS if server is None or NEWER.get(c, (0, 0)) <= server]
    return [*access, *(f"+{command}" for command in known)]


def acl_setuser(
    user: str = "limiter",
    prefix: str = "aiolimit:",
    password: str = "PASSWORD",
    server: tuple[int, int] | None = None,
) -> str:
    """The ``ACL SETUSER`` command that makes the limiter's user (:func:`acl_rules`)."""
    return " ".join(["ACL", "SETUSER", user, *acl_rules(prefix, password, server)])
