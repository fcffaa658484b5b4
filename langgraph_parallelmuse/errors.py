"""The library's exception types: every error a user can cause names what to change."""

from __future__ import annotations


class ParallelMuseError(Exception):
    """Base class of every error raised on purpose by langgraph-parallelmuse."""


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


class RolloutFailedError(ParallelMuseError):
    """Every trajectory of a run failed (the model could not be called); ``result`` keeps the partial run.

    Attributes:
        result: The run's question, its trajectories (each with its ``error``) and its stats, so
            nothing finished is lost.
    """

    def __init__(self, message: str, *, result: dict) -> None:
        super().__init__(message)
        self.result = result
