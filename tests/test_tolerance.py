"""The suite's timing checks (conformance.Tolerance) on a real clock: a process that does not
run explains a late event; nothing else does."""

from __future__ import annotations

import asyncio
import time

import pytest
from conformance import LoopLag, Tolerance, now


@pytest.mark.slow
async def test_an_event_late_because_the_whole_process_stalled_passes() -> None:
    lag = LoopLag().start()
    try:
        expected = now() + 0.05
        await asyncio.sleep(0.05)
        time.sleep(0.5)  # noqa: ASYNC251 - the process stalls (descheduled) when the event is due
        Tolerance(0.01, 0.15, lag).check(now(), expected, "the event")
        with pytest.raises(AssertionError):
            Tolerance(0.01, 0.15).check(now(), expected, "the event")  # without the monitor
    finally:
        await lag.stop()


@pytest.mark.slow
async def test_an_event_late_while_the_loop_ran_on_time_fails() -> None:
    lag = LoopLag().start()
    try:
        expected = now()
        await asyncio.sleep(1.0)  # the loop runs (its ticker on time); the event comes 1 s late
        with pytest.raises(AssertionError, match="late"):
            Tolerance(0.01, 0.15, lag).check(now(), expected, "the event")
        with pytest.raises(AssertionError, match="late"):
            Tolerance(0.01, 0.15, lag).check_span((now(), now()), (expected, expected), "event")
    finally:
        await lag.stop()
