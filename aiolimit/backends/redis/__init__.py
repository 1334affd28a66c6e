"""The Redis backend: the operations, each a script (``lua/``) run through the shared round
trips of ``_coalescer``, its reply decoded by ``_scripts``, and every failure mapped to a
:class:`~aiolimit.LimiterError`. The key layout is in ``_keys``, what depends on the client
library in ``_compat``."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import Any, TypeVar, cast

from ..._breaker import BreakerPolicy
from ..._types import Rate, RateLimiterConfig, RateType
from ..._values import Duration, clock_micros, millis_up
from ...errors import BackendError, InvalidArgumentError, LimiterError, NotConfiguredError
from .. import _margin
from .._context import StoreContext
from .._learning import Event, Law, Learned
from .._protocol import FORESEE, check_settle, check_sync, format_rates, new_life, parse_grant
from ..base import Backend, Grant, Refusal, SetMode, Settlement, Started
from . import _scripts as scripts
from ._coalescer import Key
from ._compat import ANY, check_client, node_of, server_of, slot
from ._errors import call_error, trouble_error
from ._keys import Keys
from ._leases import RedisLeases, end_wake_ups
from ._refunds import channel_of, origin, watch
from ._registry import refresh_clients, retire_clients
from ._request import Sent
from ._scripts import TROUBLE, Follow, NotConfigured, OtherType, Trouble, decoded
from ._server import Clock, Server

__all__ = ["RedisBackend"]

R = TypeVar("R")
_PER_CLIENT = RateType.PER_CLIENT  # (read off its class, a member costs a lookup a call)


class RedisBackend(RedisLeases, Backend):
    """Limiter state in Redis (or Valkey), shared by every process that uses the same server.

    >>> from redis.asyncio import Redis
    >>> backend = RedisBackend(Redis.from_url("redis://localhost:6379"))
    >>> limiter = RateLimiter("partner-api", backend)

    ``client_id`` names this client's budget for ``PER_CLIENT`` limiters (default: random per
    backend). ``clock="server"`` (default) stamps grants with the server's ``TIME``, so skewed
    client clocks cannot over-admit; ``clock="client"`` sends this host's wall clock instead,
    for deployments that refuse ``TIME`` in scripts (a callable returning seconds also works).
    ``prefix`` is put in front of every key (no braces: the hash tag follows it).

    ``timeout`` (seconds or timedelta, default 5) bounds how long each call waits for
    Redis's reply; then it raises ``BackendError`` ("no reply from Redis within 5.0 s"). The
    round trip itself runs on: a grant it makes for a caller that gave up is handed back, as
    a cancelled caller's is. ``None`` (or ``math.inf``) leaves only redis-py's own timeouts.
    Backends on one client share its round trips, each call still under its own timeout.

    ``breaker``: the back-offs of its limiters' circuit breakers
    (:class:`~aiolimit.BreakerPolicy`; after an outage, calls fail at once for a while).

    ``redis`` is an asyncio client (``redis.asyncio.Redis``, ``RedisCluster``, valkey-py's);
    a URL or a synchronous client is refused with a TypeError: for a URL, use
    :meth:`from_url`. The client stays open after :meth:`aclose`: it is yours
    (``close_client=True`` hands it to the backend, which closes it then, as for
    :meth:`from_url`'s).
    """

    __slots__ = (
        "_clock",
        "_deadlines",
        "_keys",
        "_now",
        "_owned",
        "_pipe",
        "_prefix",
        "_redis",
        "_server",
        "_types",
    )

    def __init__(
        self,
        redis: Any,
        *,
        client_id: str | None = None,
        clock: Clock = "server",
        prefix: str = "aiolimit:",
        timeout: Duration | None = 5.0,
        breaker: BreakerPolicy | None = None,
        close_client: bool = False,
    ) -> None:
        check_client(redis)
        context = StoreContext(breaker)
        self._open(client_id, context, Server.of(redis, clock, prefix, timeout))
        self._owned = close_client  # (aclose() closes the client too: from_url's own)

    def _open(self, client_id: str | None, context: StoreContext, server: Server) -> None:
        """Sets up a backend on ``server`` with the store's ``context``: a new store's first,
        or a view of it (which shares both)."""
        super().__init__(client_id, context=context)
        self._server = server
        self._owned = False  # (from_url: its client is closed with it; never a view's)
        # (each also an attribute of its own: the hot path reads them)
        self._redis, self._pipe, self._clock = server.redis, server.pipe, server.clock
        self._prefix, self._deadlines = server.prefix, server.deadlines
        self._keys, self._types = server.keys, server.types
        self._now: Callable[[], str] | None = None if self._clock is None else self._now_arg

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        client_id: str | None = None,
        clock: Clock = "server",
        prefix: str = "aiolimit:",
        timeout: Duration | None = 5.0,
        breaker: BreakerPolicy | None = None,
        **options: Any,
    ) -> RedisBackend:
        """A backend on a ``redis.asyncio.Redis`` client it makes from ``url``
        (``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]``, ``rediss://`` for TLS,
        ``unix://PATH``) with ``options`` (``socket_connect_timeout=2``, ``client_name=...``:
        what ``Redis.from_url`` takes), and closes with :meth:`aclose`. The other keywords
        are the backend's own, as in the constructor. For a cluster, make the
        ``RedisCluster`` yourself and pass it.

        >>> backend = RedisBackend.from_url("redis://:s3cret@localhost:6379/0")
        >>> ...
        >>> await backend.aclose()                       # closes the client too
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str such as 'redis://localhost:6379', not {url!r}")
        from redis.asyncio import Redis

        backend = cls(
            Redis.from_url(url, **options),
            client_id=client_id,
            clock=clock,
            prefix=prefix,
            timeout=timeout,
            breaker=breaker,
            close_client=True,
        )
        return backend

    def with_client(self, client_id: str) -> RedisBackend:
        view = RedisBackend.__new__(RedisBackend)
        view._open(client_id, self.context, self._server)
        return view

    @property
    def store_id(self) -> Hashable:
        """The server (its address and database, as the client was given them) and the key
        prefix; a client that names no address (a cluster client) is its own store."""
        return (server_of(self._redis), self._prefix)

    @property
    def timeout(self) -> float | None:
        """How long each call waits for Redis's reply, in seconds (None: no limit of ours)."""
        return None if self._deadlines is None else self._deadlines.timeout

    @property
    def redis(self) -> Any:
        """The Redis client this backend runs on."""
        return self._redis

    async def aclose(self) -> None:
        """Waits for the store's background work (:meth:`Backend.aclose`); closes the client
        only when :meth:`from_url` made it."""
        await end_wake_ups(self._redis)
        await super().aclose()
        if self._owned:
            self._owned = False
            await self._redis.aclose()

    def keys(self, name: str) -> Keys:
        """Every key of the limiter ``name`` (docs/redis-layout.md)."""
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = Keys(self._prefix, name)
        return keys

    def slot(self, name: str) -> int:
        return slot(self.keys(name).tag)

    def clock_of(self, name: str) -> Hashable:
        # clock='client': each limiter's own (the latest time any client sent); else TIME's node
        return name if self._clock is not None else node_of(self._redis, self.keys(name).config)

    def _now_arg(self) -> str:
        # A reading that is NaN, infinite or not a number raises InvalidArgumentError here.
        return "" if self._clock is None else str(clock_micros(self._clock()))

    # -- running scripts, and what their failures say ----------------------------------------

    async def _run(
        self,
        script: scripts.Script[R] | scripts.ReadCommand[R],
        keys: Sequence[Key],
        args: Sequence[Any],
        orphan: Callable[[Any], None] | None = None,
    ) -> R:
        try:
            reply = await self._pipe.submit(script, keys, args, orphan, self._deadlines)
        except ANY as exc:
            raise self._error(script.what, exc) from exc
        return decoded(script, reply)

    async def _budget_call(
        self,
        name: str,
        script: scripts.Script[R | Trouble],
        args: Callable[[RateType], list[Any]],
        *,
        permits: int = 0,
        registry: bool = False,
        extra_keys: Sequence[Key] = (),
        orphan: Callable[[Any], None] | None = None,
        sent: tuple[asyncio.Future[Any], RateType] | None = None,
    ) -> R:
        """Runs a script on this client's budget (with the clients registry if asked),
        learning the limiter's rate type as needed; ``sent``: its request made already
        (:meth:`_submit`), with the rate type it assumed. (The hot path: _run's two steps are
        written out here, one coroutine fewer per call.)"""
        known = self._types.get(name)
        if sent is None:
            rate_type = RateType.OVERALL if known is None else known
            future = self._submit(name, script, args, rate_type, registry, extra_keys, orphan)
        else:
            future, rate_type = sent
        for _ in range(2):
            try:
                raw = await future
            except ANY as exc:
                raise self._error(script.what, exc) from exc
            try:
                reply = script.decode(raw)
            except (ValueError, LookupError, TypeError):  # (decoded() written out)
                reply = decoded(script, raw)  # raises the BackendError that says so
            if reply.__class__ in TROUBLE:
                if isinstance(reply, OtherType):
                    rate_type = reply.rate_type
                    future = self._submit(
                        name, script, args, rate_type, registry, extra_keys, orphan
                    )
                    continue
                raise self._trouble(script.what, name, permits, cast(Trouble, reply))
            if known is not rate_type:
                self._types[name] = rate_type
            return reply  # type: ignore[return-value]  # (no Trouble: a cast without its call)
        raise BackendError(  # pragma: no cover
            f"the rate type of {name!r} keeps changing", outage=False
        )

    def _submit(
        self,
        name: str,
        script: scripts.Script[Any],
        args: Callable[[RateType], list[Any]],
        rate_type: RateType,
        registry: bool,
        extra_keys: Sequence[Key],
        orphan: Callable[[Any], None] | None,
    ) -> asyncio.Future[Any]:
        """Makes a budget script's request now (for the round trip under way or the next)."""
        if rate_type is _PER_CLIENT and self._random_id:
            self.per_client_used(name)
        keys = self._keys.get(name) or self.keys(name)
        budget = keys.budget(rate_type, self.client_id, registry)
        keys_sent = (*budget, *extra_keys) if extra_keys else budget
        return self._pipe.submit(script, keys_sent, args(rate_type), orphan, self._deadlines)

    def _trouble(self, what: str, name: str, permits: int, trouble: Trouble) -> LimiterError:
        return trouble_error(what, name, permits, trouble, self._clock is None)

    def _error(self, what: str, exc: BaseException) -> BackendError:
        return call_error(what, exc, self._clock is None)

    # -- operations ----------------------------------------------------------------------------

    def try_acquire(  # (a coroutine function in all but name: one frame fewer per call)
        self, name: str, permits: int, max_wait_us: int | None = 0
    ) -> Coroutine[Any, Any, Grant | Refusal]:
        call = scripts.AcquireCall(name, permits, max_wait_us, self.client_id, self._now, self)
        return self._budget_call(
            name, scripts.ACQUIRE, call, permits=permits, registry=True, orphan=call.hand_back
        )

    def start_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Started:
        return self._start(name, permits, max_wait_us)

    def start_foresee(self, name: str, permits: int) -> Started:
        return self._start(name, permits, FORESEE)  # (an acquire request that takes nothing)

    def _start(self, name: str, permits: int, max_wait: int | str | None) -> Started:
        """An acquire request (max wait ``FORESEE``: a foresight) made now, awaited later."""
        call = scripts.AcquireCall(name, permits, max_wait, self.client_id, self._now, self)
        known = self._types.get(name)
        rate_type = RateType.OVERALL if known is None else known
        orphan = call.hand_back
        future = self._submit(name, scripts.ACQUIRE, call, rate_type, True, (), orphan)
        answer: Coroutine[Any, Any, Grant | Refusal] = self._budget_call(
            name, scripts.ACQUIRE, call, permits=permits, registry=True, orphan=orphan,
            sent=(future, rate_type),
        )  # fmt: skip
        return Sent(answer, future, orphan)

    async def wait_time(self, name: str, permits: int) -> int:
        return await self._budget_call(
            name,
            scripts.WAIT,
            lambda rate_type: [permits, self._now_arg(), rate_type.value],
            permits=permits,
        )

    async def available_permits(self, name: str) -> int:
        left = await self._budget_call(
            name, scripts.AVAILABLE, lambda rate_type: [self._now_arg(), rate_type.value]
        )
        return max(left, 0)

    async def block(self, name: str, duration_us: int | None) -> int:
        return await self._block(name, "-" if duration_us is None else duration_us)

    async def unblock(self, name: str) -> bool:
        return await self._block(name, "clear") > 0

    async def blocked_until(self, name: str) -> int | None:
        keys = (self.keys(name).config,)
        return await self._run(scripts.BLOCKED_UNTIL, keys, ("blocked_until",))

    async def _block(self, name: str, what: int | str) -> int:
        # block.lua: sets (us), reads ('-') or clears ('clear') the block; the time left.
        left = await self._run(scripts.BLOCK, (self.keys(name).config,), (what, self._now_arg()))
        if isinstance(left, NotConfigured):
            raise NotConfiguredError(name)
        assert isinstance(left, int)
        return left

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        # The receipt the script remembers, so that a resend releases nothing more: the
        # grant's own name (a client's own for PER_CLIENT), or a fresh one per call.
        if member is not None:
            parse_grant(member)  # (InvalidArgumentError, here rather than in the script)
        fresh = secrets.token_hex(8)

        def args(rate_type: RateType) -> list[Any]:
            receipt = fresh if member is None else member
            if member is not None and rate_type is RateType.PER_CLIENT:
                receipt = f"{member} {self.client_id}"
            sender = origin(self._redis, self.client_id, rate_type)
            return [permits, self._now_arg(), rate_type.value, member or "", receipt, sender]

        return await self._budget_call(
            name,
            scripts.RELEASE,
            args,
            permits=permits,
            extra_keys=(self.keys(name).receipts,),
        )

    async def settle(self, name: str, member: str, permits: int, *, kept: int = 0) -> Settlement:
        return await self._settle(name, member, check_settle(member, permits), (), kept)

    async def settle_and_sync(
        self,
        name: str,
        member: str,
        permits: int,
        remaining: int,
        reset_us: int,
        *,
        kept: int = 0,
    ) -> Settlement:
        permits = check_settle(member, permits)
        floor = check_sync(remaining, reset_us)
        return await self._settle(name, member, permits, floor, kept)

    async def _settle(
        self,
        name: str,
        member: str,
        permits: int,
        floor: tuple[int, int] | tuple[()],
        kept: int,
    ) -> Settlement:
        """settle.lua: the settle, then with ``floor`` (remaining, reset µs) the sync."""

        def args(rate_type: RateType) -> list[Any]:
            receipt = member  # (release's receipt for the grant: see settle.lua)
            if rate_type is RateType.PER_CLIENT:
                receipt = f"{member} {self.client_id}"
            sender = origin(self._redis, self.client_id, rate_type)
            now = self._now_arg()
            told = [sender, max(int(kept), 0)]
            return [member, permits, now, rate_type.value, receipt, self.client_id, *told, *floor]

        return await self._budget_call(
            name, scripts.SETTLE, args, registry=True, extra_keys=(self.keys(name).receipts,)
        )

    def watch_refunds(self, name: str, heard: Callable[[int], None]) -> Callable[[], None] | None:
        mine = origin(self._redis, self.client_id, RateType.OVERALL)
        channel = channel_of(self.keys(name))
        return watch(self._redis, channel, mine, heard, self.context.tasks)

    async def sync(self, name: str, remaining: int, reset_us: int) -> None:
        remaining, reset_us = check_sync(remaining, reset_us)
        await self._budget_call(
            name,
            scripts.SYNC,
            lambda rate_type: [
                remaining,
                reset_us,
                self._now_arg(),
                rate_type.value,
                self.client_id,
            ],
            registry=True,
        )

    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        keys = self.keys(name)
        generation = new_life()  # (short: every budget of the config and every grant names it)
        reply = await self._run(
            scripts.SET_RATE,
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
                config.algorithm.value,
                format_rates(config) if len(config.rates) > 1 else "",
                config.min_spacing_us,
                "" if config.max_debt is None else config.max_debt,
            ),
        )
        if reply.written:
            self._types[name] = config.rate_type
        if reply.follow is Follow.REFRESH:
            await refresh_clients(self._run, self._now_arg, keys)
        elif reply.follow is Follow.RETIRE:
            await retire_clients(self._run, self._now_arg, keys, keys.retired(generation))
        return reply.written

    async def learn(
        self,
        name: str,
        event: Event,
        value: int | None,
        per: int | None,
        ceiling: tuple[Rate, ...] | None,
        law: Law,
    ) -> Learned:
        keys = self.keys(name)
        ceiling_text = (
            "" if not ceiling else ",".join(f"{r.permits}:{r.interval_us}" for r in ceiling)
        )
        reply = await self._run(
            scripts.LEARN,
            (keys.config, keys.value, keys.permits, keys.learned),
            (
                event,
                "" if value is None else value,
                "" if per is None else per,
                self._now_arg(),
                ceiling_text,
                *law,
            ),
        )
        if isinstance(reply, scripts.NotConfigured):
            raise NotConfiguredError(name)
        if isinstance(reply, scripts.OtherShape):
            raise InvalidArgumentError(
                f"the ceiling's intervals are not the stored config's ({reply.detail}): set "
                "the rate to the ceiling first"
            )
        return reply

    async def margin(self, name: str, late_us: int | None) -> int:
        keys = self.keys(name)
        reply = await self._run(
            scripts.MARGIN,
            (keys.config, keys.value, keys.permits),
            ("" if late_us is None else late_us, self._now_arg(), *_margin.LAW),
        )
        if isinstance(reply, scripts.NotConfigured):
            raise NotConfiguredError(name)
        return reply

    async def learned(self, name: str) -> tuple[Rate, ...] | None:
        return await self._run(scripts.LEARNED, (self.keys(name).learned,), ("ceiling",))

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        config = await self._run(scripts.CONFIG, (self.keys(name).config,), ())
        if config is not None:
            self._types[name] = config.rate_type
        return config

    async def delete(self, name: str) -> bool:
        self._types.pop(name, None)
        keys = self.keys(name)
        retired = keys.retired(secrets.token_hex(16))
        reply = await self._run(
            scripts.DELETE, (keys.config, keys.value, keys.permits, keys.registry, retired), ()
        )
        if reply.retire:
            await retire_clients(self._run, self._now_arg, keys, retired)
        return reply.existed

    async def expire(self, name: str, ttl_us: int) -> bool:
        keys = self.keys(name)
        ttl_ms = millis_up(ttl_us)
        found = await self._run(
            scripts.EXPIRE,
            (keys.config, keys.value, keys.permits, keys.registry),
            (ttl_ms, self._now_arg()),
        )
        if found:
            await refresh_clients(self._run, self._now_arg, keys)
        return found

    async def clear_expire(self, name: str) -> bool:
        keys = self.keys(name)
        had_ttl = await self._run(
            scripts.CLEAR_EXPIRE, (keys.config, keys.value, keys.permits), (self._now_arg(),)
        )
        await refresh_clients(self._run, self._now_arg, keys)
        return had_ttl
