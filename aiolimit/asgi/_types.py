"""The ASGI types the package uses, and the shapes of the callables a rule takes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

__all__ = [
    "ASGIApp",
    "KeyFunc",
    "Message",
    "OnBackendError",
    "PermitsFunc",
    "Receive",
    "Scope",
    "Send",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KeyFunc = Callable[[Scope], "str | None"]
"""What a rule counts by: ``key(scope)`` is the client id, or None (the rule does not apply)."""
PermitsFunc = Callable[[Scope], int]
"""The permits a request takes, said by the request (its scope): ``permits=lambda scope: ...``."""
OnBackendError = Literal["deny", "allow"]
