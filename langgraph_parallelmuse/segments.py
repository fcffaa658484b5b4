"""Generate one assistant turn as a sequence of prefilled and generated segments.

This is the single mechanism behind every model call of the library. A strong model gets one
generated segment (it writes the whole turn); a small local model gets the protocol tags
prefilled between short generated segments, so it still writes every thought, query and answer
itself but cannot break the format. Prefill is sent as a trailing ``AIMessage`` (continued by the
in-process model); only backends that continue a final assistant message can use ``Lit`` before
a ``Gen``.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

from langgraph_parallelmuse.concurrency import gather_all
from langgraph_parallelmuse.logprobs import checked_logprob, normalize_logprobs, shift
from langgraph_parallelmuse.protocol import content_text
from langgraph_parallelmuse.retry import with_retries
from langgraph_parallelmuse.state import TokenRecord


@dataclass(frozen=True)
class Lit:
    """Text the driver writes itself (protocol tags, fixed JSON around a query)."""

    text: str


#: Stop strings one request may carry (the OpenAI API's limit, which vLLM enforces too).
MAX_STOP_STRINGS = 4


@dataclass(frozen=True)
class Gen:
    """Text the model writes, until one of ``stop`` or ``max_tokens``.

    ``messages`` replaces the conversation for this segment only (e.g. the plain evidence prompt
    of a small model's answer); its output is still placed in the turn.
    """

    stop: tuple[str, ...] = ()
    max_tokens: int = 256
    messages: Sequence[BaseMessage] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        # OpenAI-compatible servers (vLLM, the OpenAI API) refuse a request with more: HTTP 400.
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"{len(self.stop)} stop strings {self.stop!r}: servers take at most {MAX_STOP_STRINGS}")


@dataclass(frozen=True)
class Pick:
    """What a :class:`Choose` chose, and how sure the model was.

    Attributes:
        index: Position of the chosen option in its :class:`Choose`'s (distinct) ``options``.
        text: The chosen option.
        tokens: Its token records from the scoring pass (the model's own logprobs, offsets into ``text``).
        scores: Per option, the log-likelihood of the option and of ending the reply after it.
        shares: Per option, its share of the probability mass of all options (softmax of ``scores``).

    A pick is itself a segment: placed in a turn (by ``Choose.then``) it adds its text with its
    token records, wherever the turn needs it (inside the answer, or opening the next query).
    """

    index: int
    text: str
    tokens: tuple[TokenRecord, ...]
    scores: tuple[float, ...]
    shares: tuple[float, ...]
    name: str = ""  # placed in a turn, the text is recorded under this name in ``TurnResult.segments``

    @property
    def share(self) -> float:
        """The chosen option's share: the model's confidence in the choice."""
        return self.shares[self.index]


@dataclass(frozen=True)
class Choose:
    """The model chooses one of ``options`` by its likelihood after ``messages``; ``then`` goes on.

    Every option is scored as the reply to ``messages`` followed by the end of the reply (a
    backend with ``supports_scoring``: one shared prefill, one batched decode of the options). The
    choice is drawn from the options' likelihoods at the turn's temperature (the argmax at 0), so
    trajectories and branches still differ. ``then(pick)`` gives the segments that follow; they
    place the :class:`Pick` (with the scoring pass's token logprobs) where it belongs: a sure pick
    inside the answer, an unsure one opening the next query as its bridge entity.

    An option's score is its summed log-likelihood with the end of the reply, not the
    length-normalised one issue 21 names: with the gold paragraphs as evidence (40 HotpotQA
    questions) the summed score reached F1 0.171, the per-token means 0.134-0.138 (BENCHMARKS.md
    section 11).

    An option given twice is kept once, at its first place (``options`` holds the distinct ones, in
    order, and a pick's ``index`` is a position in them): two copies would split its probability, so
    a sure choice ("Beatles or Beatles?") would hold half of it and miss the confidence bar.

    Raises:
        ValueError: No option, or an empty (or blank) one: scored on the end of the reply alone, it
            would win over every answer.
    """

    options: tuple[str, ...]
    messages: Sequence[BaseMessage]
    then: Callable[[Pick], Sequence[Segment]] = lambda pick: (pick,)

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError("Choose needs at least one option")
        blank = next((i for i, option in enumerate(self.options) if not option.strip()), None)
        if blank is not None:
            raise ValueError(f"Choose options must not be empty or blank: option {blank} of {self.options!r} is")
        # The dataclass is frozen: only object.__setattr__ sets the distinct options in place.
        object.__setattr__(self, "options", tuple(dict.fromkeys(self.options)))


Segment = Lit | Gen | Choose | Pick


@dataclass
class TurnResult:
    """A generated turn: text, its generated tokens (offsets into ``text``), and accounting."""

    text: str = ""
    tokens: list[TokenRecord] = field(default_factory=list)
    segments: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    context_tokens: int = 0  # prompt tokens of the turn's first call: the conversation so far
    generated_tokens: int = 0
    cached_prompt_tokens: int = 0  # observed: what the backend reported as served from its prefix cache
    # Calls on the conversation itself (not a segment's own plain prompt): a branch's continue the
    # parent's prompt, so these are the calls a prefix cache can serve.
    conversation_calls: int = 0
    conversation_prompt_tokens: int = 0
    conversation_cached_tokens: int = 0
    cache_reported: bool = False  # the backend reports cached prompt tokens at all
    finish_reason: str = "stop"
    calls: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Sampling:
    """Sampling settings passed to every backend under the same (OpenAI) names."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_logprobs: int = 16
    logprobs: bool = True

    def kwargs(self, *, max_tokens: int, seed: int | None, model: BaseChatModel | None = None) -> dict:
        """Call keyword arguments for ``model.ainvoke``.

        ``ChatOpenAI`` renames ``max_tokens`` to ``max_completion_tokens`` in every request
        (langchain-openai's ``ChatOpenAI._get_request_payload``), a field that many
        OpenAI-compatible servers silently ignore (llama-cpp-python's server, llamafile, older
        llama.cpp ``llama-server``), so a step would run on to the context end. For a
        ``ChatOpenAI`` pointed at any server other than OpenAI's, the bound goes in
        ``extra_body`` as ``max_tokens``, which every such server reads (and vLLM/SGLang too).

        Example:
            >>> Sampling().kwargs(max_tokens=8, seed=None)["max_tokens"]
            8
        """
        out = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": max_tokens,
            "logprobs": self.logprobs,
        }
        if self.logprobs and self.top_logprobs:
            out["top_logprobs"] = self.top_logprobs
        elif getattr(model, "top_logprobs", None) and _is_chat_openai(model):
            # Else the model's own top_logprobs goes out beside logprobs=false (a report or the
            # aggregator), which vLLM refuses with HTTP 400.
            out["top_logprobs"] = None
        if seed is not None:
            out["seed"] = seed
        if model is not None and _renames_max_tokens_for_other_server(model):
            del out["max_tokens"]
            # A call's extra_body replaces the model's own: keep the user's fields.
            extra = getattr(model, "extra_body", None) or {}
            out["extra_body"] = {**extra, "max_tokens": max_tokens}
        return out


def _is_chat_openai(model: BaseChatModel | None) -> bool:
    # No ChatOpenAI exists before langchain_openai is imported: importing it here for another model
    # took about 2 s on the event loop at the first call, stalling every run on it.
    chat_openai = getattr(sys.modules.get("langchain_openai"), "ChatOpenAI", None)
    return chat_openai is not None and isinstance(model, chat_openai)


def _renames_max_tokens_for_other_server(model: BaseChatModel) -> bool:
    """True for a ``ChatOpenAI`` (it sends ``max_completion_tokens``) aimed at a non-OpenAI server."""
    if not _is_chat_openai(model) or getattr(model, "sends_max_tokens", False):
        return False  # ServerChatModel writes max_tokens into its request body itself
    base = model.openai_api_base
    if not base:  # OPENAI_BASE_URL is read by the client itself
        client = getattr(model, "root_async_client", None) or getattr(model, "root_client", None)
        base = str(getattr(client, "base_url", "") or "")
    return bool(base) and "api.openai.com" not in base.lower()


def derive_seed(base: int | None, *parts: object) -> int:
    """A reproducible 31-bit seed per (run seed, trajectory, step, segment, attempt).

    With no base seed a fresh random one is drawn, so unseeded runs still differ between branches.
    """
    if base is None:
        return random.getrandbits(31)
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


async def generate_turn(
    model: BaseChatModel,
    messages: Sequence[BaseMessage],
    segments: Sequence[Segment],
    *,
    sampling: Sampling,
    seed: int | None = None,
) -> TurnResult:
    """Run the segments of one assistant turn and stitch text, tokens and usage together.

    Args:
        model: Any LangChain chat model; logprobs are read from ``response_metadata["logprobs"]``.
        messages: The conversation before the turn.
        segments: ``Lit``, ``Gen``, ``Choose`` (and ``Pick``) parts, in order.
        sampling: Temperature, top-p, logprob settings.
        seed: Base seed of the turn (each generated segment derives its own).

    Returns:
        The turn's text, generated tokens with char offsets into that text, and usage.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import FakeListChatModel
        >>> import asyncio
        >>> turn = asyncio.run(generate_turn(FakeListChatModel(responses=["Paris"]), [],
        ...     [Lit("<answer>"), Gen(stop=("</answer>",)), Lit("</answer>")], sampling=Sampling()))
        >>> turn.text
        '<answer>Paris</answer>'
    """
    result = TurnResult()
    started = time.perf_counter()
    queue: deque[Segment] = deque(segments)
    i = -1
    while queue:
        seg, i = queue.popleft(), i + 1
        if isinstance(seg, Lit):
            result.text += seg.text
            continue
        if isinstance(seg, Pick):
            result.tokens.extend(shift(list(seg.tokens), len(result.text)))
            result.text += seg.text
            if seg.name:
                result.segments[seg.name] = seg.text
            continue
        if isinstance(seg, Choose):
            pick, replies = await _choose(
                model, seg, sampling=sampling, seed=None if seed is None else derive_seed(seed, i)
            )
            for reply in replies:  # every option's scoring is decode work of the backend
                _account(result, reply, conversation=False, generated=0)
            queue.extendleft(reversed(list(seg.then(pick))))
            continue
        prompt = list(seg.messages) if seg.messages is not None else list(messages)
        if seg.messages is None and result.text:
            prompt.append(AIMessage(result.text))
        kwargs = sampling.kwargs(
            max_tokens=seg.max_tokens, model=model, seed=None if seed is None else derive_seed(seed, i)
        )
        stop = list(seg.stop) or None
        msg = await with_retries(lambda p=prompt, st=stop, kw=kwargs: model.ainvoke(p, stop=st, **kw))
        content = content_text(msg.content)
        raw = (msg.response_metadata or {}).get("logprobs")
        tokens = normalize_logprobs(raw, content) if raw else []
        result.tokens.extend(shift(tokens, len(result.text)))
        if seg.name:
            result.segments[seg.name] = content
        result.text += content
        _account(result, msg, conversation=seg.messages is None, generated=len(tokens))
    result.seconds = time.perf_counter() - started
    return result


def _account(result: TurnResult, msg: AIMessage, *, conversation: bool, generated: int) -> None:
    """Add one model call's usage to ``result`` (``generated``: token count if usage lacks it)."""
    usage = msg.usage_metadata or {}
    prompt_tokens = int(usage.get("input_tokens", 0) or 0)
    if result.calls == 0:
        result.context_tokens = prompt_tokens
    result.prompt_tokens += prompt_tokens
    result.generated_tokens += int(usage.get("output_tokens", 0) or generated)
    details = usage.get("input_token_details") or {}
    cached = int(details.get("cache_read", 0) or 0)
    result.cached_prompt_tokens += cached
    result.cache_reported = result.cache_reported or "cache_read" in details
    if conversation:
        result.conversation_calls += 1
        result.conversation_prompt_tokens += prompt_tokens
        result.conversation_cached_tokens += cached
    # The turn counts as cut off only if its last generated part was: a guided thought that
    # hits its short bound is closed by the driver and is not a truncated turn.
    result.finish_reason = _finish_reason(msg.response_metadata or {})
    result.calls += 1


# How chat models other than OpenAI-shaped ones say a reply hit its token bound: Anthropic's
# ``stop_reason``, Bedrock Converse's ``stopReason``, Ollama's ``done_reason``, Gemini's
# ``finish_reason``, the OpenAI Responses API's ``incomplete_details``.
_CUT_OFF = frozenset({"length", "max_tokens", "MAX_TOKENS", "max_output_tokens"})
_REASON_KEYS = ("finish_reason", "stop_reason", "stopReason", "done_reason")


# LangChain glues the string metadata of streamed chunks together: a server that sends its reason on
# more than one chunk gives "stopstop", or "lengthstop", whose cut-off a whole-string match missed.
_CUT_OFF_IN = re.compile("|".join(sorted(_CUT_OFF, key=len, reverse=True)))
_REPEATED = re.compile(r"(\w+?)\1+")


def _finish_reason(metadata: dict) -> str:
    """A reply's finish reason as the OpenAI API names it: ``"length"`` for a reply cut off by its
    token bound, whatever the backend calls it (read as ``"stop"``, a cut-off answer was an answer),
    and whichever of a streamed reply's chunks said so.

    Example:
        >>> _finish_reason({"stop_reason": "max_tokens"}), _finish_reason({"finish_reason": "stop"}), _finish_reason({})
        ('length', 'stop', 'stop')
        >>> _finish_reason({"finish_reason": "lengthstop"}), _finish_reason({"finish_reason": "stopstop"})
        ('length', 'stop')
        >>> _finish_reason({"finish_reason": "stop", "stop_reason": "</length>"})  # vLLM: the stop string met
        'stop'
    """
    details = metadata.get("incomplete_details")
    reasons = [metadata.get(key) for key in _REASON_KEYS]
    reasons.append(details.get("reason") if isinstance(details, dict) else None)
    reason = metadata.get("finish_reason")
    # Only finish_reason is glued: vLLM's stop_reason is the stop string that matched, any text.
    glued = isinstance(reason, str) and _CUT_OFF_IN.search(reason)
    if glued or any(isinstance(other, str) and other in _CUT_OFF for other in reasons):
        return "length"
    if isinstance(reason, str) and len(reason) <= 64 and (repeated := _REPEATED.fullmatch(reason)):
        return repeated.group(1)
    return reason or "stop"


async def _choose(
    model: BaseChatModel, seg: Choose, *, sampling: Sampling, seed: int | None
) -> tuple[Pick, list[AIMessage]]:
    """Score every option of ``seg`` with ``model`` and draw the choice (see :class:`Choose`)."""
    if not getattr(model, "supports_scoring", False):
        raise TypeError(f"{type(model).__name__} cannot score a given continuation (supports_scoring): use Gen")
    kwargs = {"logprobs": True, "top_logprobs": sampling.top_logprobs}
    replies = await gather_all(
        *(with_retries(lambda o=o: model.ainvoke(list(seg.messages), continuation=o, **kwargs)) for o in seg.options)
    )
    records = [normalize_logprobs(r.response_metadata["logprobs"], r.content) for r in replies]
    scores = [
        # Checked as every token's logprob is: NaN would make every share NaN, -inf every weight 0.
        sum(t["logprob"] for t in recs) + checked_logprob(r.response_metadata["end_logprob"])
        for recs, r in zip(records, replies, strict=True)
    ]
    shares = _softmax(scores, 1.0)
    if sampling.temperature > 0:
        weights = _softmax(scores, sampling.temperature)
        index = random.Random(seed).choices(range(len(scores)), weights=weights)[0]
    else:
        index = max(range(len(scores)), key=scores.__getitem__)
    return Pick(index, replies[index].content, tuple(records[index]), tuple(scores), tuple(shares)), replies


def _softmax(scores: Sequence[float], temperature: float) -> list[float]:
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]
