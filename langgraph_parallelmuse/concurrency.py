"""Concurrent awaits that never leave work running behind a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["Bounds", "gather_all", "settle"]

T = TypeVar("T")


async def settle(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel ``tasks`` that are still running and wait until every one has ended.

    Example:
        >>> async def demo():
        ...     task = asyncio.ensure_future(asyncio.sleep(60))
        ...     await settle([task])
        ...     return task.cancelled()
        >>> asyncio.run(demo())
        True
    """
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """``asyncio.gather``, except that when one awaitable fails, or the caller is cancelled, the
    others are cancelled and awaited before the error propagates.

    Plain ``gather`` leaves the siblings of a failed task running: trajectories that go on calling
    the model and writing to their checkpoint threads after their run has already raised (a resume
    in the same process would then write to those threads twice).

    Example:
        >>> async def fails():
        ...     raise ValueError("boom")
        >>> async def demo():
        ...     slow = asyncio.ensure_future(asyncio.sleep(60))
        ...     try:
        ...         await gather_all(slow, fails())
        ...     except ValueError:
        ...         return slow.cancelled()
        >>> asyncio.run(demo())
        True
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await settle(tasks)


class Bounds:
    """Several semaphores held together: a slot is taken only when each of them has one.

    Example:
        >>> async def demo():
        ...     wide, narrow = asyncio.Semaphore(8), asyncio.Semaphore(1)
        ...     async with Bounds(narrow, wide):
        ...         return wide._value, narrow._value
        >>> asyncio.run(demo())
        (7, 0)
    """

    def __init__(self, *semaphores: asyncio.Semaphore) -> None:
        self.semaphores = semaphores

    async def __aenter__(self) -> None:
        held: list[asyncio.Semaphore] = []
        try:
            for semaphore in self.semaphores:
                await semaphore.acquire()
                held.append(semaphore)
        except BaseException:  # cancelled while waiting: give back what it held
            for semaphore in held:
                semaphore.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        for semaphore in self.semaphores:
            semaphore.release()
