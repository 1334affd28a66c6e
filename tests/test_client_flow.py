"""The HTTP clients' one flow, driven by hand with no HTTP library: the steps it yields are
values (send now, discard, settle) and what came back is told to it (an answer, or the error
thrown in), so the sequence both clients run can be read and checked on its own, on every
backend (the limiters on a clock the test holds still)."""

from __future__ import annotations

from typing import Any

import pytest
from metering import Ticking, meters

from aiolimit._client_flow import (
    AGAIN,
    CONNECTED,
    CONNECTING,
    DISCARD,
    PROCEED,
    SEND,
    Answer,
    AskAgain,
    ClientCalls,
    Flow,
    Send,
    Settle,
)


def calls(requests: Any, **options: Any) -> ClientCalls:
    defaults = (lambda request: 300, lambda response: response)
    options = {"tokens": None, "estimate": None, "usage": None, **options}
    return ClientCalls(
        requests,
        permits=1,
        timeout=None,
        retry=True,
        max_pause=60,
        concurrency=None,
        learn=False,
        defaults=defaults,
        kinds_defaults=defaults,
        **options,
    )


async def steps(flow: Flow, answers: list[Answer]) -> list[object]:
    """The flow's steps, each Send told the next of ``answers``."""
    seen: list[object] = []
    reply: Answer | None = None
    try:
        step = await flow.asend(None)
        while True:
            seen.append(step)
            reply = answers.pop(0) if isinstance(step, Send) else None
            step = await flow.asend(reply)
    except StopAsyncIteration:
        return seen


async def test_a_served_call_is_one_send_and_one_permit(store: Any) -> None:
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), True)
    assert await steps(flow, [(200, {})]) == [SEND]
    assert await requests.available_permits() == 10 - 1


async def test_a_429_with_retry_after_is_discarded_and_sent_once_more_on_a_permit_of_its_own(
    store: Any,
) -> None:
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), True)
    refused = (429, {"retry-after": "0"})
    assert await steps(flow, [refused, refused]) == [SEND, DISCARD, SEND]
    assert await requests.available_permits() == 10 - 2


async def test_a_body_that_cannot_be_sent_again_is_not_discarded(store: Any) -> None:
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), False)
    assert await steps(flow, [(429, {"retry-after": "0"})]) == [SEND]


async def test_an_error_thrown_in_hands_back_only_what_never_left(store: Any) -> None:
    requests, _ = await meters(store, clock=Ticking())
    for error, kept in ((ConnectionRefusedError(), 0), (TimeoutError(), 1)):
        flow = calls(requests).flow("request", (ConnectionError,), True)
        before = await requests.available_permits()
        assert isinstance(await flow.asend(None), Send)
        with pytest.raises(type(error)):
            await flow.athrow(error)
        assert await requests.available_permits() == before - kept


async def test_with_tokens_the_last_step_settles_them_by_the_body(store: Any) -> None:
    requests, tokens = await meters(store, clock=Ticking())
    flow = calls(requests, tokens=tokens).flow("request", (ConnectionError,), True)
    assert isinstance(await flow.asend(None), Send)
    settle = await flow.asend((200, {}))
    assert isinstance(settle, Settle)
    assert await tokens.available_permits() == 1000 - 300
    await settle.read(40)  # (the usage given: the response itself)
    assert await tokens.available_permits() == 1000 - 40
    with pytest.raises(StopAsyncIteration):
        await flow.asend(None)


async def test_told_of_a_new_connection_it_keeps_the_permit_through_a_quick_connect(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection made within the fleet's margin: the permit stays the call's (handed
    back, it would sit unused while the waiters already asleep keep their later slots)."""
    import aiolimit._calls

    monkeypatch.setattr(aiolimit._calls, "note_sent", lambda grants, unmeasured=False: False)
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), True)
    assert await flow.asend(None) == SEND
    assert await flow.asend(CONNECTING) is PROCEED
    assert await requests.available_permits() == 10 - 1  # held while it connects
    assert await flow.asend(CONNECTED) is PROCEED
    assert await requests.available_permits() == 10 - 1  # the same permit: none asked anew
    with pytest.raises(StopAsyncIteration):
        await flow.asend((200, {}))
    assert await requests.available_permits() == 10 - 1


async def test_told_of_a_new_connection_on_an_exact_rate_it_asks_anew_once_it_is_ready(
    store: Any,
) -> None:
    """A limiter without a measured margin covers no lateness: once a new connection is
    ready, the permit taken before it goes back and the call asks anew (its set-up is not
    in the grant), on the connection it made."""
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), True)
    assert await flow.asend(None) == SEND
    assert await flow.asend(CONNECTING) is PROCEED
    assert await requests.available_permits() == 10 - 1  # held while it connects
    assert await flow.asend(CONNECTED) is PROCEED  # (not AGAIN: the connection is kept)
    assert await requests.available_permits() == 10 - 1  # handed back, taken anew
    with pytest.raises(StopAsyncIteration):
        await flow.asend((200, {}))
    assert await requests.available_permits() == 10 - 1


async def test_told_connected_on_a_late_permit_it_hands_it_back_and_asks_again_twice_at_most(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit later than the fleet's margin covers as the request is about to be written
    (here: every time) goes back, the library's send stops unsent (``AskAgain``, thrown in)
    and the flow sends anew; a machine that keeps stalling gets its request sent after
    ``STALE_RETRIES`` asks, not never."""
    import aiolimit._calls

    monkeypatch.setattr(aiolimit._calls, "note_sent", lambda grants, unmeasured=False: True)
    requests, _ = await meters(store, clock=Ticking())
    flow = calls(requests).flow("request", (ConnectionError,), True)
    assert await flow.asend(None) == SEND
    for _ in range(aiolimit._calls.STALE_RETRIES):
        assert await flow.asend(CONNECTED) is AGAIN
        assert await requests.available_permits() == 10  # handed back, not sent
        assert await flow.athrow(AskAgain()) == SEND
    assert await flow.asend(CONNECTED) is PROCEED  # (sent late, at last)
    with pytest.raises(StopAsyncIteration):
        await flow.asend((200, {}))
    assert await requests.available_permits() == 10 - 1
