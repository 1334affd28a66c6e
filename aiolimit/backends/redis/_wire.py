"""How a round trip reaches Redis: the commands of one round trip, in one write.

On a plain redis-py (or valkey-py) asyncio client, the commands are packed here (they are
bytes already: the coalescer encodes every request as it is made) and written to a pooled
connection in one ``send_packed_command``, and the replies read back in order with its
``read_response``: redis-py's pipeline would encode every argument again and keep a command
stack, callbacks and per-call bookkeeping that a round trip of scripts has no use for. Only
the connection's public methods, so its library keeps doing what they do: health checks, the
socket timeout (and its relaxing during a maintenance, redis-py 8), RESP3 push messages,
(re)connecting; writing to its stream and reading its parser directly saved too little to be
worth depending on redis-py's private attributes (docs/benchmarks.md). The pool and the
client's retry policy are kept too (a lost connection is retried as a pipeline's would be,
and the connection dropped). Any other client (a cluster, a single-connection client, a
subclass or a stand-in) gets the same commands through its own ``execute_command`` and
``pipeline``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from ._compat import ANY, LOST, NO_SCRIPT, slot
from ._request import Call

__all__ = ["Wire"]

log = logging.getLogger("aiolimit")

_REPLY_ERRORS: tuple[type[BaseException], ...] = (redis_errors.ResponseError,)
"""An error reply: read whole, so the connection stays in step."""
_PLAIN: tuple[type, ...] = (Redis,)
try:
    from valkey import exceptions as valkey_errors
    from valkey.asyncio import Valkey
except ImportError:  # pragma: no cover - valkey-py is optional
    pass
else:
    _REPLY_ERRORS += (valkey_errors.ResponseError,)
    _PLAIN += (Valkey,)


def _plain(redis: Any) -> bool:
    """Whether ``redis`` is a client whose pool this module may write to directly."""
    return (
        type(redis) in _PLAIN
        and not getattr(redis, "single_connection_client", False)
        and hasattr(redis, "connection_pool")
    )


def _packed(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """``commands`` in the Redis protocol (RESP), as one buffer. Their keys and arguments are
    bytes already; only a command's name and counts are converted here. The bytes after a
    command's head (FCALL, its function, the key count) are packed by C code alone: their
    bulk-string headers looked up (not formatted) and everything joined with CRLF, so a
    round trip of 32 requests costs no Python step per key or argument."""
    out: list[bytes] = []
    add = out.append
    for command in commands:
        add(b"*%d\r\n" % len(command))
        head = 0
        for arg in command:  # (the head: the few arguments that are not bytes)
            if arg.__class__ is bytes:
                break
            add(_bulk(arg))
            head += 1
        rest = command[head:]
        if not rest:
            continue
        parts: list[bytes] = [*rest, *rest]
        try:
            parts[0::2] = map(_HEADERS.__getitem__, map(len, rest))
            parts[1::2] = rest
            add(b"\r\n".join(parts))
        except (TypeError, IndexError):  # a long or a non-bytes argument further on
            for arg in rest:
                add(_bulk(arg))
            continue
        add(b"\r\n")
    return b"".join(out)


_HEADED = 512
_HEADERS = [b"$%d" % size for size in range(_HEADED)]  # a bulk string's header, its CRLF apart


def _bulk(arg: Any) -> bytes:
    """One argument as a RESP bulk string (a str encoded, an int written out)."""
    data = arg if arg.__class__ is bytes else arg.encode() if isinstance(arg, str) else b"%d" % arg
    return b"$%d\r\n%b\r\n" % (len(data), data)


class _Connections:
    """Round trips written straight to connections of one client's pool. A connection that
    served a round trip is kept for the next one while round trips keep coming (the
    coalescer calls :meth:`rest` when none is under way or waiting): taking one from
    redis-py's pool and giving it back costs more than a small round trip's own work. Not
    from a pool whose callers wait for a free connection (``BlockingConnectionPool``): a
    connection kept from it could keep them waiting for a whole burst."""

    __slots__ = ("_bare", "_keep", "_kept", "_pool")

    def __init__(self, redis: Any) -> None:
        self._pool = redis.connection_pool
        self._bare = True  # get_connection() without a command name (redis-py >= 5.3)
        self._keep = not any(
            kind.__name__ == "BlockingConnectionPool" for kind in type(self._pool).__mro__
        )
        self._kept: list[Any] = []

    async def _connection(self) -> Any:
        if self._kept:
            return self._kept.pop()
        if self._bare:
            try:
                return await self._pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                self._bare = False
        return await self._pool.get_connection("EVALSHA")

    async def exchange(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Writes ``commands`` at once and reads their replies; an error reply is that
        command's reply. A lost connection is retried as the client's retry policy says."""
        packed = _packed(commands)
        connection = await self._connection()

        async def once() -> list[Any]:
            await connection.send_packed_command(packed)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response())
                except _REPLY_ERRORS as exc:
                    replies.append(exc)
            return replies

        async def drop(error: BaseException) -> None:
            await connection.disconnect()

        try:
            replies: list[Any] = await connection.retry.call_with_retry(once, drop)
        except BaseException:
            await asyncio.shield(self._pool.release(connection))
            raise
        if self._keep:
            self._kept.append(connection)
        else:
            await asyncio.shield(self._pool.release(connection))
        return replies

    async def rest(self) -> None:
        """Gives the kept connections back to the pool."""
        kept, self._kept = self._kept, []
        for connection in kept:
            await asyncio.shield(self._pool.release(connection))


async def _through_client(redis: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The client's own way: one command alone, several in a pipeline."""
    if len(commands) == 1:
        try:
            return [await redis.execute_command(*commands[0])]
        except LOST:
            raise
        except ANY as exc:
            return [exc]
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        # execute_command: cluster pipelines refuse the evalsha()/eval() helpers.
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


def _function_missing(reply: Any) -> bool:
    """Whether ``reply`` says the server lacks the function called (FUNCTION FLUSH, a
    restart without persistence)."""
    return isinstance(reply, _REPLY_ERRORS) and "function not found" in str(reply).lower()


class Wire:
    """Sends the calls of a round trip on one client: a script as FCALL of the library of every
    script where the server has Redis Functions and lets this client load them (``_functions``),
    else with EVALSHA, loading the script where the server lacks it."""

    __slots__ = ("_cluster", "_connections", "_functions", "_redis")

    def __init__(self, redis: Any, cluster: bool) -> None:
        self._redis = redis
        self._cluster = cluster
        self._connections = _Connections(redis) if _plain(redis) else None
        # Whether calls go as FCALL: None until the library was offered to the server. Only on
        # a plain client (a cluster would need the library on every master).
        self._functions: bool | None = None if self._connections is not None else False

    async def rest(self) -> None:
        """No round trip is under way or waiting: the connections kept between round trips
        go back to the client's pool."""
        if self._connections is not None:
            await self._connections.rest()

    async def _send(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._connections is not None:
            return await self._connections.exchange(commands)
        return await _through_client(self._redis, commands)

    async def _load(self, library: str) -> bool:
        """Offers the library to the server; whether calls may go as FCALL from now on."""
        assert self._connections is not None
        (reply,) = await self._connections.exchange([("FUNCTION", "LOAD", library)])
        loaded = not isinstance(reply, _REPLY_ERRORS) or "already exists" in str(reply)
        if not loaded:  # Redis 6, or an ACL without FUNCTION LOAD: EVALSHA it is
            log.debug("Redis Functions not used (%s): scripts go with EVALSHA", reply)
        self._functions = loaded
        return loaded

    async def round_trip(self, calls: Sequence[Call]) -> list[Any]:
        """The replies to ``calls``, in order (an error reply as its exception). Raises
        only when the whole round trip failed (a lost connection, say)."""
        if self._functions is None:
            library = next((call.library for call in calls if call.library), None)
            if library is not None:
                await self._load(library)
        functions = bool(self._functions)
        replies = await self._send([call.command(functions=functions) for call in calls])
        if functions:
            await self._function_again(calls, replies)
        await self._script_again(calls, replies)
        return replies

    async def _function_again(self, calls: Sequence[Call], replies: list[Any]) -> None:
        """Loads the library again where the server lost it, and sends those calls again
        (with EVAL, loading each script, if the server no longer takes the library)."""
        retry = [i for i, r in enumerate(replies) if _function_missing(r)]
        if not retry:
            return
        log.debug("FCALL: function not found: loading the library again for %d calls", len(retry))
        library = calls[retry[0]].library
        functions = library is not None and await self._load(library)
        commands = [calls[i].command(load=not functions, functions=functions) for i in retry]
        for i, reply in zip(retry, await self._send(commands), strict=True):
            replies[i] = reply

    async def _script_again(self, calls: Sequence[Call], replies: list[Any]) -> None:
        # After SCRIPT FLUSH, a restart or a failover every EVALSHA fails. Send again, each
        # script's source once per slot (that loads it on the node) and EVALSHA after it;
        # then, for whatever still fails, the source every time.
        for everything in (False, True):
            retry = [i for i, r in enumerate(replies) if isinstance(r, NO_SCRIPT)]
            if not retry:
                break
            log.debug("NOSCRIPT: sending %d calls again with their sources", len(retry))
            loaded: set[tuple[str, int | None]] = set()
            commands = []
            for i in retry:
                call = calls[i]
                where = (call.name, slot(call.keys[0]) if self._cluster else None)
                commands.append(call.command(everything or where not in loaded))
                loaded.add(where)
            again = await self._send(commands)
            for i, reply in zip(retry, again, strict=True):
                replies[i] = reply
