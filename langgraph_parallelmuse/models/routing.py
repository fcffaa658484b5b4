"""The routing key of a model call: one per question, so a router keeps a question on one replica.

vLLM, SGLang and llama.cpp reuse the KV cache of a prompt prefix only on the server that computed
it. Round-robin routing (what the official ParallelMuse release does) scatters a question's branches
over replicas and the cache rarely hits. The graph runs every stage of a question (trajectories,
branches, reports, aggregation) inside :func:`routing_scope`; ``ServerChatModel(routing_header=...)``
sends the key in the header a router's sticky policy reads (``vllm-router --policy
consistent_hash``: ``x-session-id``; ``sglang-router --policy manual``: ``x-smg-routing-key``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from langchain_core.messages import BaseMessage, HumanMessage

_ROUTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("parallelmuse_route", default=None)


@contextmanager
def routing_scope(key: str) -> Iterator[None]:
    """Route every model call made inside this block by ``key`` (the graph uses the question).

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> with routing_scope("Where is the Eiffel Tower?"):
        ...     routing_key([HumanMessage("Compare these reports: ...")])
        'Where is the Eiffel Tower?'
    """
    token = _ROUTE.set(key)
    try:
        yield
    finally:
        _ROUTE.reset(token)


def routing_key(messages: Sequence[BaseMessage]) -> str:
    """The active :func:`routing_scope`, else the first human message (the question of a trajectory).

    Report and aggregation prompts start differently, so the graph sets the scope for them.
    """
    if (key := _ROUTE.get()) is not None:
        return key
    first = next((m for m in messages if isinstance(m, HumanMessage)), None)
    return str(first.content) if first is not None else ""
