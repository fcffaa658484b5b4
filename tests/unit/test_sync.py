"""The sync API's bridge to the async nodes: an abandoned call stops its coroutine."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from langgraph_parallelmuse.sync import async_node


def test_a_sync_call_interrupted_by_ctrl_c_cancels_its_coroutine():
    # The coroutine runs on a shared background loop: left running after Ctrl-C, a rollout went on
    # calling the model and held the loop's concurrency slots that the next run waited for.
    ticks, cancelled = [], threading.Event()

    async def work(_):
        try:
            while True:
                await asyncio.sleep(0.02)
                ticks.append(1)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    node = async_node("work", work)
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
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
