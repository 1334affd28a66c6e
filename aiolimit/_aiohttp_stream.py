"""An aiohttp response's event stream metered as the caller reads it: the usage of its last
``data:`` event that carries one settles the call's tokens once the stream is read to its
end, or the response released or closed (``async with`` left). A stream left before its
usage event keeps the estimate. Only a bounded tail of the stream is kept (``UsageTail``).

>>> meter_stream(response, await settle.events())   # in the client middleware, before returning
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from aiohttp import ClientResponse, StreamReader

from ._body_tap import BodyTap

__all__ = ["meter_stream"]

T = TypeVar("T")


def meter_stream(response: ClientResponse, tap: BodyTap) -> None:
    """Feeds ``tap`` with what the caller reads of ``response``'s body and ends it once the
    caller has read it to the end or lets the response go (its settle then runs in the
    store's background); nothing else changes for the caller."""
    # (the reader aiohttp hands out, shown through: the caller reads the same bytes)
    response.content = _Tapped(response.content, tap)  # type: ignore[assignment]
    release, close = response.release, response.close

    def releasing() -> Any:
        tap.end_soon()
        return release()

    def closing() -> None:
        tap.end_soon()
        close()

    # (release: what leaving `async with` calls; close: a broken or abandoned response)
    response.release = releasing  # type: ignore[method-assign]
    response.close = closing  # type: ignore[method-assign]


class _Tapped:
    """A response's ``content`` (aiohttp's StreamReader) whose reads pass through ``tap``,
    ended once the body has been read to its end. Everything else is the reader's own."""

    __slots__ = ("_reader", "_tap")

    def __init__(self, reader: StreamReader, tap: BodyTap) -> None:
        self._reader, self._tap = reader, tap

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def _passed(self, data: bytes) -> bytes:
        self._tap.feed(data)
        if self._reader.at_eof():
            self._tap.end_soon()
        return data

    async def read(self, n: int = -1) -> bytes:
        return self._passed(await self._reader.read(n))

    async def readany(self) -> bytes:
        return self._passed(await self._reader.readany())

    async def readline(self, **options: Any) -> bytes:
        return self._passed(await self._reader.readline(**options))

    async def readuntil(self, separator: bytes = b"\n", **options: Any) -> bytes:
        return self._passed(await self._reader.readuntil(separator, **options))

    async def readexactly(self, n: int) -> bytes:
        return self._passed(await self._reader.readexactly(n))

    async def readchunk(self) -> tuple[bytes, bool]:
        data, end_of_chunk = await self._reader.readchunk()
        return self._passed(data), end_of_chunk

    def read_nowait(self, n: int = -1) -> bytes:
        return self._passed(self._reader.read_nowait(n))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._through(aiter(self._reader), self._passed)

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._through(self._reader.iter_chunked(n), self._passed)

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._through(self._reader.iter_any(), self._passed)

    def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        def passed(chunk: tuple[bytes, bool]) -> tuple[bytes, bool]:
            return self._passed(chunk[0]), chunk[1]

        return self._through(self._reader.iter_chunks(), passed)

    async def _through(self, items: AsyncIterator[T], passed: Callable[[T], T]) -> AsyncIterator[T]:
        async for item in items:
            yield passed(item)
        self._tap.end_soon()  # (the reader's iterator stops at the end of the body)
