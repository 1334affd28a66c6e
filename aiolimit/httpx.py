"""An httpx transport that takes a permit before every request and obeys ``Retry-After``.

>>> from aiolimit.httpx import RateLimitedTransport
>>> limiter = RateLimiter("partner-api", RedisBackend(redis))
>>> await limiter.try_set_rate("100/minute")
>>> async with httpx.AsyncClient(transport=RateLimitedTransport(limiter)) as client:
...     await client.get("https://partner.example/orders")

Every client and process that uses the limiter shares the partner's quota. When the partner
still answers ``429`` (or ``503``) with ``Retry-After`` (seconds or an HTTP date), every caller
of the limiter, in every process, pauses that long, and the request is sent once more after
the pause (``retry=False`` returns the response instead). With ``tokens=`` (a second
limiter, of tokens), each request also reserves its estimated tokens, settled by the usage
its response reports once the body is read or closed (docs: Token budgets). With
``concurrency=sem`` (a :class:`~aiolimit.ConcurrencyLimiter`) each request also holds a slot
while it is in flight: taken before the rate permit, released when the response's body is
closed. A request that could not connect (``httpx.ConnectError``, ``ConnectTimeout``,
``PoolTimeout``) hands back its permit and tokens, as the partner never saw it; one that
failed after it was sent keeps them. Needs ``pip install 'aiolimit-redis[httpx]'``.

The same transport serves httpx2 (the successor the LLM SDKs use), each request by its own
module's classes; :mod:`aiolimit.httpx2` offers it as an httpx2 transport, without httpx.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    import httpx
except ImportError as exc:
    raise missing_extra("aiolimit.httpx", "httpx") from exc

from ._transport import LimitedTransport

__all__ = ["RateLimitedTransport"]


class RateLimitedTransport(LimitedTransport, httpx.AsyncBaseTransport):
    """Wraps ``transport`` (default: the ``AsyncHTTPTransport()`` of the first request's
    module, ``httpx`` or ``httpx2``, made then); see the module.

    With the inner transport it makes itself, a request that needs a new connection hands
    its permit back while the connection is made and takes it again just before it is
    written, so the set-up is not in the grant (docs: HTTP clients, when a request takes its
    permit); a transport of your own, or ``concurrency``, takes it before the request goes.

    ``permits`` per request; ``timeout`` (seconds; None waits as long as it takes) bounds the
    wait for a pause and a permit, after which :class:`aiolimit.RateLimited` is raised, with
    ``retry_after``. A pause lasts at most ``max_pause`` (seconds or a timedelta; 15
    minutes by default), whatever ``Retry-After`` says; a longer one is logged (logger
    ``aiolimit``) and cut to it. A request whose body is a stream is not sent again.

    ``tokens`` (a :class:`~aiolimit.RateLimiter` of tokens): ``estimate(request)`` tokens
    (default: a token per 4 bytes of the body plus its ``max_tokens``) are taken with the
    request's permits, all or nothing; when the response body has been read (or a streamed
    one closed), ``usage(response)`` (default: ``usage.total_tokens`` of a JSON body, or of
    an event stream's last usage) settles them; None leaves the estimate standing. A
    provider's ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers cap what both limiters
    have left (``cap_remaining``). A process's metered requests ask one at a time, in order,
    and reserve at most 10 ms ahead, asking again meanwhile (docs: Token budgets, why).
    ``tokens={"input": itpm, "output": otpm}`` (Anthropic's separate limits; either alone
    too): the body's tokens and its ``max_tokens`` reserved each on its limiter, settled by
    ``usage.input_tokens`` (with ``cache_creation_input_tokens``) and ``output_tokens``,
    capped by ``anthropic-ratelimit-input-tokens-*`` and ``-output-tokens-*``; ``estimate``
    and ``usage`` of your own then give a mapping of those kinds to counts.

    ``concurrency``: a slot of it is held from before the permit until the response's body
    is closed (read to the end by ``client.get``; the ``async with client.stream(...)``
    block's end), renewed meanwhile. When the slot's lease is lost before the response
    came, the request is cancelled and :class:`~aiolimit.LeaseLostError` raised; after
    it, reading the body raises it.
    """

    __slots__ = ()
