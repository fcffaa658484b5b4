"""Which failures the library retries: the ones a server recovers from, as the client libraries raise them."""

from __future__ import annotations

import datetime
import math

import httpx
import pytest
from langchain_openai.chat_models.base import OpenAIConnectionError, OpenAITimeoutError
from openai import APIStatusError, RateLimitError

from langgraph_parallelmuse.models.server import IncompleteReplyError
from langgraph_parallelmuse.retry import (
    MAX_RETRY_AFTER,
    is_transient,
    is_transient_name,
    retry_after,
    wait_asked,
    with_retries,
)


def test_langchain_openais_own_connection_and_timeout_errors_are_transient():
    # langchain-openai wraps openai's errors in subclasses with other names and no status code:
    # a dropped keep-alive connection to llama.cpp's server failed a trajectory without a retry.
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    assert is_transient(OpenAIConnectionError(message="Connection error.", request=request))
    assert is_transient(OpenAITimeoutError(request=request))
    assert not is_transient(ValueError("malformed"))


def test_their_recorded_names_are_transient_too():
    # The bench reads a recorded "Name: message": a ServerChatModel call to a dead server is recorded
    # as OpenAIConnectionError, which was not taken for an outage, so the question was recorded with
    # fallback reports or the majority vote instead of being left for a rerun.
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    for exc in (
        OpenAIConnectionError(message="Connection error.", request=request),
        OpenAITimeoutError(request=request),
    ):
        assert is_transient_name(type(exc).__name__)
    for name in ("OpenAIRateLimitError", "OpenAIAPIError", "ModelConnectionError", "ModelTimeoutError"):
        assert is_transient_name(name)
    assert not is_transient_name("OpenAIInvalidRequestError") and not is_transient_name("OpenAIContextOverflowError")


async def test_a_dropped_connection_is_retried_and_the_call_succeeds():
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    calls = []

    async def call() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise OpenAIConnectionError(message="Connection error.", request=request)
        return "ok"

    assert await with_retries(call, base_delay=0.0) == "ok"
    assert len(calls) == 2


def test_httpx_transport_errors_are_transient():
    # For tools that call a service with httpx directly: a refused or dropped connection, a
    # connection closed mid-response, any timeout.
    request = httpx.Request("GET", "http://127.0.0.1:1/")
    for exc in (
        httpx.ConnectError("refused", request=request),
        httpx.ReadError("reset", request=request),
        httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request),
        httpx.WriteTimeout("slow", request=request),
        httpx.PoolTimeout("pool", request=request),
    ):
        assert is_transient(exc), type(exc).__name__
    assert not is_transient(httpx.UnsupportedProtocol("ftp://", request=request))


async def test_a_rate_limit_waits_what_its_retry_after_asks(monkeypatch):
    """A routed ServerChatModel leaves retries to the library (the openai client would have waited
    for Retry-After itself): the 0.5-1 s backoff would retry into the same rate limit."""
    import langgraph_parallelmuse.retry as retry

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(retry.asyncio, "sleep", sleep)
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    calls = []

    async def call() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RateLimitError(
                "rate limited", response=httpx.Response(429, headers={"retry-after": "7"}, request=request), body=None
            )
        if len(calls) == 2:
            raise RateLimitError(
                "rate limited",
                response=httpx.Response(429, headers={"retry-after": "3600"}, request=request),
                body=None,
            )
        return "ok"

    assert await with_retries(call) == "ok"
    assert slept[0] == 7.0 and slept[1] == retry.MAX_RETRY_AFTER  # a day's wait is capped


def test_retry_after_reads_an_http_date_and_any_header_case():
    """RFC 9110 allows an HTTP date in Retry-After (it read as no wait), and a client library that
    builds its own error may hold the headers in a plain dict, which does not ignore case."""
    from email.utils import format_datetime

    def error(headers: object) -> Exception:
        exc = Exception("rate limited")
        exc.response = type("Response", (), {"headers": headers})()
        return exc

    soon = format_datetime(datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after(error(httpx.Headers({"Retry-After": soon}))) <= 30
    assert retry_after(error({"Retry-After": "7"})) == 7.0
    assert retry_after(error({"RETRY-AFTER": soon})) > 25
    past = format_datetime(datetime.datetime(2015, 10, 21, 7, 28, tzinfo=datetime.UTC), usegmt=True)
    assert retry_after(error({"retry-after": past})) == 0.0  # already passed: no wait
    assert retry_after(error({"retry-after": "Wed Oct 21 07:28:00 2015"})) == 0.0  # asctime, GMT by rule
    for unreadable in ("soon", "", "nan", "inf", None):
        assert retry_after(error({"retry-after": unreadable})) == 0.0, unreadable


def test_retry_after_ms_is_read_first_in_milliseconds():
    """OpenAI sends Retry-After-Ms (the openai client reads it before Retry-After): read as no wait, a
    routed ServerChatModel retried at once into the same rate limit."""

    def error(headers: dict) -> Exception:
        exc = Exception("rate limited")
        exc.response = httpx.Response(429, headers=headers)
        return exc

    assert retry_after(error({"retry-after-ms": "1500"})) == 1.5
    assert retry_after(error({"Retry-After-Ms": "250.5", "retry-after": "9"})) == 0.2505  # milliseconds win
    assert retry_after(error({"retry-after-ms": "soon", "retry-after": "9"})) == 9.0  # unreadable: the next
    assert retry_after(error({"retry-after-ms": "3600000"})) == MAX_RETRY_AFTER
    assert retry_after(error({"retry-after-ms": "-5"})) == 0.0


async def test_a_server_that_cannot_do_the_request_is_asked_once():
    # vLLM answers 501 for a NotImplementedError: three tries got three 501s, 1.8 s later.
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    calls = []

    async def call() -> str:
        calls.append(1)
        raise APIStatusError("NotImplementedError", response=httpx.Response(501, request=request), body=None)

    with pytest.raises(APIStatusError):
        await with_retries(call, base_delay=0.0)
    assert len(calls) == 1
    statuses = {
        s: is_transient(APIStatusError("x", response=httpx.Response(s, request=request), body=None))
        for s in (400, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504, 505, 520, 529)
    }
    assert [s for s, transient in statuses.items() if transient] == [408, 429, 500, 502, 503, 504, 520, 529]


async def test_a_request_timeout_is_retried_as_the_openai_client_would():
    # A routed ServerChatModel turns the openai client's retries off (it retries 408): a server's
    # 408 ended the trajectory on its first try. (409, which it retries too, is no sign of a server
    # down: the bench would read a judge's 409 as the judge unreachable.)
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    for status in (408,):
        calls = []

        async def call(status=status, calls=calls) -> str:
            calls.append(1)
            if len(calls) == 1:
                raise APIStatusError("busy", response=httpx.Response(status, request=request), body=None)
            return "answer"

        assert await with_retries(call, base_delay=0.0) == "answer", status
        assert len(calls) == 2


def test_a_broken_off_reply_is_transient_by_its_class_and_by_its_recorded_name() -> None:
    """Before: is_transient retried ServerChatModel's IncompleteReplyError (a ConnectionError), but a
    run's recorded "IncompleteReplyError: ..." read as no outage (is_transient_name)."""
    error = IncompleteReplyError("http://127.0.0.1:8000/v1 (model 'm') broke off its reply")
    assert is_transient(error) and is_transient_name(type(error).__name__)


def test_an_unreadable_or_non_finite_retry_after_ms_leaves_the_wait_to_retry_after():
    """A "nan" milliseconds value stopped the reading and asked no wait, where Retry-After asked 7 s."""

    class Limited(Exception):
        response = httpx.Response(429, headers={"retry-after-ms": "nan", "retry-after": "7"})

    class BytesHeader(Exception):  # a client that keeps header values as bytes
        response = type("Response", (), {"headers": {"retry-after": b"7"}})()

    assert retry_after(Limited()) == retry_after(BytesHeader()) == 7.0


def test_an_ask_of_exactly_the_cap_can_be_told_from_a_longer_one() -> None:
    """Capped, Retry-After: 60 and Retry-After: 600 both read 60: the Tavily tools said "at least 60 s"
    and gave up on a server that asked exactly 60, even with a 90 s timeout."""
    exact, longer = {"retry-after": str(MAX_RETRY_AFTER)}, {"retry-after": str(10 * MAX_RETRY_AFTER)}
    assert wait_asked(exact) == wait_asked(longer) == MAX_RETRY_AFTER  # what with_retries waits, at most
    assert wait_asked(exact, cap=math.inf) == MAX_RETRY_AFTER
    assert wait_asked(longer, cap=math.inf) == 10 * MAX_RETRY_AFTER
    assert wait_asked({"retry-after-ms": "-5"}, cap=math.inf) == 0.0  # still never below 0
