"""The Redis backend: key layout, script loading and error mapping. The algorithm is in lua/."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import re
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from importlib import resources
from typing import Any, Literal, TypeVar

from redis import exceptions as redis_errors
from redis.crc import key_slot

from .._types import RateLimiterConfig, RateType, check_text, clock_micros
from ..errors import BackendError, InvalidArgumentError, NotConfiguredError
from .base import Attempt, Backend, SetMode

__all__ = ["RedisBackend"]


Clock = Literal["server", "client"] | Callable[[], float]

# Exception classes of redis-py and, when it is installed, of valkey-py (its fork): a
# RedisBackend accepts either library's asyncio client.
_NO_SCRIPT: tuple[type[BaseException], ...] = (redis_errors.NoScriptError,)
_LOST: tuple[type[BaseException], ...] = (redis_errors.ConnectionError,)
_UNREACHABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)
_ANY: tuple[type[BaseException], ...] = (
    redis_errors.RedisError,
    redis_errors.RedisClusterException,
)
try:
    from valkey import exceptions as valkey_errors
except ImportError:  # pragma: no cover - valkey-py is optional
    pass
else:
    _NO_SCRIPT += (valkey_errors.NoScriptError,)
    _LOST += (valkey_errors.ConnectionError,)
    _UNREACHABLE += (valkey_errors.ConnectionError, valkey_errors.TimeoutError)
    _ANY += (valkey_errors.ValkeyError, valkey_errors.ValkeyClusterException)

# PER_CLIENT clients handled by one retire.lua or refresh.lua call: well under 1 ms of server
# time (about four commands each), so that no call holds Redis long.
_CLIENTS_PER_CALL = 100

# Pauses before sending a round trip again after a lost connection: at once (a killed
# connection), then long enough to ride out a server restart of a few hundred ms.
_RECONNECT_PAUSES = (0.0, 0.02, 0.1, 0.3)
# How long after a round trip's first lost connection it may still be sent again. redis-py
# retries a lost connection itself (10 times over about 4 s with Redis() defaults), so
# resending without a bound multiplies its time to give up; with it, a down server is
# reported about as soon as the client itself reports it.
_RESEND_FOR = 1.0
_IN_FLIGHT = 2  # round trips one Redis client may have in flight at once
# Acquire requests per acquire_many call. A script blocks the whole server while it runs;
# 64 requests keep one call well under a millisecond, while sharing a call still saves
# nearly all the per-call cost.
_MANY = 64
_SECOND = 16  # requests waiting that justify a second round trip in flight

Key = str | bytes


def _slot(key: Key) -> int:
    slot: int = key_slot(key if isinstance(key, bytes) else key.encode())
    return slot


class _Script:
    """One operation's Lua (lib.lua + the operation), run with EVALSHA, EVAL on NOSCRIPT;
    or, with ``command``, a plain read-only command that shares round trips the same way."""

    __slots__ = ("command", "name", "sha", "source")

    def __init__(self, name: str, command: bool = False) -> None:
        self.name = name
        self.command = command
        self.source = self.sha = ""
        if not command:
            lua = resources.files("aiolimit") / "lua"
            self.source = (lua / "lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()
            self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    @property
    def what(self) -> str:
        return self.name if self.command else f"the {self.name} script"


_SCRIPTS = {
    name: _Script(name)
    for name in (
        "acquire",
        "acquire_many",
        "available",
        "release",
        "set_rate",
        "delete",
        "expire",
        "clear_expire",
        "retire",
        "refresh",
    )
}


_ZRANGE = _Script("ZRANGE", command=True)
_HGETALL = _Script("HGETALL", command=True)
_ACQUIRE = _SCRIPTS["acquire"]
_ACQUIRE_MANY = _SCRIPTS["acquire_many"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _escape_tag(name: str) -> str:
    # Braces would end or nest the hash tag; '%' is escaped so the mapping stays one-to-one.
    # NUL (only in shard names) is escaped to keep keys readable: "{api%00shard0}".
    return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D").replace("\x00", "%00")


class _Keys:
    """Every key of one limiter; all share the hash tag ``{<name>}``, hence one cluster slot."""

    __slots__ = ("_budgets", "config", "permits", "registry", "tag", "value")

    def __init__(self, prefix: str, name: str) -> None:
        # A name that does not encode fails here, in its caller's call, never in a round trip
        # it would share with others.
        self.tag = f"{prefix}{{{_escape_tag(check_text(name, 'name'))}}}"
        self.config = f"{self.tag}:config"
        self.value = f"{self.tag}:value"
        self.permits = f"{self.tag}:permits"
        self.registry = f"{self.tag}:clients"
        # Encoded once: the hot path hands redis-py bytes it need not encode again.
        self._budgets: dict[tuple[RateType, str, bool], tuple[bytes, ...]] = {}

    def client_value(self, client_id: str) -> str:
        return f"{self.value}:{client_id}"

    def client_permits(self, client_id: str) -> str:
        return f"{self.permits}:{client_id}"

    def budget(
        self, rate_type: RateType, client_id: str, registry: bool = False
    ) -> tuple[bytes, ...]:
        """The keys of one budget: config, value, permits (and the registry, if asked)."""
        keys = self._budgets.get((rate_type, client_id, registry))
        if keys is None:
            if rate_type is RateType.PER_CLIENT:
                names = [self.config, self.client_value(client_id), self.client_permits(client_id)]
                names += [self.registry] if registry else []
            else:
                names = [self.config, self.value, self.permits]
            keys = tuple(name.encode() for name in names)
            if len(self._budgets) < 8:
                self._budgets[(rate_type, client_id, registry)] = keys
        return keys

    def retired(self, token: str) -> str:
        """Where the clients registry goes when every client's state is cleared."""
        return f"{self.tag}:retired:{token}"

    def receipt(self, token: str) -> str:
        """A release's receipt, which makes the release safe to send twice."""
        return f"{self.tag}:released:{token}"

    def clients(self, client_ids: Sequence[str]) -> list[str]:
        """The value key and permits ZSET of each client, in order."""
        keys = []
        for client in client_ids:
            keys += [self.client_value(client), self.client_permits(client)]
        return keys


class _Request:
    __slots__ = ("args", "future", "keys", "orphan", "script")

    def __init__(
        self,
        script: _Script,
        keys: Sequence[Key],
        args: Sequence[Any],
        future: asyncio.Future[Any],
        orphan: Callable[[Any], None] | None,
    ) -> None:
        self.script = script
        # Encoded now, in the caller's own call: a key or argument that cannot be sent fails
        # that caller alone, never the round trip its request would share with others.
        self.keys = tuple(map(_encoded, keys))
        self.args = [_encoded(arg) for arg in args]
        self.future = future
        self.orphan = orphan  # called with the reply if the caller was cancelled meanwhile


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


class _Call:
    """One script call in a pipeline, answering one request or (acquire_many) several."""

    __slots__ = ("args", "keys", "requests", "script")

    def __init__(self, script: _Script, requests: list[_Request]) -> None:
        self.script = script
        self.requests = requests
        if len(requests) == 1:
            self.keys: list[Any] = list(requests[0].keys)
            self.args: list[Any] = list(requests[0].args)
        else:
            # acquire_many: each budget's keys once; a request names where its keys start.
            self.keys = []
            self.args = []
            starts: dict[tuple[Key, ...], int] = {}
            for r in requests:
                start = starts.get(r.keys)
                if start is None:
                    start = starts[r.keys] = len(self.keys) + 1
                    self.keys.extend(r.keys)
                self.args.append(b"%d %s" % (start, r.args[0]))

    def settle(self, reply: Any) -> None:
        if len(self.requests) == 1 or isinstance(reply, BaseException):
            for request in self.requests:
                _settle(request, reply)
        else:
            # acquire_many answers with one string, a line per request: cheap to parse.
            lines = reply.split(b"\n" if isinstance(reply, bytes) else "\n")
            for request, one in zip(self.requests, lines, strict=True):
                _settle(request, one)


class _Coalescer:
    """Shares round trips between concurrent script calls on one Redis client.

    When nothing is in flight a call goes out at once. While a round trip is in flight,
    further calls queue, and all of them go together in the next one: acquire
    requests as ``acquire_many`` calls of up to ``_MANY`` requests (per cluster slot),
    anything else as its own EVALSHA, all in one pipeline. Each caller still gets its own
    result or error, and with a ``timeout`` stops waiting for it after that many seconds.
    """

    __slots__ = ("__weakref__", "_cluster", "_pumps", "_queue", "_redis")

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._cluster = hasattr(redis, "get_node_from_key")
        self._queue: list[_Request] = []
        self._pumps: set[asyncio.Task[None]] = set()

    async def call(
        self,
        script: _Script,
        keys: Sequence[Key],
        args: Sequence[Any],
        orphan: Callable[[Any], None] | None = None,
        timeout: float | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Request(script, keys, args, future, orphan))
        # Round trips run in tasks of their own, so a cancelled caller never cuts a reply in
        # half (nor waits on redis-py's cancelled write): its reply goes to `orphan`, which
        # hands back a grant. A second round trip may start while one is in flight once
        # enough requests wait, so this process prepares the next batch while Redis runs the
        # last one.
        if not self._pumps or (len(self._pumps) < _IN_FLIGHT and len(self._queue) >= _SECOND):
            self._pumps.add(loop.create_task(self._send_queued()))
        if timeout is None:
            return await future
        # A caller that stops waiting is a cancelled caller: its future is done, so the reply,
        # when it comes, goes to `orphan` as a cancelled caller's does (a grant is handed
        # back). The round trip itself runs on in its task.
        timer = loop.call_later(timeout, _give_up, future, script, timeout)
        try:
            return await future
        finally:
            timer.cancel()

    async def _send_one(self, script: _Script, keys: Sequence[Key], args: Sequence[Any]) -> Any:
        if script.command:
            return await self._redis.execute_command(script.name, *keys, *args)
        try:
            return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except _NO_SCRIPT:
            # The script cache was flushed (or this node never saw it): EVAL caches it again.
            return await self._redis.eval(script.source, len(keys), *keys, *args)

    async def _send_queued(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._send_batch(self._calls(batch))
        except BaseException as exc:
            for request in self._queue:
                _settle(request, exc)
            self._queue = []
            raise
        finally:
            # Leave at once (not in a done callback), so a call arriving next starts a pump.
            self._pumps.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]

    def _calls(self, batch: list[_Request]) -> list[_Call]:
        calls: list[_Call] = []
        acquires: dict[Any, list[_Request]] = {}
        for request in batch:
            if request.script is _ACQUIRE:
                slot = _slot(request.keys[0]) if self._cluster else None
                acquires.setdefault(slot, []).append(request)
            else:
                calls.append(_Call(request.script, [request]))
        for group in acquires.values():
            # One script blocks the whole server while it runs: a few calls of at most _MANY
            # requests each let Redis serve other clients in between.
            for i in range(0, len(group), _MANY):
                part = group[i : i + _MANY]
                calls.append(_Call(_ACQUIRE_MANY if len(part) > 1 else _ACQUIRE, part))
        return calls

    async def _send_batch(self, calls: list[_Call]) -> None:
        loop = asyncio.get_running_loop()
        first_failure: float | None = None
        for pause in (*_RECONNECT_PAUSES, None):
            sent = loop.time()
            try:
                replies = await self._round_trip(calls)
            except _LOST as exc:
                now = loop.time()
                first_failure = now if first_failure is None else first_failure
                # Sent again only if, taking as long as this attempt took (redis-py's own
                # retries included), it ends within _RESEND_FOR of the first failure.
                resend = now + (pause or 0.0) + (now - sent) <= first_failure + _RESEND_FOR
                # A killed or reset connection, or a server restarting: the pool hands out a
                # fresh connection. Sending again is safe: every script is (a lost acquire
                # reply may have consumed permits, it never grants twice; a release carries
                # a receipt).
                if pause is not None and resend:
                    await asyncio.sleep(pause)
                    continue
                error: BaseException = exc
            except BaseException as exc:
                error = exc
            else:
                for call, reply in zip(calls, replies, strict=True):
                    call.settle(reply)
                return
            # The whole round trip failed: every caller in it gets the error.
            for call in calls:
                call.settle(error)
            if not isinstance(error, Exception):
                raise error
            return

    async def _round_trip(self, calls: list[_Call]) -> list[Any]:
        if len(calls) == 1:
            call = calls[0]
            try:
                return [await self._send_one(call.script, call.keys, call.args)]
            except _LOST:
                raise
            except _ANY as exc:
                return [exc]
        replies = await self._pipeline(calls, [False] * len(calls))
        # After SCRIPT FLUSH, a restart or a failover every EVALSHA of the pipeline fails.
        # Send again, each script's source once per slot (that loads it on the node) and
        # EVALSHA after it; then, for whatever still fails, the source every time.
        for everything in (False, True):
            retry = [i for i, r in enumerate(replies) if isinstance(r, _NO_SCRIPT)]
            if not retry:
                break
            loaded: set[tuple[str, int | None]] = set()
            loads = []
            for i in retry:
                call = calls[i]
                where = (call.script.name, _slot(call.keys[0]) if self._cluster else None)
                loads.append(everything or where not in loaded)
                loaded.add(where)
            again = await self._pipeline([calls[i] for i in retry], loads)
            for i, reply in zip(retry, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, calls: list[_Call], loads: list[bool]) -> list[Any]:
        """Sends ``calls`` in one pipeline, a script with EVAL where ``loads`` says so."""
        pipe = self._redis.pipeline(transaction=False)
        for c, load in zip(calls, loads, strict=True):
            # execute_command: cluster pipelines refuse the evalsha()/eval() helpers.
            if c.script.command:
                pipe.execute_command(c.script.name, *c.keys, *c.args)
            elif load:
                pipe.execute_command("EVAL", c.script.source, len(c.keys), *c.keys, *c.args)
            else:
                pipe.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args)
        return list(await pipe.execute(raise_on_error=False))


def _give_up(future: asyncio.Future[Any], script: _Script, timeout: float) -> None:
    if not future.done():
        future.set_exception(
            BackendError(f"no reply from Redis within {timeout} s ({script.what})")
        )


def _settle(request: _Request, reply: Any) -> None:
    future = request.future
    if future.done():  # the caller was cancelled
        if request.orphan is not None and not isinstance(reply, BaseException):
            request.orphan(reply)
    elif isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)


_K = TypeVar("_K")
_V = TypeVar("_V")
_REMEMBERED = 10_000  # limiters a backend keeps keys and rate types of


class _Recent(dict[_K, _V]):
    """A dict that forgets its oldest entry (dicts keep insertion order) once it holds
    _REMEMBERED: a process may use any number of limiter names over its life, and what is
    kept per name is only a cache."""

    __slots__ = ()

    def __setitem__(self, key: _K, value: _V) -> None:
        if len(self) >= _REMEMBERED and key not in self:
            del self[next(iter(self))]
        super().__setitem__(key, value)


# What a Lua error carries besides its reason: the script position and SHA (Redis 7, Valkey)
# or the function and position (Redis 6). The reasons our own scripts give start 'aiolimit: '.
_LUA_NOISE = re.compile(
    r"^(?:ERR )?(?:Error running script \(call to f_[0-9a-f]+\): )?(?:@?user_script:\d+: )*"
    r"|\s*script: [0-9a-f]+, on @?user_script:\d+\.?\s*$"
)


def _server_reason(message: str) -> str:
    """A server's error message in plain words, without a script's position or SHA."""
    return _LUA_NOISE.sub("", message).strip() or message


# One coalescer per Redis client object, shared by every backend on that client.
_coalescers: weakref.WeakKeyDictionary[Any, _Coalescer] = weakref.WeakKeyDictionary()


def _coalescer(redis: Any) -> _Coalescer:
    pipe = _coalescers.get(redis)
    if pipe is None:
        pipe = _coalescers[redis] = _Coalescer(redis)
    return pipe


class RedisBackend(Backend):
    """Limiter state in Redis (or Valkey), shared by every process that uses the same server.

    >>> from redis.asyncio import Redis
    >>> backend = RedisBackend(Redis.from_url("redis://localhost:6379"))
    >>> limiter = RateLimiter("partner-api", backend)

    ``client_id`` names this client's budget for ``PER_CLIENT`` limiters (default: random per
    backend). ``clock="server"`` (default) stamps grants with the server's ``TIME``, so skewed
    client clocks cannot over-admit; ``clock="client"`` sends this host's wall clock instead,
    for deployments that refuse ``TIME`` in scripts (a callable returning seconds also works).
    ``prefix`` is put in front of every key (no braces: the hash tag follows it).

    ``timeout`` (seconds, default 5) bounds how long each call waits for Redis's reply; then
    it raises ``BackendError`` ("no reply from Redis within 5.0 s"). The round trip itself
    runs on: a grant it makes for a caller that gave up is handed back, as a cancelled
    caller's is. ``None`` (or ``math.inf``) leaves only redis-py's own timeouts.
    """

    __slots__ = ("_clock", "_keys", "_pipe", "_prefix", "_redis", "_timeout", "_types")

    def __init__(
        self,
        redis: Any,
        *,
        client_id: str | None = None,
        clock: Clock = "server",
        prefix: str = "aiolimit:",
        timeout: float | None = 5.0,
    ) -> None:
        super().__init__(client_id)
        if not isinstance(prefix, str) or "{" in prefix or "}" in prefix:
            raise InvalidArgumentError(f"prefix must be a str without braces, not {prefix!r}")
        if prefix:
            check_text(prefix, "prefix")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise InvalidArgumentError(f"timeout must be seconds > 0 or None, not {timeout!r}")
        if clock == "client":
            clock = time.time
        elif clock != "server" and not callable(clock):
            raise InvalidArgumentError(
                f"clock must be 'server', 'client' or a callable, not {clock!r}"
            )
        self._redis = redis
        self._pipe = _coalescer(redis)
        self._clock: Callable[[], float] | None = None if clock == "server" else clock
        self._prefix = prefix
        self._timeout = None if timeout is None or timeout == math.inf else float(timeout)
        self._keys: _Recent[str, _Keys] = _Recent()
        # The rate type each limiter had when last seen, to pass only the keys a call touches.
        self._types: _Recent[str, RateType] = _Recent()

    def with_client(self, client_id: str) -> RedisBackend:
        other = RedisBackend(
            self._redis, client_id=client_id, prefix=self._prefix, timeout=self._timeout
        )
        other._clock = self._clock
        return other

    @property
    def timeout(self) -> float | None:
        """How long each call waits for Redis's reply, in seconds (None: no limit of ours)."""
        return self._timeout

    @property
    def redis(self) -> Any:
        """The Redis client this backend runs on."""
        return self._redis

    def keys(self, name: str) -> _Keys:
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = _Keys(self._prefix, name)
        return keys

    def _now_arg(self) -> str:
        # A reading that is NaN, infinite or not a number raises InvalidArgumentError here.
        return "" if self._clock is None else str(clock_micros(self._clock()))

    async def _run(
        self,
        script: _Script,
        keys: Sequence[Key],
        args: Sequence[Any],
        orphan: Callable[[Any], None] | None = None,
    ) -> Any:
        try:
            return await self._pipe.call(script, keys, args, orphan, self._timeout)
        except _ANY as exc:
            raise self._error(script, exc) from exc

    def _error(self, script: _Script, exc: BaseException) -> BackendError:
        if isinstance(exc, _UNREACHABLE):
            return BackendError(f"Redis is unreachable or timed out ({script.what}): {exc}")
        return self._refused(script, _server_reason(str(exc)))

    def _refused(self, script: _Script, message: str, name: str | None = None) -> BackendError:
        """The error for a call Redis refused, or (with ``name``) for a request the script
        itself reported as failed."""
        if self._clock is None and _rejects_time(message):
            return BackendError(
                f"the Redis server refused the TIME command in {script.what} "
                f"({message}); use RedisBackend(..., clock='client') to stamp grants with "
                "this host's clock instead"
            )
        if name is None:
            return BackendError(f"Redis refused {script.what}: {message}")
        return BackendError(f"{script.what} failed for {name!r}: {message}")

    async def _budget_call(
        self,
        name: str,
        script: _Script,
        args: Callable[[RateType], list[Any]],
        extra_keys: Sequence[Key] = (),
    ) -> list[Any]:
        """Runs a script on this client's budget, learning the limiter's rate type as needed."""
        keys = self.keys(name)
        rate_type = self._types.get(name, RateType.OVERALL)
        for _ in range(2):
            budget = keys.budget(rate_type, self.client_id, script is _ACQUIRE)
            orphan = functools.partial(self._hand_back, name) if script is _ACQUIRE else None
            reply = await self._run(script, (*budget, *extra_keys), args(rate_type), orphan)
            if script is _ACQUIRE:
                reply = _text(reply).split(" ", 1) if reply[:2] in (b"-5", "-5") else reply.split()
            code = int(reply[0])
            if code == -1:
                raise NotConfiguredError(name)
            if code == -5:
                raise self._refused(script, _text(reply[1]), name)
            if code != -3:
                self._types[name] = rate_type
                return list(reply)
            rate_type = RateType(_text(reply[1]))
        raise BackendError(f"the rate type of {name!r} keeps changing")  # pragma: no cover

    def _hand_back(self, name: str, reply: Any) -> None:
        """Hands back the exact grant of an acquire whose caller was cancelled mid-call."""
        fields = reply.split()
        if fields[0] in (b"0", "0"):
            self.hand_back(name, _text(fields[4]))

    # -- operations ----------------------------------------------------------------------------

    async def try_acquire(self, name: str, permits: int, max_wait: int = 0) -> Attempt:
        reply = await self._budget_call(
            name,
            _ACQUIRE,
            lambda rate_type: [
                f"{permits} {self._now_arg() or '-'} {max_wait} {rate_type.value} {self.client_id}"
                if rate_type is RateType.PER_CLIENT
                else f"{permits} {self._now_arg() or '-'} {max_wait} {rate_type.value}"
            ],
        )
        code = int(reply[0])
        if code == 0:
            return Attempt(True, int(reply[3]), int(reply[1]), int(reply[2]), _text(reply[4]))
        if code == 1:
            return Attempt(False, int(reply[1]), int(reply[2]), int(reply[3]))
        if code == -4:
            raise BackendError(
                f"limiter {name!r} cannot queue {permits} more permits: its log would hold "
                "more than 2**53, which the scripts cannot count exactly"
            )
        raise InvalidArgumentError(f"permits ({permits}) exceed the rate ({int(reply[1])})")

    async def available_permits(self, name: str) -> int:
        reply = await self._budget_call(
            name, _SCRIPTS["available"], lambda rate_type: [self._now_arg(), rate_type.value]
        )
        return max(int(reply[1]), 0)

    async def release(self, name: str, permits: int, grant: str | None = None) -> int:
        # A fresh receipt per call: the script remembers it, so a resend releases nothing more.
        receipt = self.keys(name).receipt(uuid.uuid4().hex)
        reply = await self._budget_call(
            name,
            _SCRIPTS["release"],
            lambda rate_type: [permits, self._now_arg(), rate_type.value, grant or ""],
            (receipt,),
        )
        return int(reply[1])

    async def _clients(self, registry: str, start: int) -> list[str]:
        end = start + _CLIENTS_PER_CALL - 1
        return [_text(c) for c in await self._run(_ZRANGE, (registry,), (start, end))]

    async def _retire(self, keys: _Keys, retired: str) -> None:
        """Removes the state of every client of a retired registry, a chunk per call. Each
        call removes its chunk from the registry, and nothing adds to it: this ends."""
        while clients := await self._clients(retired, 0):
            await self._run(
                _SCRIPTS["retire"], [keys.config, retired, *keys.clients(clients)], clients
            )

    async def _refresh(self, keys: _Keys) -> None:
        """Gives every client in the registry the TTLs the config gives it, a chunk per call.
        Clients that join meanwhile get them from their own grants."""
        start = 0
        while clients := await self._clients(keys.registry, start):
            await self._run(
                _SCRIPTS["refresh"],
                [keys.config, keys.registry, *keys.clients(clients)],
                [self._now_arg(), *clients],
            )
            if len(clients) < _CLIENTS_PER_CALL:
                return
            start += len(clients)

    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        keys = self.keys(name)
        generation = uuid.uuid4().hex
        written, follow = await self._run(
            _SCRIPTS["set_rate"],
            (keys.config, keys.value, keys.permits, keys.registry, keys.retired(generation)),
            (
                mode,
                config.rate_type.value,
                config.rate,
                config.interval_us,
                config.keep_alive_us,
                "1" if keep_state else "0",
                self._now_arg(),
                generation,
            ),
        )
        if written:
            self._types[name] = config.rate_type
        if follow == 1:
            await self._refresh(keys)
        elif follow == 2:
            await self._retire(keys, keys.retired(generation))
        return bool(written)

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        fields = await self._run(_HGETALL, (self.keys(name).config,), ())
        if not fields:
            return None
        config = (
            {_text(k): _text(v) for k, v in fields.items()}
            if isinstance(fields, dict)
            else {_text(fields[i]): _text(fields[i + 1]) for i in range(0, len(fields), 2)}
        )
        keep_alive = int(config.get("keep_alive", "0"))
        rate_type = RateType(config["type"])
        self._types[name] = rate_type
        return RateLimiterConfig(
            rate_type,
            int(config["rate"]),
            timedelta(microseconds=int(config["interval"])),
            timedelta(microseconds=keep_alive) if keep_alive else None,
        )

    async def delete(self, name: str) -> bool:
        self._types.pop(name, None)
        keys = self.keys(name)
        retired = keys.retired(uuid.uuid4().hex)
        existed, follow = await self._run(
            _SCRIPTS["delete"], (keys.config, keys.value, keys.permits, keys.registry, retired), ()
        )
        if follow:
            await self._retire(keys, retired)
        return bool(existed)

    async def expire(self, name: str, ttl_us: int) -> bool:
        keys = self.keys(name)
        ttl_ms = -(-ttl_us // 1000)
        found = await self._run(
            _SCRIPTS["expire"],
            (keys.config, keys.value, keys.permits, keys.registry),
            (ttl_ms, self._now_arg()),
        )
        if found:
            await self._refresh(keys)
        return bool(found)

    async def clear_expire(self, name: str) -> bool:
        keys = self.keys(name)
        had_ttl = await self._run(
            _SCRIPTS["clear_expire"], (keys.config, keys.value, keys.permits), (self._now_arg(),)
        )
        await self._refresh(keys)
        return bool(had_ttl)


def _rejects_time(message: str) -> bool:
    return "refused TIME in a script" in message
