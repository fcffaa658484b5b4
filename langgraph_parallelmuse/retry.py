"""Retries with exponential backoff and jitter, for transient failures only."""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import datetime
import email.utils
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

T = TypeVar("T")

# Which try of :func:`with_retries` a call is: a routed model call retries under another key.
_ATTEMPT: contextvars.ContextVar[int] = contextvars.ContextVar("parallelmuse_attempt", default=0)

_TRANSIENT_NAMES = {
    "APITimeoutError",
    "APIConnectionError",
    "RateLimitError",
    "InternalServerError",
    "ServiceUnavailableError",
    # httpx's transport errors (any timeout, a refused or dropped connection, a connection closed
    # mid-response), for tools that call a service with httpx directly.
    "TimeoutException",
    "NetworkError",
    "RemoteProtocolError",
    # The names a recorded error keeps (``is_transient_name``): langchain-openai's own subclasses of
    # the openai errors, and langchain-core's provider-neutral ones they derive from.
    "OpenAITimeoutError",
    "OpenAIConnectionError",
    "OpenAIRateLimitError",
    "OpenAIAPIError",
    "ModelTimeoutError",
    "ModelConnectionError",
    "ModelRateLimitError",
    "ModelAPIError",
    # ServerChatModel's reply a server broke off: by class a ConnectionError, named here for the error a
    # bench recorded, which is_transient_name reads.
    "IncompleteReplyError",
}
# 501 and 505 say the server cannot do what was asked (vLLM answers 501 for a NotImplementedError):
# asking again gets the same answer. Every other 5xx (a proxy's 520-524, an overloaded 529) may pass.
_PERMANENT_5XX = frozenset({501, 505})
# A request timeout (408) and a rate limit (429) pass too: the openai client retries them, and a
# routed ServerChatModel, which turns its retries off, leaves them to us. Not 409, which the openai
# client also retries: a conflict is no sign of a server down, and the bench reads a judge's
# transient error as the judge being unreachable (it stops judging the questions left).
_TRANSIENT_4XX = frozenset({408, 429})


def is_transient(exc: BaseException) -> bool:
    """Server hiccups worth a retry, nothing else: timeouts, dropped connections, HTTP 408 and 429,
    and every 5xx but 501 and 505.

    Example:
        >>> is_transient(TimeoutError()), is_transient(ValueError("bad"))
        (True, False)
    """
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return status in _TRANSIENT_4XX or (status >= 500 and status not in _PERMANENT_5XX)
    # By class name anywhere in the hierarchy: langchain-openai raises its own subclasses
    # (OpenAIConnectionError, OpenAITimeoutError), which carry no status code.
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


def is_transient_name(name: str) -> bool:
    """:func:`is_transient` for an exception known only by its class name (a recorded error's
    ``"Name: message"``): a builtin by its class, another by the client libraries' names.

    Example:
        >>> is_transient_name("ConnectionRefusedError"), is_transient_name("APIConnectionError")
        (True, True)
        >>> is_transient_name("BadRequestError"), is_transient_name("ValueError")
        (False, False)
    """
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return issubclass(builtin, (TimeoutError, ConnectionError))
    return name in _TRANSIENT_NAMES


#: The longest wait a server's Retry-After may ask for before a retry.
MAX_RETRY_AFTER = 60.0


def retry_after(exc: BaseException) -> float:
    """Seconds an HTTP 429/503 asked to wait, at most :data:`MAX_RETRY_AFTER`; 0 without one. Read as
    the openai client reads it: ``Retry-After-Ms`` (OpenAI's, in milliseconds) first, then
    ``Retry-After`` in seconds or as an HTTP date. The openai client waits for it itself, but a routed
    :class:`~langgraph_parallelmuse.models.server.ServerChatModel` leaves the retries to the library.

    Example:
        >>> import httpx
        >>> class RateLimited(Exception):
        ...     response = httpx.Response(429, headers={"retry-after": "7"})
        >>> class Throttled(Exception):
        ...     response = httpx.Response(429, headers={"retry-after-ms": "250", "retry-after": "1"})
        >>> retry_after(RateLimited()), retry_after(Throttled()), retry_after(ValueError())
        (7.0, 0.25, 0.0)
    """
    return wait_asked(getattr(getattr(exc, "response", None), "headers", None))


def wait_asked(headers: object, *, cap: float = MAX_RETRY_AFTER) -> float:
    """:func:`retry_after` of a response's ``headers`` (a client that raises errors without the response
    still lets a hook see it).

    Args:
        headers: The response's headers (any mapping; ``None`` when there was no response).
        cap: The longest wait returned. Capped, an ask of exactly :data:`MAX_RETRY_AFTER` and a
            longer one (a day's quota) read the same: a caller that must tell them apart (to wait
            the one and give up on the other) passes ``math.inf`` and compares with ``>``.

    Example:
        >>> wait_asked({"Retry-After": "3"}), wait_asked({"retry-after": "600"}), wait_asked(None)
        (3.0, 60.0, 0.0)
        >>> wait_asked({"retry-after": "600"}, cap=math.inf) > MAX_RETRY_AFTER
        True
    """
    for name, per_second in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            seconds = float(_header(headers, name)) / per_second
        except (TypeError, ValueError):  # missing or not a number: the next header, or a date
            continue
        if math.isfinite(seconds):  # a "nan" ms value leaves the seconds to Retry-After
            break
    else:
        seconds = _seconds_until(_header(headers, "retry-after"))
    return min(max(seconds, 0.0), cap) if math.isfinite(seconds) else 0.0


def _header(headers: object, name: str) -> object:
    """A header's value by its name in any case: httpx's and requests' headers ignore case, a plain
    dict a client library builds does not."""
    if not isinstance(headers, Mapping):
        return None
    if name in headers:
        return headers[name]
    return next((value for key, value in headers.items() if isinstance(key, str) and key.lower() == name), None)


def _seconds_until(value: object) -> float:
    """Seconds from now to an HTTP date (RFC 9110 allows one in Retry-After); 0 when it is none."""
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return 0.0
    if when.tzinfo is None:  # RFC 850 and asctime dates carry no zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    return (when - datetime.datetime.now(datetime.UTC)).total_seconds()


def current_attempt() -> int:
    """The try of the innermost :func:`with_retries` running this code: 0 first, then 1, 2, ...

    Example:
        >>> current_attempt()
        0
    """
    return _ATTEMPT.get()


async def with_retries(call: Callable[[], Awaitable[T]], *, retries: int = 2, base_delay: float = 0.5) -> T:
    """Await ``call()``, retrying transient failures with exponential backoff and jitter, waiting at
    least what a server's ``Retry-After`` asks (:func:`retry_after`).

    Each try runs with :func:`current_attempt` set to its number.
    """
    delay = base_delay
    for attempt in range(retries + 1):
        token = _ATTEMPT.set(attempt)
        try:
            return await call()
        except Exception as exc:
            if attempt == retries or not is_transient(exc):
                raise
            wait = max(delay * (1 + random.random()), retry_after(exc))
        finally:
            _ATTEMPT.reset(token)
        await asyncio.sleep(wait)
        delay *= 2
    raise AssertionError("unreachable")
