"""Reusable fakes for unit tests: a scripted logprob-returning chat model and async tools.

``ScriptedChatModel`` replays a script (or asks a ``responder`` callable) and returns an
``AIMessage`` shaped like an OpenAI-compatible server's reply: ``response_metadata["logprobs"]``
in the OpenAI chat shape (``{"content": [{token, logprob, bytes, top_logprobs}]}``),
``finish_reason`` and ``usage_metadata``. It records every call (messages, stop strings, kwargs)
so tests can assert on prompts. Stop strings cut the reply and are dropped, as servers do.

Tokens are small pieces of the text (runs of letters/digits, runs of spaces, single punctuation),
so a protocol tag such as ``<tool_call>`` is split over several tokens (``<``, ``tool``, ``_``,
``call``, ``>``), as with real tokenizers.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field, PrivateAttr

_TOKEN_RE = re.compile(r"[A-Za-z0-9]+|\s+|[^A-Za-z0-9\s]")
_REGION_TAGS = ("think", "tool_call", "answer")


def tokenize(text: str) -> list[str]:
    """Split text into small tokens whose concatenation is the text."""
    return _TOKEN_RE.findall(text)


@dataclass
class Reply:
    """One scripted model reply.

    Args:
        text: What the model writes (stop strings still cut it).
        finish_reason: ``stop`` or ``length``.
        logprob: Logprob of every token outside the regions listed in ``regions``.
        regions: Protocol tag (``think``/``tool_call``/``answer``) -> logprob of the tokens inside
            that tag's content.
        logprobs: Return a logprobs payload at all.
        input_tokens: Reported prompt tokens (default: prompt characters // 4).
        cache_read: Reported prompt tokens served from a prefix cache.
        delay: Seconds to wait before answering (async path).
    """

    text: str
    finish_reason: str = "stop"
    logprob: float = -0.1
    regions: dict[str, float] = field(default_factory=dict)
    logprobs: bool = True
    input_tokens: int | None = None
    cache_read: int = 0
    delay: float = 0.0


def _content_spans(text: str) -> dict[str, tuple[int, int]]:
    spans = {}
    for tag in _REGION_TAGS:
        open_at = text.find(f"<{tag}>")
        if open_at < 0:
            continue
        start = open_at + len(tag) + 2
        close = text.find(f"</{tag}>", start)
        spans[tag] = (start, close if close >= 0 else len(text))
    return spans


def logprob_payload(text: str, *, logprob: float = -0.1, regions: dict[str, float] | None = None) -> dict:
    """The OpenAI chat logprobs payload of ``text`` as :func:`tokenize` splits it."""
    spans = _content_spans(text)
    content = []
    pos = 0
    for tok in tokenize(text):
        start, end = pos, pos + len(tok)
        pos = end
        lp = logprob
        for tag, value in (regions or {}).items():
            if tag in spans and spans[tag][0] <= start and end <= spans[tag][1]:
                lp = value
        alt = lp - 1.0
        content.append(
            {
                "token": tok,
                "logprob": lp,
                "bytes": list(tok.encode()),
                "top_logprobs": [
                    {"token": tok, "logprob": lp, "bytes": list(tok.encode())},
                    {"token": "~", "logprob": alt, "bytes": [126]},
                ],
            }
        )
    return {"content": content}


ScriptItem = str | Reply | BaseException


class ScriptedChatModel(BaseChatModel):
    """A chat model that replays ``script`` in order, or asks ``responder(messages)``.

    A script item is a string (a reply), a :class:`Reply`, or an exception (raised). The
    ``responder`` (used when set) gets the messages and returns a script item, so concurrent
    runs stay deterministic. Every call is recorded in ``calls`` as
    ``{"messages", "stop", "kwargs"}``.
    """

    script: list[Any] = Field(default_factory=list)
    responder: Callable[[list[BaseMessage]], Any] | None = None
    calls: list[dict[str, Any]] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _in_flight: int = PrivateAttr(default=0)
    _peak: int = PrivateAttr(default=0)

    @property
    def peak_in_flight(self) -> int:
        """Most async calls in progress at once (replies with a ``delay`` overlap)."""
        return self._peak

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    def _next(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict) -> Reply:
        with self._lock:
            index = len(self.calls)
            self.calls.append({"messages": list(messages), "stop": stop, "kwargs": dict(kwargs)})
        if self.responder is not None:
            item = self.responder(list(messages))
        else:
            if index >= len(self.script):
                raise AssertionError(f"the script has {len(self.script)} replies; call {index + 1} was made")
            item = self.script[index]
        if isinstance(item, BaseException):
            raise item
        return item if isinstance(item, Reply) else Reply(str(item))

    def _result(self, messages: list[BaseMessage], reply: Reply, stop: list[str] | None) -> ChatResult:
        text = reply.text
        cuts = [text.find(s) for s in stop or () if s and s in text]
        if cuts:
            text = text[: min(cuts)]
        prompt_chars = sum(len(m.content) if isinstance(m.content, str) else len(str(m.content)) for m in messages)
        input_tokens = reply.input_tokens if reply.input_tokens is not None else prompt_chars // 4 + 1
        output_tokens = len(tokenize(text))
        metadata: dict[str, Any] = {"finish_reason": reply.finish_reason}
        if reply.logprobs:
            metadata["logprobs"] = logprob_payload(text, logprob=reply.logprob, regions=reply.regions)
        usage: dict[str, Any] = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        if reply.cache_read:
            usage["input_token_details"] = {"cache_read": reply.cache_read}
        message = AIMessage(text, response_metadata=metadata, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = self._next(messages, stop, kwargs)
        return self._result(messages, reply, stop)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
        try:
            reply = self._next(messages, stop, kwargs)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            return self._result(messages, reply, stop)
        finally:
            with self._lock:
                self._in_flight -= 1


# ---------------------------------------------------------------- protocol text helpers


def call_text(name: str, thought: str = "I should look this up", **arguments: Any) -> str:
    """A well-formed tool-call turn."""
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<think>{thought}</think>\n<tool_call>{payload}</tool_call>"


def answer_text(answer: str, thought: str = "The evidence is sufficient") -> str:
    """A well-formed answer turn."""
    return f"<think>{thought}</think>\n<answer>{answer}</answer>"


# ---------------------------------------------------------------- routing for full graphs

AGENT_MARKER = "You are a deep research assistant"
COMPRESS_MARKER = "short, factual reports about research logs"
AGGREGATE_MARKER = "compare research reports"
GRAPH_REPORT_MARKER = "how research findings lead to an answer"


def agent_step(messages: list[BaseMessage]) -> int:
    """Index of the agent step a prompt asks for (earlier steps are its AI messages)."""
    return sum(1 for m in messages if isinstance(m, AIMessage))


def role_of(messages: list[BaseMessage]) -> str:
    system = messages[0].content if messages else ""
    if COMPRESS_MARKER in system:
        return "compress"
    if AGGREGATE_MARKER in system:
        return "aggregate"
    if GRAPH_REPORT_MARKER in system:
        return "graph_report"
    if AGENT_MARKER in system:
        return "agent"
    return "other"


def report_from_prompt(messages: list[BaseMessage]) -> str:
    """A well-formed free-form report whose answer is the one in the (neutralised) log."""
    found = re.findall(r"&lt;answer>(.*?)&lt;/answer>", messages[-1].content, re.DOTALL)
    answer = found[-1].strip() if found else "unknown"
    return (
        "Solution planning: one sub-problem.\nSolution methods: search gave the fact.\n"
        f"Final reasoning: the fact names it.\n<answer>{answer}</answer>"
    )


def majority_from_prompt(messages: list[BaseMessage]) -> str:
    answers = re.findall(r"Final answer: (.*)", messages[-1].content)
    best = max(answers, key=answers.count) if answers else "unknown"
    return f"<answer>{best}</answer>"


def research_responder(
    agent: Callable[[int, list[BaseMessage]], Any],
    *,
    compress: Callable[[list[BaseMessage]], Any] = report_from_prompt,
    aggregate: Callable[[list[BaseMessage]], Any] = majority_from_prompt,
    graph_report: Callable[[list[BaseMessage]], Any] = lambda messages: "The findings name the answer.",
) -> Callable[[list[BaseMessage]], Any]:
    """A responder for the whole ParallelMuse graph: agent steps by index, reports (text form, or the
    reasoning line of a graph-shaped one), aggregation."""

    def respond(messages: list[BaseMessage]) -> Any:
        role = role_of(messages)
        if role == "compress":
            return compress(messages)
        if role == "graph_report":
            return graph_report(messages)
        if role == "aggregate":
            return aggregate(messages)
        if role == "agent":
            return agent(agent_step(messages), messages)
        raise AssertionError(f"unexpected prompt: {messages[0].content[:80]!r}")

    return respond


# ---------------------------------------------------------------- tools


def make_tools(
    search: Callable[[str], Any] | None = None,
    visit: Callable[[str], Any] | None = None,
) -> tuple[list, dict[str, list[str]]]:
    """Async ``search``/``visit`` tools that record their calls.

    ``search``/``visit`` give the tool output for an argument (a string, an awaitable, or they
    raise). Returns ``([search_tool, visit_tool], calls)`` with ``calls[name]`` the arguments.
    """
    calls: dict[str, list[str]] = {"search": [], "visit": []}
    search_fn, visit_fn = search, visit

    async def _run(fn: Callable[[str], Any] | None, arg: str, default: str) -> str:
        out = default if fn is None else fn(arg)
        if inspect.isawaitable(out):
            out = await out
        return out

    @tool
    async def search(query: str) -> str:
        """Search the web; returns result snippets with document titles."""
        calls["search"].append(query)
        return await _run(search_fn, query, f"Snippets for {query}: the capital of France is Paris.")

    @tool
    async def visit(doc: str) -> str:
        """Open a document by title; returns its text."""
        calls["visit"].append(doc)
        return await _run(visit_fn, doc, f"Document {doc}: Paris is the capital of France.")

    return [search, visit], calls


def perplexity_of(logprobs: list[float]) -> float:
    """exp(-mean(logprob)), computed independently of the library."""
    return math.exp(-sum(logprobs) / len(logprobs))


class ScoringChatModel(ScriptedChatModel):
    """A :class:`ScriptedChatModel` that also scores given continuations (``supports_scoring``).

    A call with ``continuation=text`` does not consume the script: it returns ``text`` with every
    token at ``option_logprobs[text]`` (else ``default_logprob``) and ``end_logprob`` 0, and is
    recorded in ``scored`` as ``(messages, text)``.
    """

    supports_scoring: ClassVar[bool] = True
    option_logprobs: dict[str, float] = Field(default_factory=dict)
    default_logprob: float = -10.0
    scored: list[tuple[list[BaseMessage], str]] = Field(default_factory=list)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        text = kwargs.get("continuation")
        if text is None:
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        with self._lock:
            self.scored.append((list(messages), text))
        payload = logprob_payload(text, logprob=self.option_logprobs.get(text, self.default_logprob))
        metadata = {"finish_reason": "stop", "logprobs": payload, "end_logprob": 0.0}
        usage = {"input_tokens": 10, "output_tokens": len(payload["content"]), "total_tokens": 10}
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage(text, response_metadata=metadata, usage_metadata=usage))]
        )


# A calibration file as written before calibrations recorded their origin (model, questions, counts):
# the files of the issue-22 accuracy runs (bench-results/acc/*-cal-20-35-q05.json) are of this kind.
OLD_CALIBRATION = {
    "confidence_floor": 4.6,
    "confidence_samples": 15,
    "confidence_window": 32,
    "estimator": "nll",
    "quantile": 0.5,
    "samples": {"all": 79, "exploration": 36, "reasoning": 79},
    "thresholds": {"all": 1.37, "exploration": 2.75, "reasoning": 1.06},
}


def context_length_exceeded() -> Exception:
    """The error ``langchain_openai`` raises for a prompt longer than the model's context: the OpenAI
    client's ``BadRequestError`` (HTTP 400) with code ``context_length_exceeded``."""
    import httpx
    import openai

    body = {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
        "9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(400, request=request, json={"error": body})
    return openai.BadRequestError(f"Error code: 400 - {{'error': {body}}}", response=response, body=body)


def with_context(limit: int, reply: str) -> ScriptedChatModel:
    """A model whose context holds ``limit`` prompt characters: a longer prompt raises
    :func:`context_length_exceeded`, as ``langchain_openai`` raises it; a prompt that fits gets ``reply``."""

    def respond(messages):
        return context_length_exceeded() if sum(len(m.content) for m in messages) > limit else reply

    return ScriptedChatModel(responder=respond)


async def cancel_when(run: asyncio.Task, ready: Callable[[], object]) -> None:
    """Cancel ``run`` once ``ready()`` holds, and wait for it to end cancelled (an error if it ended otherwise)."""
    while not ready():
        await asyncio.sleep(0.005)
    run.cancel()
    try:
        await run
    except asyncio.CancelledError:
        return
    raise AssertionError("the run ended before it was cancelled")
