"""A refusal as every server surface sends it: one framework-free answer (status, header
fields, body), rendered here once; the ASGI middleware sends it as it is (it is an ASGI
app), the aiohttp.web middleware and the FastAPI dependency translate it to their
framework's response.

>>> answer = refusal(verdict, scope, legacy=False)
>>> await answer(scope, receive, send)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ._fields import header_fields, items_of
from ._gate import Verdict
from ._types import Receive, Scope, Send

__all__ = ["Answer", "refusal"]

_JSON = (b"content-type", b"application/json")
_BODY_FIELDS = frozenset((b"content-type", b"content-length"))


@dataclass(frozen=True, slots=True)
class Answer:
    """A response without its framework: ``status``, ``headers`` (lower-case names, as
    sent) and ``body``, empty for a HEAD request (whose ``content-length`` is a GET's)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

    def fields(self) -> list[tuple[bytes, bytes]]:
        """The header fields without the body's own (``content-type``, ``content-length``):
        what a framework that writes the body itself is given."""
        return [(name, value) for name, value in self.headers if name not in _BODY_FIELDS]


def refusal(verdict: Verdict, scope: Scope, legacy: bool) -> Answer:
    """A refused ``verdict`` (429, or 503) as the request of ``scope`` is answered:
    ``Retry-After``, the RateLimit fields gathered in ``scope`` (``legacy``: the
    X-RateLimit ones too) and the JSON body ``{"detail": ...}`` of the verdict's detail,
    written as Starlette's ``JSONResponse`` writes it (compact, UTF-8), so that FastAPI,
    which writes the body of an ``HTTPException`` itself, sends the same bytes."""
    text = json.dumps({"detail": verdict.detail}, ensure_ascii=False, separators=(",", ":"))
    body = text.encode()
    headers = [
        _JSON,
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(verdict.retry_after).encode()),
        *header_fields(items_of(scope), legacy),
    ]
    return Answer(verdict.status, headers, b"" if scope.get("method") == "HEAD" else body)
