"""The sync API's bridge to the async nodes: an abandoned call stops its coroutine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from langgraph_parallelmuse.sync import async_node
from tests.unit.processes import ctrl_c_after, in_forked_child


def test_a_sync_call_interrupted_by_ctrl_c_cancels_its_coroutine():
    # The coroutine runs on a shared background loop: left running after Ctrl-C, a rollout went on
    # calling the model and held the loop's concurrency slots that the next run waited for.
    ticks, cancelled = [], threading.Event()

    async def work(_):
        try:
            while len(ticks) < 500:  # ten seconds at most, should the interrupt never come
                await asyncio.sleep(0.02)
                ticks.append(1)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    node = async_node("work", work)
    with ctrl_c_after(0.2), pytest.raises(KeyboardInterrupt):
        node.invoke(None)
    assert cancelled.is_set()  # already when the interrupt reaches the caller
    seen = len(ticks)
    time.sleep(0.2)
    assert len(ticks) == seen


def test_a_failing_coroutine_raises_its_own_error_under_the_sync_api():
    async def fail(_):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        async_node("fail", fail).invoke(None)


def test_a_forked_child_runs_sync_calls_on_a_loop_of_its_own():
    # The child inherited the parent's loop object but not its thread: its first sync call hung.
    async def double(x):
        return 2 * x

    node = async_node("double", double)
    assert node.invoke(1) == 2  # the parent's background loop is running now
    assert in_forked_child(lambda: node.invoke(21)) == "42"
