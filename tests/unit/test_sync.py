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


def _within(seconds: float, call):
    """``call()``'s result or the exception it raised; "hung" when it has not returned by then."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return box.get("value", "hung")


async def _double(x):
    return 2 * x


def test_a_node_raising_system_exit_raises_it_in_the_caller_and_the_loop_goes_on():
    # asyncio re-raises SystemExit/KeyboardInterrupt out of the loop: its thread ended, that call and
    # every later sync call in the process waited forever.
    async def exits(_):
        raise SystemExit(3)

    async def child_interrupted(_):
        async def child():
            raise KeyboardInterrupt

        return await asyncio.gather(asyncio.ensure_future(child()))

    raised = _within(5, lambda: async_node("exits", exits).invoke(None))
    assert isinstance(raised, SystemExit) and raised.code == 3
    assert isinstance(_within(5, lambda: async_node("child", child_interrupted).invoke(None)), KeyboardInterrupt)
    assert _within(5, lambda: async_node("double", _double).invoke(21)) == 42


def test_a_stopped_background_loop_is_replaced():
    from langgraph_parallelmuse import sync

    assert _within(5, lambda: async_node("double", _double).invoke(1)) == 2  # the loop is running
    loop = sync._LOOP
    loop.call_soon_threadsafe(loop.stop)
    deadline = time.monotonic() + 5
    while any(t.name == "parallelmuse-sync-loop" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _within(5, lambda: async_node("double", _double).invoke(21)) == 42
    loop.close()


def test_a_sync_call_from_the_background_loop_itself_raises_instead_of_waiting_forever():
    inner = async_node("inner", _double)

    async def outer(x):
        return inner.invoke(x)  # a sync callback inside a node

    raised = _within(5, lambda: async_node("outer", outer).invoke(21))
    assert isinstance(raised, RuntimeError), raised
    assert "'inner'" in str(raised) and "ainvoke" in str(raised)
    assert _within(5, lambda: async_node("double", _double).invoke(21)) == 42


async def _takes_two(state, config):  # a node written for (state, config)
    return state


def _checks_first(state):  # a wrapper that checks its input before it returns the coroutine
    if not state:
        raise ValueError("empty state")
    return _double(state)


@pytest.mark.timeout(30)
def test_a_node_whose_call_raises_raises_it_in_the_caller():
    # afunc(arg) was called in the loop callback that starts the task: what the call raised was only
    # logged ("Exception in callback") and the caller waited forever.
    with pytest.raises(TypeError, match="config"):
        async_node("takes_two", _takes_two).invoke(1)
    with pytest.raises(ValueError, match="empty state"):
        async_node("checks_first", _checks_first).invoke(0)
    assert async_node("checks_first", _checks_first).invoke(21) == 42


@pytest.mark.timeout(30)
def test_a_task_the_loop_cannot_start_raises_in_the_caller():
    from langgraph_parallelmuse import sync

    assert async_node("double", _double).invoke(1) == 2  # the loop is running
    loop = sync._LOOP

    def refuse(loop, coro, **kwargs):
        raise RuntimeError("no task today")

    loop.set_task_factory(refuse)
    try:
        with pytest.raises(RuntimeError, match="no task today"):
            async_node("double", _double).invoke(21)
    finally:
        loop.set_task_factory(None)
    assert async_node("double", _double).invoke(21) == 42
