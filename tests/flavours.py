"""The two httpx flavours the transport serves: httpx, and httpx2 (the successor the LLM SDKs
use: the same API under another module name), each with the transport a user imports for it.

>>> async with flavour.httpx.AsyncClient(transport=flavour.transport(limiter)) as client:
...     response = await client.get(url)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

FLAVOURS = ("httpx", "httpx2")


@dataclass(frozen=True)
class Flavour:
    """``httpx``: the httpx-like module (its Response, MockTransport, errors, AsyncClient);
    ``transport``: the RateLimitedTransport of ``aiolimit.<name>``."""

    name: str
    httpx: ModuleType
    transport: Any

    @classmethod
    def of(cls, name: str) -> Flavour:
        module = importlib.import_module(name)
        transport = importlib.import_module(f"aiolimit.{name}").RateLimitedTransport
        return cls(name, module, transport)

    def client(self, transport: Any, **options: Any) -> Any:
        return self.httpx.AsyncClient(transport=transport, **options)
