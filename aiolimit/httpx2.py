"""The rate-limited transport for httpx2, the successor of httpx (the same API under another
module name) that the official LLM SDKs use: ``anthropic.AsyncAnthropic(http_client=...)``
takes an ``httpx2.AsyncClient`` only.

>>> from aiolimit.httpx2 import RateLimitedTransport
>>> client = anthropic.AsyncAnthropic(
...     http_client=httpx2.AsyncClient(transport=RateLimitedTransport(requests, tokens=tokens))
... )

The same transport as :class:`aiolimit.httpx.RateLimitedTransport`, with the same options
(default inner transport: ``httpx2.AsyncHTTPTransport()``), typed as an httpx2 transport and
importable where httpx is not installed. Needs ``pip install 'aiolimit-redis[httpx2]'``.
"""

from __future__ import annotations

from ._extras import missing_extra

try:
    import httpx2
except ImportError as exc:
    raise missing_extra("aiolimit.httpx2", "httpx2") from exc

from ._transport import LimitedTransport

__all__ = ["RateLimitedTransport"]


class RateLimitedTransport(LimitedTransport, httpx2.AsyncBaseTransport):
    """An httpx2 transport that takes a permit before every request and obeys
    ``Retry-After``; its options are :class:`aiolimit.httpx.RateLimitedTransport`'s."""

    __slots__ = ()
