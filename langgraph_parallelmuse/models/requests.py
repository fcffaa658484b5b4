"""What the engine is asked, what it answers, and the state of a request while it is served."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the chat model's settings check seeds with integer() before torch is needed
    import torch

__all__ = ["GenerationRequest", "GenerationResult", "RequestFuture", "RequestState", "sampling_problem"]


@dataclass(frozen=True)
class GenerationRequest:
    """One completion request over token ids.

    Attributes:
        prompt_ids: Prompt token ids (already chat-templated).
        max_new_tokens: Upper bound on generated tokens.
        temperature: Sampling temperature; ``0`` means greedy.
        top_p: Nucleus sampling mass (applied after temperature).
        seed: Seed of this request's private RNG; ``None`` draws a fresh one.
        stop: Stop strings; the text is cut before the earliest occurrence.
        logprobs: Return per-token raw logprobs.
        top_logprobs: How many alternatives per token (0-20), best first.
        ignore_eos: Keep generating past end-of-sequence tokens (benchmarks).
        forced_ids: Score exactly these tokens instead of sampling (teacher forcing): the result's
            logprobs are the model's for this continuation, so choosing among candidate answers by
            likelihood costs one prefill pass per candidate after the shared (cached) prompt. Sampling
            settings, stop strings, EOS and ``max_new_tokens`` do not apply.
        on_text: Called on the engine's worker thread with each piece of generated text once no
            stop string can cut it any more (streaming); the pieces concatenate to a prefix of the
            result's text. It must return at once; an error it raises fails its request (the
            future raises it), not the others decoded with it.

    Example:
        >>> GenerationRequest([1, 2, 3], max_new_tokens=8, temperature=0.0).temperature
        0.0
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    stop: Sequence[str] = ()
    logprobs: bool = True
    top_logprobs: int = 0
    ignore_eos: bool = False
    forced_ids: Sequence[int] = ()
    on_text: Callable[[str], None] | None = None


class RequestFuture(Future):
    """The future of a submitted request: cancelling it also stops a request already being served.

    A ``concurrent.futures`` future cannot be cancelled once it runs, so a caller that gave up (an
    asyncio task cancelled while awaiting ``asyncio.wrap_future``, e.g. a trajectory cancelled by a
    consensus stop) would leave its row decoding to ``max_new_tokens``, taking compute and a batch
    row from the requests still wanted. ``cancel()`` therefore also marks the request abandoned;
    the worker drops it before its next decode step and resolves it with ``CancelledError``.

    Example:
        >>> future = RequestFuture()
        >>> future.set_running_or_notify_cancel(), future.cancel(), future.abandoned
        (True, False, True)
    """

    abandoned = False

    def cancel(self) -> bool:
        self.abandoned = True
        return super().cancel()


def integer(value: object) -> int | None:
    """``value`` as a plain ``int`` when it is an integer of any type (numpy, torch), else ``None``.

    A bool is not taken: ``True`` as a token id or a seed is a caller's mistake, not the number 1.

    Example:
        >>> import numpy as np
        >>> integer(np.int64(7)), integer(2.0), integer(True)
        (7, None, None)
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def nonnegative(value: object) -> bool:
    """Whether ``value`` is a finite real number >= 0 of any type (not a bool, a string or NaN).

    Example:
        >>> nonnegative(0.02), nonnegative(0), nonnegative(-1), nonnegative(float("nan")), nonnegative("1")
        (True, True, False, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < math.inf


def is_seed(value: object) -> bool:
    """Whether ``value`` is a seed the engine takes: an integer of any type in ``[0, 2**64)``, not a bool.

    Example:
        >>> is_seed(7), is_seed(2**64), is_seed(-1), is_seed(1.5), is_seed(True)
        (True, False, False, False, False)
    """
    return (seed := integer(value)) is not None and 0 <= seed < 2**64


def sampling_problem(request: GenerationRequest) -> str | None:
    """What is wrong with a request's sampling settings (``None``: nothing), checked before it is queued.

    Example:
        >>> sampling_problem(GenerationRequest([1], temperature=None))
        'temperature=None: pass a number >= 0 (0 is greedy)'
        >>> sampling_problem(GenerationRequest([1], top_p=0.0)) is None
        True
        >>> sampling_problem(GenerationRequest([1], seed=1.5))
        'seed=1.5: pass an integer in [0, 2**64)'
        >>> sampling_problem(GenerationRequest([1], ignore_eos="no"))
        "ignore_eos='no': pass True or False"
    """

    def number(x: object) -> bool:
        # numbers.Real: numpy's float scalars are accepted (a torch tensor is not a number here).
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

    if not number(request.temperature) or request.temperature < 0:
        return f"temperature={request.temperature!r}: pass a number >= 0 (0 is greedy)"
    if not number(request.top_p) or not 0 <= request.top_p <= 1:
        return f"top_p={request.top_p!r}: pass a number in [0, 1]"
    # A sequence, not any iterable: checking a one-shot iterator would use it up before the worker reads it.
    stop = request.stop
    if isinstance(stop, str) or not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        return f"stop={request.stop!r}: pass a list of strings"
    if (max_new := integer(request.max_new_tokens)) is None or max_new < 0:
        return f"max_new_tokens={request.max_new_tokens!r}: pass an integer >= 0"
    # Not refused here, a float or bool seed failed later, in the worker's manual_seed.
    if request.seed is not None and not is_seed(request.seed):
        return f"seed={request.seed!r}: pass an integer in [0, 2**64)"
    # Read for truth, the string "no" (or "false") turned the flag on.
    for flag in ("logprobs", "ignore_eos"):
        if not isinstance(value := getattr(request, flag), bool):
            return f"{flag}={value!r}: pass True or False"
    if request.on_text is not None and not callable(request.on_text):  # called on the worker, it failed the batch
        return f"on_text={request.on_text!r}: pass a function of one str, or None"
    return None


@dataclass
class GenerationResult:
    """What a request produced.

    Attributes:
        text: Generated text, cut before the first stop string.
        token_ids: Every token id generated, the stop string's too (usage counts them, as OpenAI's
            does), not the EOS token.
        logprobs: OpenAI-shaped entries ``{"token", "logprob", "bytes", "top_logprobs"}`` whose
            ``token`` strings concatenate to ``text``, so the tokens wholly inside a cut stop
            string have none; ``None`` if not requested.
        finish_reason: ``"stop"`` (EOS or stop string) or ``"length"``.
        prompt_tokens: Prompt length in tokens.
        cached_tokens: Prompt tokens served from the prefix cache.

    Example:
        >>> GenerationResult("Hi", [17], None, "stop", prompt_tokens=5, cached_tokens=0).completion_tokens
        1
    """

    text: str
    token_ids: list[int]
    logprobs: list[dict[str, Any]] | None
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    cached_tokens: int

    @property
    def completion_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@dataclass(eq=False)
class RequestState:
    """A request being served: its generated tokens, text so far and place in the batch.

    Attributes:
        req: The request.
        future: Resolved with the :class:`GenerationResult` (or the error).
        prompt: The prompt token ids.
        max_new: Generation bound after clipping to the context window.
        generator: The request's private RNG (``None`` when greedy).
        context: The last prompt tokens, the left context of incremental detokenising.
        cached: Prompt tokens served from the prefix cache.
        gen: Generated token ids (the last one not yet fed to the model).
        pending_from: Index into ``gen`` of the first token whose text is not yet emitted.
        text: Generated text so far.
        entries: Logprob entries so far.
        starts: Offset into ``text`` of each entry's token.
        streamed: Characters of ``text`` already passed to the request's ``on_text``.
        finish: Why generation stopped, once it has.
        pieces: The KV pieces covering the prompt between prefill and joining the batch
            (see :class:`~.kv_batch.BatchKV`).
    """

    req: GenerationRequest
    future: RequestFuture
    prompt: list[int]
    max_new: int
    generator: torch.Generator | None
    context: list[int]
    cached: int = 0
    gen: list[int] = field(default_factory=list)
    pending_from: int = 0
    text: str = ""
    entries: list[dict[str, Any]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    streamed: int = 0
    finish: Literal["stop", "length"] | None = None
    pieces: list[Any] = field(default_factory=list)

    def result(self) -> GenerationResult:
        """The :class:`GenerationResult` of what was generated so far."""
        return GenerationResult(
            text=self.text,
            token_ids=list(self.gen),
            logprobs=self.entries if self.req.logprobs else None,
            finish_reason=self.finish or "length",
            prompt_tokens=len(self.prompt),
            cached_tokens=self.cached,
        )
