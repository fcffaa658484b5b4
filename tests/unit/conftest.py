"""Shared unit-test helpers: a recording fake chat model and hand-made trajectories."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field


class RecordingChatModel(BaseChatModel):
    """Replays scripted replies and records every call's messages, stop strings and kwargs.

    A reply is a string, an exception (raised), or ``(text, finish_reason)``. Stop strings cut the
    reply and are dropped, as OpenAI-compatible servers do. Usage counts one output token per word.
    """

    responses: list[Any]
    calls: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "recording-fake"

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls.append({"messages": list(messages), "stop": stop, "kwargs": kwargs})
        reply = self.responses[len(self.calls) - 1]
        if isinstance(reply, BaseException):
            raise reply
        text, finish = reply if isinstance(reply, tuple) else (reply, "stop")
        for s in stop or ():
            text = text.split(s, 1)[0]
        message = AIMessage(
            text,
            usage_metadata={
                "input_tokens": 7,
                "output_tokens": len(text.split()),
                "total_tokens": 7 + len(text.split()),
            },
            response_metadata={"finish_reason": finish},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def _trajectory(
    tid: str = "t0",
    answer: str | None = "Paris",
    *,
    steps: list[str] | None = None,
    observations: dict[int, str] | None = None,
    tops: list[list[float]] | None = None,
    generated_tokens: int = 10,
) -> dict:
    """A finished trajectory; ``observations`` maps step index -> tool output; ``tops`` gives
    each generated token's top logprobs (all tokens land in the first step)."""
    if steps is None:
        steps = [
            '<think>find the city</think><tool_call>{"name": "search", "arguments": '
            '{"query": "capital of France"}}</tool_call>',
            f"<think>found it</think><answer>{answer}</answer>",
        ]
    if observations is None:
        observations = {0: "France's capital is Paris."}
    tokens = [
        {"token": "x", "logprob": t[0], "top_logprobs": [["x", lp] for lp in t], "start": 0, "end": 1}
        for t in tops or []
    ]
    return {
        "id": tid,
        "thread_id": f"thread-{tid}",
        "origin": {"kind": "initial"},
        "steps": [
            {
                "index": i,
                "text": text,
                "tokens": tokens if i == 0 else [],
                "regions": {},
                "action": {},
                "prompt_tokens": 0,
                "generated_tokens": generated_tokens,
                "cached_prompt_tokens": 0,
                "finish_reason": "stop",
                "seconds": 0.0,
            }
            for i, text in enumerate(steps)
        ],
        "observations": [
            {
                "step": i,
                "name": "search",
                "arguments": {"query": "q"},
                "content": content,
                "error": False,
                "seconds": 0.0,
            }
            for i, content in observations.items()
        ],
        "status": "answered" if answer else "max_turns",
        "answer": answer,
        "uncertainty": [],
        "stats": {},
    }


@pytest.fixture
def fake_model():
    """Factory: ``fake_model(["reply", RuntimeError("x"), ("cut", "length")])``."""
    return lambda responses: RecordingChatModel(responses=list(responses))


@pytest.fixture
def make_trajectory():
    """Factory for hand-made finished trajectories (see ``_trajectory``)."""
    return _trajectory
