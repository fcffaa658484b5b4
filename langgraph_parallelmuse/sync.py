"""Run the graph's async nodes under LangGraph's sync API (``invoke``, ``batch``, ``stream``).

Every node is async-first; its sync form hands the coroutine to one long-lived background event
loop instead of ``asyncio.run``: clients such as langchain-openai's cached httpx ``AsyncClient``
outlive a single node, so a fresh loop per node would close their connections under them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, NamedTuple

from langchain_core.runnables import RunnableLambda

__all__ = ["async_node"]

logger = logging.getLogger(__name__)

_LOOP: asyncio.AbstractEventLoop | None = None
_THREAD: threading.Thread | None = None
_LOOP_LOCK = threading.Lock()
# How long an abandoned sync call waits for its cancelled coroutine to wind down before it re-raises.
_STOP_SECONDS = 30.0


def _forget_loop() -> None:
    # A forked child has no copy of the loop's thread: it starts its own loop on first use.
    global _LOOP, _THREAD, _LOOP_LOCK
    _LOOP, _THREAD, _LOOP_LOCK = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loop)


def _background_loop() -> asyncio.AbstractEventLoop:
    global _LOOP, _THREAD
    with _LOOP_LOCK:
        # A loop whose thread ended (stopped by someone's loop.stop()) would take calls and never run them.
        if _LOOP is None or _LOOP.is_closed() or _THREAD is None or not _THREAD.is_alive():
            _LOOP = asyncio.new_event_loop()
            _THREAD = threading.Thread(target=_run, args=(_LOOP,), name="parallelmuse-sync-loop", daemon=True)
            _THREAD.start()
        return _LOOP


def _run(loop: asyncio.AbstractEventLoop) -> None:
    # SystemExit or KeyboardInterrupt raised in a task the node started (asyncio re-raises them out
    # of run_forever) ended this thread, and every sync call after it waited forever: the loop goes
    # on instead, and the task's own awaiter gets the exception.
    while True:
        try:
            loop.run_forever()
            return
        except BaseException as exc:  # noqa: BLE001 - reported, and the loop's other work goes on
            logger.warning("%s was raised on the sync API's background loop; the loop goes on", type(exc).__name__)


class _Raised(NamedTuple):
    """A SystemExit or KeyboardInterrupt of a node's coroutine, carried to the sync caller."""

    error: BaseException


async def _contained(afunc: Callable, arg: Any) -> Any:
    # Raised out of the task, it would stop the loop (asyncio re-raises them): it is returned
    # instead, and the caller raises it in its own thread. afunc is called here, not in the loop
    # callback that starts the task: what that call raises (a wrong arity, a wrapper that checks
    # its input before it returns the coroutine) only got logged there, and the caller waited forever.
    try:
        return await afunc(arg)
    except (SystemExit, KeyboardInterrupt) as exc:
        return _Raised(exc)


def _cancel(tasks: list[asyncio.Task]) -> None:
    # Empty when start() could not create the task: its caller already has that error.
    for task in tasks:
        task.cancel()


def async_node(name: str, afunc: Callable) -> RunnableLambda:
    """An async node that also runs under the sync API, on the shared background loop.

    The coroutine runs in a copy of the caller's context, so LangGraph's runtime, config and
    stream writer are visible inside it. Whatever it raises, SystemExit and KeyboardInterrupt
    included, is raised in the caller; the loop goes on serving other calls. A sync call made on that
    loop's own thread (a sync callback inside a node) raises ``RuntimeError``: it would wait for
    itself forever. One made from a worker thread that such code waits for (a node that calls
    ``invoke`` on a graph whose parallel branches run in LangGraph's threads) is not detected and
    hangs: code running inside a node awaits the async form (``ainvoke``).

    Example:
        >>> async def double(x):
        ...     return 2 * x
        >>> async_node("double", double).invoke(21)
        42
    """

    def sync(arg: Any) -> Any:
        loop = _background_loop()
        if threading.current_thread() is _THREAD:
            # Waiting here for the loop this thread runs would wait forever.
            raise RuntimeError(
                f"node {name!r} was called through the sync API (invoke, batch, stream) from code running on "
                "the sync API's own background loop, which would wait for itself forever: "
                "await its async form (ainvoke, abatch, astream) there instead"
            )
        context = contextvars.copy_context()
        done: Future = Future()
        tasks: list[asyncio.Task] = []

        def start() -> None:
            coro = _contained(afunc, arg)
            try:
                task = loop.create_task(coro, context=context)
            except BaseException as exc:  # noqa: BLE001 - the caller raises it; a loop callback's is only logged
                coro.close()
                done.set_exception(exc)
                return
            tasks.append(task)

            def finish(t: asyncio.Task) -> None:
                if t.cancelled():
                    done.set_exception(asyncio.CancelledError())
                elif t.exception() is not None:
                    done.set_exception(t.exception())
                elif isinstance(t.result(), _Raised):
                    done.set_exception(t.result().error)
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
                loop.call_soon_threadsafe(_cancel, tasks)
                wait([done], timeout=_STOP_SECONDS)
            raise

    return RunnableLambda(sync, afunc=afunc, name=name)
