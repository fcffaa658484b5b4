"""The library's exception types: every error a user can cause names what to change."""

from __future__ import annotations

import functools
from typing import Any


class ParallelMuseError(Exception):
    """Base class of every error raised on purpose by langgraph-parallelmuse.

    Attributes:
        result: When the error ended a run after some of its work finished (a setting Stage 2 meets
            only after the rollout), that work: the question, the trajectories, the reports so far and
            the stats, so a run without a checkpointer loses none of it (the aggregator's error; a
            report's holds one trajectory and adds none: the CLI keeps the last streamed state, a
            checkpointed thread keeps the work). ``None`` otherwise. The raising run's own: see
            :func:`with_result`.
    """

    result: dict | None = None


class ConfigError(ParallelMuseError, ValueError):
    """A setting is invalid; the message names the setting and the fix."""


class InputError(ParallelMuseError, ValueError):
    """The graph input (question or messages) is unusable; the message says what to send."""


class ContextOverflowError(InputError):
    """The prompt does not fit the model's context window (the agent trims old tool output and answers)."""


class MissingLogprobsError(ParallelMuseError):
    """The model returned no token logprobs but the chosen mode needs them."""


class ProtocolError(ParallelMuseError, ValueError):
    """Model output or a logprob payload could not be read as the text protocol expects."""


class CorpusError(ParallelMuseError, ValueError):
    """A corpus source is missing or malformed; the message names the file and the fix."""


class ThreadBusyError(ParallelMuseError, RuntimeError):
    """A run started on a checkpointed thread that another run of the graph is running in this process
    (two at once would interleave the thread's checkpoints); the message names the thread."""


class RolloutFailedError(ParallelMuseError):
    """Every trajectory of a run failed (the model could not be called); ``result`` keeps the partial run.

    Attributes:
        result: The run's question, its trajectories (each with its ``error``) and its stats, so
            nothing finished is lost.
    """

    def __init__(self, message: str, *, result: dict) -> None:
        super().__init__(message)
        self.result: dict = result

    def __reduce__(self) -> tuple[Any, ...]:
        # ``result`` is keyword-only: pickle's default rebuild (the class called with ``args``) misses it.
        return functools.partial(type(self), result=self.result), self.args, self.__dict__


def with_result(exc: ParallelMuseError, result: dict) -> ParallelMuseError:
    """``exc`` carrying ``result`` (a run's finished work): itself when it carries none yet, else a copy.

    A model wrapper may raise one stored instance in every run. The run that raised it first keeps its
    result (its caller may still hold the instance); a later run raises a copy (same type, message and
    attributes) with its own, so no run's error carries another question's work.

    Example:
        >>> stored = ConfigError("no prompt_logprobs")
        >>> with_result(stored, {"question": "q1"}) is stored
        True
        >>> again = with_result(stored, {"question": "q2"})
        >>> type(again).__name__, str(again), again.result, stored.result
        ('ConfigError', 'no prompt_logprobs', {'question': 'q2'}, {'question': 'q1'})
    """
    if exc.result is None:
        exc.result = result
        return exc
    # Built without __init__, whose signature a subclass may have changed (RolloutFailedError's result).
    fresh = type(exc).__new__(type(exc), *exc.args)
    fresh.__dict__.update(exc.__dict__)
    if hasattr(exc, "__notes__"):  # a note added to this run's copy must not reach the stored instance
        fresh.__notes__ = list(exc.__notes__)
    fresh.result = result
    return fresh


_OVERFLOW_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "too many tokens",
    "context window",
    "prompt is too long",
    "exceeds the context",
    # llama.cpp's server: "the request exceeds the available context size", type exceed_context_size_error.
    "exceeds the available context size",
    "exceed_context_size",
)


def is_context_overflow(exc: BaseException) -> bool:
    """A backend's "prompt does not fit the context window" error (the in-process engine's
    :class:`ContextOverflowError`; OpenAI, vLLM, llama.cpp wording).

    Example:
        >>> is_context_overflow(ContextOverflowError("the prompt has 9000 tokens")), is_context_overflow(ValueError())
        (True, False)
    """
    if isinstance(exc, ContextOverflowError):
        return True
    text = f"{getattr(exc, 'code', '')} {getattr(exc, 'type', '')} {exc}".lower()
    return any(hint in text for hint in _OVERFLOW_HINTS)


def ends_the_run(exc: BaseException) -> bool:
    """A model call's error that every call of the run would meet alike (a wrong setting or input).

    A malformed reply (a NaN logprob: :class:`ProtocolError`) is that reply's fault, and a context
    overflow that trajectory's: each fails only its trajectory (or report), which can be resumed.

    Example:
        >>> ends_the_run(ConfigError("bad")), ends_the_run(ProtocolError("NaN")), ends_the_run(OSError())
        (True, False, False)
    """
    return isinstance(exc, ParallelMuseError) and not isinstance(exc, ProtocolError) and not is_context_overflow(exc)
