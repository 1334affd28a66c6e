"""``aiolimit.langchain``: a chat model's ``rate_limiter=`` that takes the permits of one
limiter shared by every process (each backend below is another client of one store)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conformance import Sleepers
from conftest import Store
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from aiolimit import MemoryBackend, RateLimiter
from aiolimit.langchain import LangChainRateLimiter


def model(limiter: LangChainRateLimiter, answers: int = 20) -> FakeListChatModel:
    return FakeListChatModel(responses=["ok"] * answers, rate_limiter=limiter)


async def test_every_process_model_call_takes_a_permit_of_the_one_limiter(
    store: Store, name: str, asleep: Sleepers
) -> None:
    """Two processes' models (two clients of one store), 5 per minute between them: the
    calls past the 5th wait; none is refused nor let through early."""
    first = RateLimiter(name, store.backend(), rate="5/minute")
    second = RateLimiter(name, store.backend(), rate="5/minute")
    models = [model(LangChainRateLimiter(first)), model(LangChainRateLimiter(second))]
    for i in range(5):
        assert await models[i % 2].ainvoke("hi") is not None
    assert await first.available_permits() == 0
    late = asyncio.ensure_future(models[1].ainvoke("hi"))
    await asyncio.wait_for(asleep.reach(name, 1), 10)  # the 6th sleeps out its slot
    assert not late.done()
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late


async def test_non_blocking_and_a_timeout_answer_false_when_no_permit_comes(
    store: Store, name: str
) -> None:
    limiter = RateLimiter(name, store.backend(), rate="2/minute")
    adapter = LangChainRateLimiter(limiter, permits=2, timeout=0.5)
    assert await adapter.aacquire(blocking=False)
    assert not await adapter.aacquire(blocking=False)
    assert not await adapter.aacquire()  # a minute away, past the 0.5 s timeout


def test_sync_model_calls_take_permits_on_the_adapters_own_loop() -> None:
    """``model.invoke`` from sync code (no event loop running): the permits are taken on
    the adapter's loop thread, and refused when none are left."""
    limiter = RateLimiter("sync-calls", MemoryBackend(), rate="3/minute")
    adapter = LangChainRateLimiter(limiter)
    try:
        chat = model(adapter)
        for _ in range(3):
            assert chat.invoke("hi").content == "ok"
        assert adapter.acquire(blocking=False) is False
        assert [t.name for t in threading.enumerate()].count("aiolimit-langchain") == 1
    finally:
        adapter.close()


def test_a_bad_limiter_or_permits_is_refused_at_construction() -> None:
    from aiolimit import InvalidArgumentError

    with pytest.raises(TypeError, match="RateLimiter"):
        LangChainRateLimiter("openai")  # type: ignore[arg-type]
    limiter = RateLimiter("x", MemoryBackend(), rate="3/minute")
    with pytest.raises(InvalidArgumentError):
        LangChainRateLimiter(limiter, permits=0)
