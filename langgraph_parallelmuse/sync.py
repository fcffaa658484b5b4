"""Run the graph's async nodes under LangGraph's sync API (``invoke``, ``batch``, ``stream``).

Every node is async-first; its sync form hands the coroutine to one long-lived background event
loop instead of ``asyncio.run``: clients such as langchain-openai's cached httpx ``AsyncClient``
outlive a single node, so a fresh loop per node would close their connections under them.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from langchain_core.runnables import RunnableLambda

__all__ = ["async_node"]

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
# How long an abandoned sync call waits for its cancelled coroutine to wind down before it re-raises.
_STOP_SECONDS = 30.0


def _forget_loop() -> None:
    # A forked child has no copy of the loop's thread: it starts its own loop on first use.
    global _LOOP, _LOOP_LOCK
    _LOOP, _LOOP_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loop)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="parallelmuse-sync-loop", daemon=True).start()
        return _LOOP


def async_node(name: str, afunc: Callable) -> RunnableLambda:
    """An async node that also runs under the sync API, on the shared background loop.

    The coroutine runs in a copy of the caller's context, so LangGraph's runtime, config and
    stream writer are visible inside it.

    Example:
        >>> async def double(x):
        ...     return 2 * x
        >>> async_node("double", double).invoke(21)
        42
    """

    def sync(arg: Any) -> Any:
        loop = _background_loop()
        context = contextvars.copy_context()
        done: Future = Future()
        tasks: list[asyncio.Task] = []

        def start() -> None:
            task = loop.create_task(afunc(arg), context=context)
            tasks.append(task)

            def finish(t: asyncio.Task) -> None:
                if t.cancelled():
                    done.set_exception(asyncio.CancelledError())
                elif t.exception() is not None:
                    done.set_exception(t.exception())
                else:
                    done.set_result(t.result())

            task.add_done_callback(finish)

        loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except BaseException:
            if not done.done():
                # The caller gave up (Ctrl-C): the coroutine must stop too, or its trajectories go on
                # calling the model, writing checkpoints and holding this shared loop's
                # max_concurrency slots, which the next run would wait for. Waiting lets it cancel
                # its trajectories (start runs before this: the loop's callbacks are FIFO).
                loop.call_soon_threadsafe(lambda: tasks[0].cancel())
                wait([done], timeout=_STOP_SECONDS)
            raise

    return RunnableLambda(sync, afunc=afunc, name=name)
