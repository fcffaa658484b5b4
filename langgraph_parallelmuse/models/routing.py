"""Sticky routing over several OpenAI-compatible servers, so each question's prefix cache hits.

vLLM, SGLang and llama.cpp reuse the KV cache of a prompt prefix only on the server that computed
it. Round-robin routing (what the official ParallelMuse release does) scatters a question's branches
over servers and the cache rarely hits; here every request of one question goes to the same server.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from langgraph_parallelmuse.errors import ConfigError

_ROUTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("parallelmuse_route", default=None)


@contextmanager
def routing_scope(key: str) -> Iterator[None]:
    """Route every model call made inside this block by ``key`` (the graph uses the question)."""
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


class StickyRouter(BaseChatModel):
    """Route each request to one of several chat models by its question, deterministically.

    Args:
        models: The servers' chat models (e.g. one ``ChatOpenAI`` per base URL), all serving the
            same weights.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> a, b = FakeListChatModel(responses=["a"] * 9), FakeListChatModel(responses=["b"] * 9)
        >>> router = StickyRouter(models=[a, b])
        >>> {router.invoke([HumanMessage("same question")]).content for _ in range(3)} in ({"a"}, {"b"})
        True
    """

    models: list[BaseChatModel] = Field(description="One chat model per server.")

    def __init__(self, **kwargs: Any) -> None:
        if not kwargs.get("models"):
            raise ConfigError("StickyRouter needs at least one model (one per server base URL)")
        super().__init__(**kwargs)

    @property
    def _llm_type(self) -> str:
        return "parallelmuse-sticky-router"

    def pick(self, messages: Sequence[BaseMessage]) -> BaseChatModel:
        """The model that serves this conversation's question."""
        digest = hashlib.sha256(routing_key(messages).encode()).digest()
        return self.models[int.from_bytes(digest[:8], "big") % len(self.models)]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self.pick(messages)._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self.pick(messages)._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
