"""ServerChatModel's requests and check_server's diagnoses, against a fake loopback HTTP server.

tests/integration/test_vllm.py runs the same code against a real vLLM.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import ssl
import time
import urllib.request
import warnings
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from langchain_core._api import LangChainBetaWarning
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai.chat_models import _client_utils as langchain_client_utils
from langgraph.graph import START, StateGraph

from langgraph_parallelmuse.agent import pick_driver
from langgraph_parallelmuse.driver import FreeDriver, GuidedDriver
from langgraph_parallelmuse.errors import ConfigError, ProtocolError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.loopback import is_loopback
from langgraph_parallelmuse.models.routing import routing_scope
from langgraph_parallelmuse.models.server import (
    CONTINUE_FINAL_MESSAGE,
    DEFAULT_TIMEOUT,
    IncompleteReplyError,
    ServerChatModel,
    ServerCheckError,
    ServerSupport,
    check_server,
    route_id,
    served_models,
)
from langgraph_parallelmuse.retry import is_transient, with_retries
from langgraph_parallelmuse.segments import Gen, Sampling, generate_turn
from tests.unit.fakes import ScriptedChatModel, make_tools, research_responder
from tests.unit.http_fakes import FakeHTTP, Route, fake_http
from tests.unit.test_dropin import STEPS

QUESTION = [SystemMessage("Answer."), HumanMessage("Which river flows through Vienna?")]


def llm(base: str = "http://127.0.0.1:9/v1", **kw) -> ServerChatModel:
    return ServerChatModel(base_url=base, model="smollm2", logprobs=True, top_logprobs=4, max_retries=0, **kw)


def test_trailing_assistant_message_is_continued_and_user_extra_body_kept() -> None:
    model = llm(extra_body={"top_k": 20})
    kwargs = Sampling().kwargs(max_tokens=9, seed=3, model=model)  # the library's call kwargs
    body = model._get_request_payload([*QUESTION, AIMessage("<think>")], **kwargs)
    assert body["extra_body"] == {"top_k": 20, **CONTINUE_FINAL_MESSAGE}
    assert body["max_tokens"] == 9 and "max_completion_tokens" not in body  # written by the model itself
    assert body["messages"][-1] == {"role": "assistant", "content": "<think>"}
    plain = model._get_request_payload(QUESTION, **kwargs)
    assert plain["extra_body"] == {"top_k": 20} and plain["max_tokens"] == 9  # a new turn opens as usual


@pytest.mark.parametrize(
    ("kwargs", "env_key", "named"),
    [
        ({"base_url": "127.0.0.1:8000/v1"}, None, "base_url='127.0.0.1:8000/v1' must be an http:// or https:// URL"),
        # redact()'s URL patterns need "://": refused for lacking it, the URL printed its password.
        ({"base_url": "admin:sk-local-pw@127.0.0.1:8000/v1"}, None, "base_url='***@127.0.0.1:8000/v1' must be"),
        ({"api_key": "\u201csk-local-key\u201d"}, None, "the API key (api_key=) holds"),
        # A blank at its end: h11 refused the header, and each call said "Connection error.".
        ({}, "sk-local-key ", "the API key (OPENAI_API_KEY) holds"),
    ],
)
def test_a_base_url_without_scheme_or_a_key_no_header_carries_is_refused_when_built(
    kwargs: dict, env_key: str | None, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either failed every call, with "Connection error." or a UnicodeEncodeError naming neither."""
    if env_key is not None:
        monkeypatch.setenv("OPENAI_API_KEY", env_key)
    with pytest.raises(ConfigError, match=re.escape(named)) as caught:
        ServerChatModel(**{"base_url": "http://127.0.0.1:9/v1", "model": "m", **kwargs})
    assert "sk-local" not in str(caught.value)  # the key is never printed


@pytest.mark.parametrize("key", ["my local key", " sk-local-key", "sk-local\tkey"])
def test_a_key_httpx_sends_is_not_refused_when_built(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A space inside a key (a vLLM --api-key of two words) goes out as it is, and a server that asks
    no key ignores it: such a key, in OPENAI_API_KEY too, was refused though every call worked."""
    assert ServerChatModel(base_url="http://127.0.0.1:9/v1", model="m", api_key=key).openai_api_key
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert ServerChatModel(base_url="http://127.0.0.1:9/v1", model="m").openai_api_key


def test_an_openai_base_url_variable_without_scheme_is_refused_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The openai client reads OPENAI_BASE_URL when no base URL is given: one without its scheme was
    built, and each call failed with "Connection error."."""
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match=re.escape("OPENAI_BASE_URL='127.0.0.1:8000/v1' must be an http://")):
        ServerChatModel(model="m")


def test_the_server_checks_name_a_base_url_without_scheme_or_a_key_no_header_carries() -> None:
    """check_server said the server "answered with something that is not JSON" for a curly-quoted key."""
    with pytest.raises(ConfigError, match=re.escape("check_server: base_url='127.0.0.1:8000/v1' must be an http")):
        check_server("127.0.0.1:8000/v1", "m")
    with pytest.raises(ConfigError, match=re.escape("served_models: the API key (api_key=) holds")):
        served_models("http://127.0.0.1:9/v1", api_key="\u201csk-local-key\u201d")


def test_a_call_without_logprobs_sends_no_top_logprobs() -> None:
    """Reports and the aggregator ask for no logprobs; the model's top_logprobs must not go out with
    logprobs=false (vLLM answers HTTP 400: "when using `top_logprobs`, `logprobs` must be set to true")."""
    model = llm()
    body = model._get_request_payload(
        QUESTION, **Sampling(logprobs=False, top_logprobs=0).kwargs(max_tokens=4, seed=None, model=model)
    )
    assert body["logprobs"] is False and body["top_logprobs"] is None
    body = model._get_request_payload(QUESTION, **Sampling().kwargs(max_tokens=4, seed=None, model=model))
    assert body["logprobs"] is True and body["top_logprobs"] == 16


def test_token_bound_goes_out_as_max_tokens() -> None:
    body = llm(max_tokens=50)._get_request_payload(QUESTION)
    assert body["max_tokens"] == 50 and "max_completion_tokens" not in body
    assert llm()._get_request_payload(QUESTION, max_tokens=7)["max_tokens"] == 7


def test_prefill_is_declared_to_the_driver_and_can_be_switched_off() -> None:
    assert isinstance(pick_driver(llm(), "auto"), GuidedDriver)
    off = llm(supports_prefill=False)
    assert isinstance(pick_driver(off, "auto"), FreeDriver)
    assert "extra_body" not in off._get_request_payload([*QUESTION, AIMessage("<think>")])


def test_routing_header_carries_one_key_per_scope() -> None:
    model = llm(routing_header="x-smg-routing-key")
    report_prompt = [HumanMessage("Summarise this trajectory: ...")]
    with routing_scope("question one"):
        a = model._get_request_payload(QUESTION)["extra_headers"]
        b = model._get_request_payload(report_prompt)["extra_headers"]
    with routing_scope("question two"):
        c = model._get_request_payload(QUESTION)["extra_headers"]
    assert a == b == {"x-smg-routing-key": route_id("question one")}  # every call of one question
    assert c != a
    # Outside a scope the question (first human message) is the key, as for a trajectory.
    assert model._get_request_payload(QUESTION)["extra_headers"] == {
        "x-smg-routing-key": route_id("Which river flows through Vienna?")
    }
    assert "extra_headers" not in llm()._get_request_payload(QUESTION)


def _completion(prompt_tokens: int, logprobs: int | None = 16) -> dict:
    entry = {"token": "A", "logprob": -0.1, "top_logprobs": [{"token": "A", "logprob": -0.1}] * (logprobs or 0)}
    return {
        "choices": [
            {"message": {"role": "assistant", "content": "A"}, "logprobs": {"content": [entry]} if logprobs else None}
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
    }


def fake_server(
    *,
    closes_turn: bool = False,
    logprobs: int | None = 16,
    rejects_continue: bool = False,
    prompt_logprobs: str = "ignored",
) -> dict:
    """A chat server whose prompt is 30 tokens + 1 per prefilled token (+ 5 if it closes the turn);
    ``prompt_logprobs`` is "ignored" (llama.cpp), "refused" (HTTP 400) or "returned" (vLLM)."""

    def chat(body: dict) -> tuple[int, dict]:
        if rejects_continue and "continue_final_message" in body:
            return 400, {"error": {"message": "Unrecognized request argument: continue_final_message"}}
        if prompt_logprobs == "refused" and "prompt_logprobs" in body:
            return 400, {"error": {"message": "Unrecognized request argument: prompt_logprobs"}}
        tokens = 30
        if body["messages"][-1]["role"] == "assistant":
            tokens += 1 + (5 if closes_turn or not body.get("continue_final_message") else 0)
        reply = _completion(tokens, logprobs if body.get("logprobs") else None)
        if prompt_logprobs == "returned" and body.get("prompt_logprobs"):
            reply["prompt_logprobs"] = [None] + [{"7": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}}] * 29
        return 200, reply

    return {
        "GET /v1/models": lambda _: (200, {"object": "list", "data": [{"id": "smollm2"}, {"id": "other"}]}),
        "POST /v1/chat/completions": chat,
    }


def test_check_server_passes_a_capable_server_and_sends_what_it_checks() -> None:
    with fake_http(fake_server()) as fake:
        check_server(f"{fake.url}/v1", "smollm2")
    chats = [r.body for r in fake.requests if r.path == "/v1/chat/completions"]
    assert chats[0]["logprobs"] is True and chats[0]["top_logprobs"] == 16
    (continued,) = [c for c in chats if "continue_final_message" in c]
    assert chats[-1]["prompt_logprobs"] == 1  # the scoring probe comes last
    assert continued["continue_final_message"] is True and continued["add_generation_prompt"] is False
    assert continued["messages"][-1] == {"role": "assistant", "content": "A"}


@pytest.mark.parametrize(("prompt_logprobs", "scoring"), [("returned", True), ("ignored", False), ("refused", False)])
def test_check_server_finds_whether_the_server_can_score(prompt_logprobs: str, scoring: bool) -> None:
    """Only vLLM returns prompt_logprobs; a model declared scoring on another server failed at the
    guided driver's first answer step. Not scoring is a finding, not an error."""
    with fake_http(fake_server(prompt_logprobs=prompt_logprobs)) as fake:
        support = check_server(f"{fake.url}/v1", "smollm2")
        assert support == ServerSupport(prefill=True, scoring=scoring)
        assert check_server(f"{fake.url}/v1", "smollm2", prefill=False).prefill is False
    model = llm(**support.model_flags())
    assert model.supports_scoring is scoring and model.supports_prefill is True


def test_unreachable_url_is_named() -> None:
    from langgraph_parallelmuse.serving import free_port

    base = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerCheckError, match=rf"{base} is unreachable .*'smollm2'.*base_url="):
        check_server(base, "smollm2")


def test_wrong_base_url_is_named() -> None:
    with fake_http(fake_server()) as fake:  # the API root without /v1: /models is a 404 there
        with pytest.raises(ServerCheckError, match=r"/models answered HTTP 404 .*base_url="):
            check_server(fake.url, "smollm2")


@pytest.mark.parametrize(("key", "said"), [(None, "no key was sent"), ("sk-wrong", "the key sent was refused")])
def test_a_server_that_wants_a_key_names_the_key_not_the_url(key, said) -> None:
    unauthorized = {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}
    with fake_http({"GET /v1/models": lambda body: (401, unauthorized)}) as fake:
        with pytest.raises(ServerCheckError) as info:
            check_server(f"{fake.url}/v1", "gpt-4.1-mini", api_key=key)
    message = str(info.value)
    assert "answered HTTP 401 (Incorrect API key provided)" in message and said in message
    assert "OPENAI_API_KEY" in message and "base_url=" not in message
    assert key is None or key not in message


def test_unknown_model_lists_the_served_ones_and_the_flag() -> None:
    with fake_http(fake_server()) as fake:
        with pytest.raises(ServerCheckError) as info:
            check_server(f"{fake.url}/v1", "smollm")
    message = str(info.value)
    assert f"{fake.url}/v1 serves no model 'smollm'" in message
    assert "['smollm2', 'other']" in message and "--served-model-name smollm" in message


def test_missing_or_too_few_logprobs_are_named() -> None:
    with fake_http(fake_server(logprobs=None)) as fake:
        with pytest.raises(ServerCheckError, match=r"returned no logprobs for model 'smollm2'.*mode='none'"):
            check_server(f"{fake.url}/v1", "smollm2")
    with fake_http(fake_server(logprobs=5)) as fake:
        with pytest.raises(ServerCheckError, match=r"returned 5 top_logprobs .* 16 asked.*--max-logprobs 16"):
            check_server(f"{fake.url}/v1", "smollm2")
        check_server(f"{fake.url}/v1", "smollm2", top_logprobs=5, prefill=False)


def test_a_server_that_closes_the_turn_cannot_drive_the_guided_driver() -> None:
    with fake_http(fake_server(closes_turn=True)) as fake:
        with pytest.raises(ServerCheckError) as info:
            check_server(f"{fake.url}/v1", "smollm2")
        check_server(f"{fake.url}/v1", "smollm2", prefill=False)  # the free driver still works
    message = str(info.value)
    assert "closed the trailing assistant message" in message and "grew by 6 tokens" in message
    assert "driver='free'" in message and "supports_prefill=False" in message


def test_a_server_that_rejects_the_flags_is_named() -> None:
    with fake_http(fake_server(rejects_continue=True)) as fake:
        with pytest.raises(ServerCheckError, match=r"refused continue_final_message .*HTTP 400, Unrecognized"):
            check_server(f"{fake.url}/v1", "smollm2")


# Python's http.server (a static v1/models file served) answers a POST so.
_STATIC_SERVERS_501 = """<!DOCTYPE HTML>
<html lang="en">
    <head>
        <title>Error response</title>
    </head>
    <body>
        <h1>Error response</h1>
        <p>Message: Unsupported method ('POST').</p>
    </body>
</html>
"""
_VLLMS_REFUSAL = {"error": {"message": "Requested sample logprobs of 16, which is greater than max allowed: 5"}}


@pytest.mark.parametrize(
    ("status", "reply", "said", "advice"),
    [
        (
            400,
            _VLLMS_REFUSAL,
            "refused logprobs=true, top_logprobs=16 for model 'smollm2': HTTP 400, Requested",
            "--max-logprobs 16",
        ),
        (
            501,
            _STATIC_SERVERS_501,
            "answered HTTP 501 (Error response Error response Message: Unsupported method ('POST').)",
            "is this an OpenAI-compatible server?",
        ),
        (
            404,
            {"detail": "Not Found"},
            "/v1/chat/completions answered HTTP 404 (Not Found)",
            "no chat completions endpoint",
        ),
        (  # the API's own 404 is about the model, not the route
            404,
            {"error": {"message": "The model `smollm2` does not exist or you do not have access to it."}},
            "answered HTTP 404 (The model `smollm2` does not exist",
            "check the model name (--model)",
        ),
        (
            429,
            {"error": {"message": "You exceeded your current quota"}},
            "answered HTTP 429 (You exceeded your current quota)",
            "rate-limited or over the account's quota",
        ),
        (
            500,
            {"error": {"message": "CUDA out of\n memory"}},
            "answered HTTP 500 (CUDA out of memory)",
            "the server failed on the request; read its log",
        ),
        (
            401,
            {"error": {"message": "Invalid key"}},
            "answered HTTP 401 (Invalid key)",
            "no key was sent; set OPENAI_API_KEY",
        ),
    ],
)
def test_a_failed_chat_check_names_its_cause_on_one_line_and_only_a_refusal_gets_the_logprobs_fix(
    status: int, reply: Any, said: str, advice: str
) -> None:
    """Any status was taken for a logprobs refusal: a static file server's 501 was told to start vLLM
    with --max-logprobs, under its whole HTML page."""
    routes = {
        "GET /v1/models": lambda _: (200, {"data": [{"id": "smollm2"}]}),
        "POST /v1/chat/completions": lambda _: (status, reply),
    }
    with fake_http(routes) as fake:
        with pytest.raises(ServerCheckError) as info:
            check_server(f"{fake.url}/v1", "smollm2")
    message = str(info.value)
    assert said in message and advice in message, message
    assert "\n" not in message and "<" not in message
    assert ("--max-logprobs" in message) == (status == 400)


async def test_requests_reach_the_server_with_header_bound_and_flags() -> None:
    with fake_http(fake_server()) as fake:
        model = llm(f"{fake.url}/v1", routing_header="x-session-id")
        with routing_scope("q-7"):
            reply = await model.ainvoke(
                [*QUESTION, AIMessage("<think>")], **Sampling().kwargs(max_tokens=5, seed=1, model=model)
            )
    sent = fake.requests[-1]
    assert sent.headers["x-session-id"] == route_id("q-7")
    assert sent.body["max_tokens"] == 5 and "max_completion_tokens" not in sent.body
    assert sent.body["continue_final_message"] is True and sent.body["add_generation_prompt"] is False
    assert reply.response_metadata["logprobs"]["content"][0]["token"] == "A"


def test_a_server_model_times_out_and_a_routed_one_leaves_the_retries_to_the_library() -> None:
    """ChatOpenAI's defaults wait forever, and the openai client's retries resend one routing key (and,
    inside the library's tries, a hung request 9 times); the library's retries honour a 429's Retry-After."""
    plain, routed = ServerChatModel(model="m"), ServerChatModel(model="m", routing_header="x-session-id")
    assert plain.request_timeout == routed.request_timeout == DEFAULT_TIMEOUT
    assert routed.async_client._client.timeout == DEFAULT_TIMEOUT  # what reaches the openai client
    assert routed.async_client._client.max_retries == plain.async_client._client.max_retries == 0
    mine = ServerChatModel(model="m", routing_header="x-session-id", timeout=30, max_retries=1)
    assert mine.request_timeout == 30 and mine.max_retries == 1


async def test_a_retried_call_is_routed_under_another_key_and_the_next_call_goes_home() -> None:
    """A replica that fails keeps its keys until the router drops it (a hung one: never): the library's
    retry sends another key, so the router may pick another replica; later calls keep the question's key."""
    healthy = fake_server()["POST /v1/chat/completions"]
    answers = iter([(500, {"error": {"message": "EngineDeadError"}})])
    routes = {**fake_server(), "POST /v1/chat/completions": lambda body: next(answers, None) or healthy(body)}
    with fake_http(routes) as fake:
        model = llm(f"{fake.url}/v1", routing_header="x-session-id")
        with routing_scope("q-7"):
            for _ in range(2):  # the first turn fails once, the second does not
                turn = await generate_turn(model, QUESTION, [Gen(max_tokens=3)], sampling=Sampling(), seed=1)
                assert turn.text == "A"
    sent = [r.headers["x-session-id"] for r in fake.requests]
    assert sent == [route_id("q-7"), route_id("q-7", attempt=1), route_id("q-7")]
    assert len(set(sent)) == 2


def test_a_server_that_dies_mid_request_is_not_called_unreachable() -> None:
    def crash(_body: dict) -> tuple[int, dict]:
        raise ConnectionAbortedError("segfault")  # the handler dies: the connection closes unanswered

    routes = {**fake_server(), "POST /v1/chat/completions": crash}
    with fake_http(routes) as fake:
        with pytest.raises(ServerCheckError, match=r"/v1/chat/completions dropped the request .*crashed; read its log"):
            check_server(f"{fake.url}/v1", "smollm2")


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHTTP]:
    """A recording HTTP proxy in ``http_proxy`` and no ``no_proxy``, as a fresh process sees them."""
    with fake_http({}) as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        for name in ("HTTP_PROXY", "no_proxy", "NO_PROXY", "REQUEST_METHOD", "OPENAI_PROXY"):
            monkeypatch.delenv(name, raising=False)
        # urlopen() reads the proxy variables once per process, when it first builds its opener.
        monkeypatch.setattr(urllib.request, "_opener", None)
        yield proxy


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_local_server_is_asked_directly_with_http_proxy_set(proxied: FakeHTTP, host: str) -> None:
    """With http_proxy set and 127.0.0.1 not in no_proxy, check_server (urllib) and every chat call
    (ChatOpenAI's httpx clients) went to the proxy, the API key in their Authorization header."""
    with fake_http(fake_server()) as fake:
        base = fake.url.replace("127.0.0.1", host) + "/v1"
        check_server(base, "smollm2", api_key="sk-local-0123456789")
        model = llm(base, api_key="sk-local-0123456789")
        assert model.invoke(QUESTION).content == "A"
        assert (await model.ainvoke(QUESTION)).content == "A"
    assert proxied.requests == []
    assert [r.path for r in fake.requests[-2:]] == ["/v1/chat/completions"] * 2
    assert {r.headers["authorization"] for r in fake.requests} == {"Bearer sk-local-0123456789"}


async def test_a_remote_server_is_asked_through_the_environments_proxy(proxied: FakeHTTP) -> None:
    """A user's vLLM on another host may be reachable through the proxy only."""
    base = "http://vllm.example:8000/v1"
    server = fake_server()  # the proxy answers as the remote server (a proxy's request line holds the whole URL)
    proxied.routes[f"GET {base}/models"] = server["GET /v1/models"]
    proxied.routes[f"POST {base}/chat/completions"] = server["POST /v1/chat/completions"]
    assert served_models(base) == ["smollm2", "other"]
    assert (await llm(base).ainvoke(QUESTION)).content == "A"
    assert [r.path for r in proxied.requests] == [f"{base}/models", f"{base}/chat/completions"]


def test_a_remote_servers_sync_calls_go_through_the_environments_proxy_too(
    proxied: FakeHTTP, monkeypatch, caplog
) -> None:
    """Handed ServerChatModel's async client, ChatOpenAI gave its own sync client its TCP keepalive options
    through a custom transport, which bypasses the environment's proxy: invoke() of a server reachable
    only through the proxy failed with "Connection error." (ainvoke() answered), and it warned."""
    monkeypatch.setattr(langchain_client_utils, "_proxy_env_warning_emitted", False)  # it warns once a process
    # A URL of its own: ChatOpenAI caches its clients per URL, with the proxy they read when made.
    base = "http://vllm-sync.example:8000/v1"
    proxied.routes[f"POST {base}/chat/completions"] = fake_server()["POST /v1/chat/completions"]
    with caplog.at_level(logging.WARNING, logger="langchain_openai"):
        assert llm(base).invoke(QUESTION).content == "A"
    assert [r.path for r in proxied.requests] == [f"{base}/chat/completions"]
    assert not caplog.records


def test_a_no_proxy_setting_alone_brings_no_warning_about_a_shadowed_proxy(monkeypatch, caplog) -> None:
    """no_proxy (or ftp_proxy) alone is a proxy setting to langchain-openai: handed ServerChatModel's async
    client, ChatOpenAI gave its sync client the socket options and warned that they disable the
    environment's proxy, which ChatOpenAI alone never did."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    monkeypatch.setattr(langchain_client_utils, "_proxy_env_warning_emitted", False)
    with caplog.at_level(logging.WARNING, logger="langchain_openai"):
        llm()
    assert not caplog.records


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="TCP_KEEPIDLE is Linux's")
async def test_the_async_connections_take_langchain_openais_keepalive_settings(monkeypatch) -> None:
    """ServerChatModel's async pool copied ChatOpenAI's keepalive options, not its environment variables:
    LANGCHAIN_OPENAI_TCP_KEEPIDLE (and the others langchain-openai documents) changed nothing."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANGCHAIN_OPENAI_TCP_KEEPIDLE", "37")
    set_options: list[tuple] = []
    setsockopt = socket.socket.setsockopt
    with fake_http(fake_server()) as fake:
        model = llm(f"{fake.url}/v1")  # langchain-openai tries its options on a socket of its own here
        monkeypatch.setattr(socket.socket, "setsockopt", lambda sock, *o: set_options.append(o) or setsockopt(sock, *o))
        assert (await model.ainvoke(QUESTION)).content == "A"
    assert (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 37) in set_options


def test_a_server_chat_model_loads_no_certificates_when_made(monkeypatch) -> None:
    """Each one built a client whose own transport was never used, loading the system's CA certificates
    (about 80 ms a model); ChatOpenAI's cached clients load them once."""
    llm()  # ChatOpenAI's cached clients, made once
    loaded: list[Any] = []
    load = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(
        ssl.SSLContext, "load_verify_locations", lambda ctx, *a, **k: loaded.append(a) or load(ctx, *a, **k)
    )
    for _ in range(3):
        llm()
    assert loaded == []


def _prompt_logprobs(prompt: list[tuple[str, float | None]]) -> list[dict | None]:
    """vLLM's prompt_logprobs of ``(token text, logprob)`` pairs (``None``: the first token, unscored)."""
    return [
        {str(i): {"logprob": lp, "rank": 1, "decoded_token": t}} if lp else None for i, (t, lp) in enumerate(prompt)
    ]


async def test_a_continuation_is_scored_from_vllms_prompt_logprobs() -> None:
    """vLLM-shaped prompt_logprobs: the continuation's tokens and the template's end of turn after it."""
    prompt = [("<|im_start|>", None), ("assistant", -3.0), ("\n", -0.5), ("D", -1.0), ("\ufffd", -0.2)]
    prompt += [("\ufffd", -0.1), ("sseldorf", -0.3), ("<|im_end|>", -0.7), ("\n", -0.01)]

    def chat(body: dict) -> tuple[int, dict]:
        reply = _completion(len(prompt), None)
        return 200, {**reply, "prompt_logprobs": _prompt_logprobs(prompt)}

    with fake_http({**fake_server(), "POST /v1/chat/completions": chat}) as fake:
        reply = await llm(f"{fake.url}/v1").ainvoke(QUESTION, continuation="Düsseldorf")
    sent = fake.requests[-1].body
    # The template closes the reply (so its end-of-turn token is scored); one token is generated.
    assert sent["messages"][-1] == {"role": "assistant", "content": "Düsseldorf"}
    assert sent["prompt_logprobs"] == 4 and sent["max_tokens"] == 1  # the model's top_logprobs
    assert sent["continue_final_message"] is False and sent["add_generation_prompt"] is False
    assert reply.content == "Düsseldorf" and reply.response_metadata["end_logprob"] == -0.7
    assert [e["logprob"] for e in reply.response_metadata["logprobs"]["content"]] == [-1.0, -0.2, -0.1, -0.3]


async def test_a_server_without_prompt_logprobs_is_named_when_asked_to_score() -> None:
    with fake_http(fake_server()) as fake:
        with pytest.raises(ServerCheckError, match="no prompt_logprobs: scoring a continuation needs vLLM"):
            await llm(f"{fake.url}/v1").ainvoke(QUESTION, continuation="Vienna")


async def test_an_option_no_prompt_tokens_spell_fails_its_trajectory_not_the_run() -> None:
    """The option's text, not the server's set-up: a ServerCheckError (a ConfigError) ended every trajectory."""
    from langgraph_parallelmuse.errors import ends_the_run

    prompt = [
        ("<|im_start|>", None),
        ("assistant", -3.0),
        ("\n", -0.5),
        ("fi", -1.0),
        ("sh", -1.0),
        ("<|im_end|>", -0.7),
    ]

    def chat(body: dict) -> tuple[int, dict]:
        return 200, {**_completion(len(prompt), None), "prompt_logprobs": _prompt_logprobs(prompt)}

    with fake_http({**fake_server(), "POST /v1/chat/completions": chat}) as fake:
        with pytest.raises(ProtocolError, match="no run of prompt tokens spells the continuation '\ufb01sh'") as info:
            await llm(f"{fake.url}/v1").ainvoke(QUESTION, continuation="\ufb01sh")  # a ligature the tokenizer split
    assert not ends_the_run(info.value)


@pytest.mark.parametrize(
    ("continuation", "pieces"),
    [
        ("São Tomé", ["S", "\ufffd", "\ufffd", "o", " T", "om", "\ufffd", "\ufffd"]),
        ("Ærø", ["\ufffd", "\ufffd", "r", "\ufffd", "\ufffd"]),
        ("東京", ["\ufffd"] * 6),
    ],
)
async def test_a_continuation_with_characters_split_over_tokens_is_scored_to_its_end_of_turn(continuation, pieces):
    # Before the fix the span dropped a byte token at a split edge (the "end" logprob was a byte of
    # the last character, not the end of turn), and two adjacent split characters aborted the run.
    prompt = [("<|im_start|>", None), ("assistant", -3.0), ("\n", -0.5)]
    prompt += [(p, -1.0 - i) for i, p in enumerate(pieces)] + [("<|im_end|>", -0.7), ("\n", -0.01)]

    def chat(body: dict) -> tuple[int, dict]:
        return 200, {**_completion(len(prompt), None), "prompt_logprobs": _prompt_logprobs(prompt)}

    with fake_http({**fake_server(), "POST /v1/chat/completions": chat}) as fake:
        reply = await llm(f"{fake.url}/v1").ainvoke(QUESTION, continuation=continuation)
    content = reply.response_metadata["logprobs"]["content"]
    assert reply.response_metadata["end_logprob"] == -0.7
    assert [e["logprob"] for e in content] == [-1.0 - i for i in range(len(pieces))]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == continuation


# ----------------------------------------------------------------------------- streamed, as a chat UI runs a graph


async def _streamed(graph: Any, inp: dict, how: str) -> dict:
    """The final state of a run streamed ``how``: LangGraph's ``stream_mode="messages"`` (the README's
    chat mode), or langchain-core's v2 event streaming (``astream_events(version="v3")``)."""
    if how == "v3":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LangChainBetaWarning)  # the v3 protocol is experimental
            run = await graph.astream_events(inp, version="v3")
        return await run.output()
    final: dict = {}
    async for mode, chunk in graph.astream(inp, stream_mode=["messages", "values"]):
        final = chunk if mode == "values" else final
    return final


def _streaming(route: Route) -> Route:
    """``route`` answered as an SSE stream when the request asks to stream, with the usage only
    when asked for (``stream_options.include_usage``), as vLLM does."""

    def answer(body: dict) -> tuple[int, Any]:
        status, reply = route(body)
        if not body.get("stream"):
            return status, reply
        choice = reply["choices"][0]
        chunks = [
            {"choices": [{"index": 0, "delta": choice["message"], "logprobs": choice["logprobs"]}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"choices": [], "usage": reply["usage"]})
        head = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        return status, "".join(f"data: {json.dumps({**head, **c})}\n\n" for c in chunks) + "data: [DONE]\n\n"

    return answer


@pytest.mark.parametrize("how", ["messages", "v3"])
async def test_the_guided_aggregators_scoring_calls_are_not_streamed_under_a_streaming_chat(how: str) -> None:
    """Streamed, langchain-core sent every call through ChatOpenAI's _astream, which passed continuation=
    to the openai client (a TypeError): the guided aggregator fell back to the majority vote."""

    def scoring(body: dict) -> tuple[int, dict]:  # vLLM scoring the closed reply, one token per character
        option = [(c, -0.3) for c in body["messages"][-1]["content"]]
        prompt = [("<|im_start|>", None), ("assistant", -3.0), *option, ("<|im_end|>", -0.7), ("\n", -0.01)]
        return 200, {**_completion(len(prompt), None), "prompt_logprobs": _prompt_logprobs(prompt)}

    with fake_http({**fake_server(), "POST /v1/chat/completions": _streaming(scoring)}) as fake:
        agent = ScriptedChatModel(responder=research_responder(lambda i, messages: STEPS[min(i, 2)]))
        aggregator = llm(f"{fake.url}/v1")
        graph = create_parallelmuse(
            agent, make_tools()[0], aggregator_model=aggregator, config={"n": 2, "mode": "none"}
        )
        out = await _streamed(graph, {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}, how)
    assert (out["answer_source"], out["answer"]) == ("aggregator", "Paris")
    assert fake.requests and all("prompt_logprobs" in r.body and not r.body.get("stream") for r in fake.requests)


class _Turn(TypedDict, total=False):
    context_tokens: int


async def test_a_streamed_call_asks_for_its_usage_so_its_prompt_tokens_count() -> None:
    """ChatOpenAI asks a stream for its usage only on OpenAI's own URL: streamed, every call to vLLM
    counted 0 prompt tokens, and a step's context never reached max_context_tokens."""
    with fake_http(
        {**fake_server(), "POST /v1/chat/completions": _streaming(fake_server()["POST /v1/chat/completions"])}
    ) as fake:
        model = llm(f"{fake.url}/v1")

        async def step(_state: _Turn) -> _Turn:
            turn = await generate_turn(model, QUESTION, [Gen(max_tokens=3)], sampling=Sampling(), seed=1)
            return {"context_tokens": turn.context_tokens}

        graph = StateGraph(_Turn)
        graph.add_node("step", step)
        graph.add_edge(START, "step")
        out = await _streamed(graph.compile(), {}, "messages")
    assert fake.requests[-1].body["stream"] is True
    assert out["context_tokens"] == 30  # the fake's prompt
    assert llm(stream_usage=False).stream_usage is False  # a server that refuses stream_options


# A str route is sent as it is: '"Not Found"' is the JSON string, "Not Found" plain text.
@pytest.mark.parametrize(
    ("status", "body"), [(200, [{"id": "smollm2"}]), (404, '"Not Found"'), (200, '"ok"'), (404, "Not Found")]
)
def test_check_server_names_base_url_when_a_reply_is_json_but_not_an_object(status: int, body: object) -> None:
    """Before, a JSON list or string raised AttributeError instead of the diagnosis naming base_url=."""
    with fake_http({"GET /v1/models": lambda _: (status, body)}) as fake:
        with pytest.raises(ServerCheckError, match=rf"/v1/models answered HTTP {status} .*base_url="):
            check_server(f"{fake.url}/v1", "smollm2")


def test_check_server_keeps_a_key_passed_in_out_of_its_error() -> None:
    """Only the environment's keys were redacted: a server echoing the key passed in printed it."""
    key = "sk-live-4f9a8b7c6d5e4f3a2b1c"

    def refuse(_body: dict) -> tuple[int, dict]:
        return 401, {"error": {"message": f"Incorrect API key provided: {key}"}}

    with fake_http({"GET /v1/models": refuse}) as fake:
        for check in (
            lambda: check_server(f"{fake.url}/v1", "m", api_key=key),
            lambda: served_models(f"{fake.url}/v1", api_key=key),
        ):
            with pytest.raises(ServerCheckError, match="answered HTTP 401") as err:
                check()
            assert key not in str(err.value)


@pytest.mark.parametrize(
    "reply",
    [
        b'HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{"data": [',
        b'HTTP/1.1 503 Service Unavailable\r\ncontent-length: 500\r\n\r\n{"error": ',
        b"SSH-2.0-OpenSSH_9.2\r\n",
    ],
)
def test_a_reply_cut_off_or_not_http_is_a_server_check_error_naming_the_url(reply: bytes) -> None:
    """http.client's IncompleteRead and BadStatusLine passed as bare tracebacks naming no server (an
    error status's body cut off too, until the body was read with the reply's deadline)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(reply)
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    with pytest.raises(ServerCheckError, match=f"{url}/models broke off its reply"):
        served_models(url)
    listener.close()


def test_a_hung_server_is_asked_once_per_library_try_and_its_error_names_it() -> None:
    """The openai client's 2 retries inside the library's 3 tries sent a hung request 9 times (600 s
    each by default), and the trajectory's error said only "Connection error."."""
    import time

    from langgraph_parallelmuse.agent import _ended_by

    def hang(_body: dict) -> tuple[int, dict]:
        time.sleep(1.0)
        return 200, {}

    with fake_http({"POST /v1/chat/completions": hang}) as fake:
        model = ServerChatModel(base_url=f"{fake.url}/v1", model="smollm2", timeout=0.3)
        with pytest.raises(Exception, match="timed out") as err:
            model.invoke("hi")
        assert len(fake.requests) == 1
    dead = ServerChatModel(base_url=f"{fake.url}/v1", model="smollm2")
    assert f"({fake.url}/v1)" in _ended_by(err.value, 2, dead, trimmed=False)["error"]


def test_a_mistyped_base_url_is_named_as_one() -> None:
    with pytest.raises(ServerCheckError, match=r"http://127.0.0.1:80OO/v1 is not a valid URL .*base_url="):
        served_models("http://127.0.0.1:80OO/v1")


@pytest.mark.parametrize("password", ["Sup3rSecretPw", "pw1", "Xq7:Zv9"])
def test_a_base_urls_password_is_kept_out_of_the_invalid_url_error(password: str) -> None:
    """Without a port, http.client reads the password as one ("nonnumeric port: 'PASSWORD@host'")
    and its error printed it."""
    with pytest.raises(ServerCheckError, match=r"is not a valid URL \(nonnumeric port: '\*\*\*@127.0.0.1'\)") as err:
        served_models(f"http://alice:{password}@127.0.0.1/v1", timeout=2)
    assert not any(part in str(err.value) for part in password.split(":"))


# ----------------------------------------------------------------------------- malformed replies name server and field

# "Vienna" as vLLM scores the closed reply: the continuation's tokens, the end of turn, a newline.
_VIENNA = [("<|im_start|>", None), ("assistant", -3.0), ("\n", -0.5), ("Vi", -1.0), ("enna", -0.3)]
_VIENNA += [("<|im_end|>", -0.7), ("\n", -0.01)]


def _scoring_reply() -> dict:
    """A well-formed scoring reply for "Vienna", with an alternative (rank 2) at "Vi"."""
    reply = {**_completion(len(_VIENNA), None), "prompt_logprobs": _prompt_logprobs(_VIENNA)}
    reply["prompt_logprobs"][3]["99"] = {"logprob": -2.0, "rank": 2, "decoded_token": "X"}
    return reply


def _set(path: tuple, value: Any) -> Any:
    """A change to a reply: ``value`` at ``path`` (a key path into the JSON), or the key dropped (``...``)."""

    def change(reply: dict) -> None:
        *head, last = path
        for key in head:
            reply = reply[key]
        if value is ...:
            del reply[last]
        else:
            reply[last] = value

    return change


async def _score(reply: dict, continuation: str = "Vienna") -> AIMessage:
    with fake_http({**fake_server(), "POST /v1/chat/completions": lambda _body: (200, reply)}) as fake:
        return await llm(f"{fake.url}/v1").ainvoke(QUESTION, continuation=continuation)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        # Before: IndexError, TypeError, KeyError or AttributeError naming neither server nor field.
        (_set(("choices",), []), "choices is []"),
        (_set(("choices", 0, "message"), None), "choices[0].message is null"),
        (_set(("prompt_logprobs", 4, "4", "logprob"), None), 'prompt_logprobs[4]["4"].logprob is null'),
        (_set(("prompt_logprobs", 5, "5", "logprob"), None), 'prompt_logprobs[5]["5"].logprob is null'),
        (_set(("prompt_logprobs", 4, "4", "logprob"), ...), 'prompt_logprobs[4]["4"].logprob is missing'),
        (_set(("prompt_logprobs", 3, "99", "logprob"), None), 'prompt_logprobs[3]["99"].logprob is null'),
        (_set(("prompt_logprobs", 3, "99", "rank"), ...), 'prompt_logprobs[3]["99"].rank is missing'),
        (_set(("prompt_logprobs", 3, "99", "rank"), None), 'prompt_logprobs[3]["99"].rank is null'),
        (_set(("prompt_logprobs", 4), [{"logprob": -0.3, "rank": 1}]), "prompt_logprobs[4] is [{"),
        (_set(("prompt_logprobs", 4, "4"), -0.3), 'prompt_logprobs[4]["4"] is -0.3, not an object'),
        (_set(("prompt_logprobs",), {"4": -0.3}), 'prompt_logprobs is {"4": -0.3}, not a list'),
        (_set(("prompt_logprobs", 4, "4", "decoded_token"), 5), 'prompt_logprobs[4]["4"].decoded_token is 5'),
        # Before: read as numbers, silently: NaN scored the option, and a null end of turn was
        # skipped, so the token after it ("\n", -0.01) was scored as the end.
        (_set(("prompt_logprobs", 4, "4", "logprob"), "NaN"), 'prompt_logprobs[4]["4"].logprob is "NaN"'),
        (_set(("prompt_logprobs", 5), None), "prompt_logprobs[5] is null"),
        (_set(("prompt_logprobs", 5), {}), "prompt_logprobs[5] is {}"),
    ],
)
async def test_a_malformed_scoring_reply_is_a_protocol_error_naming_server_model_and_field(change, field) -> None:
    from langgraph_parallelmuse.errors import ends_the_run

    reply = _scoring_reply()
    change(reply)
    with pytest.raises(ProtocolError) as info:
        await _score(reply)
    message = str(info.value)
    assert "\n" not in message and "(model 'smollm2') sent a malformed reply: " in message
    assert message.startswith("http://127.0.0.1:") and field in message
    assert not ends_the_run(info.value)  # the reply's fault: it fails its trajectory only


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_set(("choices",), []), "choices is []"),  # before: IndexError
        (_set(("choices",), ...), "choices is null"),  # before: a TypeError (the openai client reads it as null)
        (_set(("choices", 0), "x"), 'choices[0] is "x"'),  # before: TypeError
        # Before: returned, the null read (a ProtocolError naming no server) only by whoever read it.
        (_set(("choices", 0, "logprobs", "content", 0, "logprob"), None), "logprobs.content[0].logprob is null"),
        (_set(("choices", 0, "logprobs", "content", 0, "top_logprobs"), 3), "content[0].top_logprobs is 3, not a list"),
        (
            _set(("choices", 0, "logprobs", "content", 0, "top_logprobs", 1, "logprob"), None),
            "choices[0].logprobs.content[0].top_logprobs[1].logprob is null",
        ),
        # Before: a pydantic ValidationError, then a TypeError, naming neither server nor field.
        (
            _set(
                ("choices", 0, "message", "tool_calls"),
                [{"id": "1", "type": "function", "function": {"name": "s", "arguments": {"q": "x"}}}],
            ),
            'choices[0].message.tool_calls[0].function.arguments is {"q": "x"}, not a JSON string',
        ),
        (
            _set(("choices", 0, "message", "tool_calls"), [{"id": "1", "type": "function"}]),
            "choices[0].message.tool_calls[0].function is null, not an object",
        ),
    ],
)
async def test_a_malformed_chat_reply_is_a_protocol_error_naming_server_model_and_field(change, field) -> None:
    reply = json.loads(json.dumps(_completion(30)))  # its top_logprobs are one object, repeated
    change(reply)
    with fake_http({**fake_server(), "POST /v1/chat/completions": lambda _body: (200, reply)}) as fake:
        with pytest.raises(
            ProtocolError, match=r"^http://127\.0\.0\.1:\d+/v1 \(model 'smollm2'\) sent a malformed"
        ) as info:
            await llm(f"{fake.url}/v1").ainvoke(QUESTION)
    assert field in str(info.value) and "\n" not in str(info.value)


async def test_a_malformed_streamed_reply_is_a_protocol_error_naming_server_model_and_field() -> None:
    """Before: the stream was read, and its null logprob failed only its reader ("logprob None is not a
    number"), naming no server."""
    reply = json.loads(json.dumps(_completion(30)))
    reply["choices"][0]["logprobs"]["content"][0]["logprob"] = None
    route = _streaming(lambda _body: (200, reply))
    with fake_http({"POST /v1/chat/completions": route}) as fake:
        model = llm(f"{fake.url}/v1", streaming=True)
        with pytest.raises(
            ProtocolError, match=r"^http://127\.0\.0\.1:\d+/v1 \(model 'smollm2'\) sent a malformed"
        ) as info:
            await model.ainvoke(QUESTION)
        assert "choices[0].logprobs.content[0].logprob is null" in str(info.value)
        reply["choices"][0]["logprobs"]["content"][0]["logprob"] = -0.1  # well formed: read as before
        assert (await model.ainvoke(QUESTION)).response_metadata["logprobs"]["content"][0]["logprob"] == -0.1
    assert fake.requests[-1].body["stream"] is True


async def test_well_formed_odd_replies_are_read_as_before() -> None:
    """A null message content (a tool call's) and a null logprobs content are no errors; an error the
    server put in the reply is still ChatOpenAI's ValueError carrying it."""
    reply = _completion(30)
    reply["choices"][0]["message"]["content"] = None
    reply["choices"][0]["logprobs"] = {"content": None}
    with fake_http({**fake_server(), "POST /v1/chat/completions": lambda _body: (200, reply)}) as fake:
        assert (await llm(f"{fake.url}/v1").ainvoke(QUESTION)).content == ""
    scoring = _scoring_reply()
    scoring["choices"][0]["message"]["content"] = None
    scored = await _score(scoring)
    assert scored.content == "Vienna" and scored.response_metadata["end_logprob"] == -0.7
    content = scored.response_metadata["logprobs"]["content"]
    assert content[0]["top_logprobs"] == [{"token": "Vi", "logprob": -1.0}, {"token": "X", "logprob": -2.0}]
    with fake_http({**fake_server(), "POST /v1/chat/completions": lambda _b: (200, {"error": "overloaded"})}) as fake:
        with pytest.raises(ValueError, match="overloaded") as info:
            await llm(f"{fake.url}/v1").ainvoke(QUESTION)
    assert not isinstance(info.value, ProtocolError)


# Llama 3's chat template writes each message as ``message['content'] | trim``.
_TRIMMING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n\n' + m['content'] | trim + '<|im_end|>' }}{% endfor %}"
)


@pytest.mark.parametrize("option", [" Vienna", "Vienna ", " the Danube\n"])
async def test_an_option_a_trimming_chat_template_strips_is_scored_as_the_text_it_scored(option: str) -> None:
    """Before: the prompt's tokens spelled the trimmed option, so no run spelled the option itself and
    scoring it was a ProtocolError (the in-memory BPE tokenizer shows vLLM's tokens of the prompt)."""
    from tests.unit.tiny_model import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    conversation = [{"role": "user", "content": "Which river?"}, {"role": "assistant", "content": option}]
    prompt = tokenizer.apply_chat_template(conversation, chat_template=_TRIMMING_TEMPLATE, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]  # vLLM's decoded_token: each token on its own
    assert pieces[-1] == "<|im_end|>" and "".join(pieces).endswith(f"{option.strip()}<|im_end|>")
    logprobs = [(piece, -1.0 - i / 100) for i, piece in enumerate(pieces)]
    reply = await _score(
        {**_completion(len(ids), None), "prompt_logprobs": _prompt_logprobs([(pieces[0], None), *logprobs[1:]])},
        option,
    )
    assert reply.content == option.strip()  # the text the template gave the model, and its tokens spell
    assert reply.response_metadata["end_logprob"] == logprobs[-1][1]
    content = reply.response_metadata["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == option.strip()


def test_the_unspecified_address_is_this_machine() -> None:
    assert is_loopback("0.0.0.0") and is_loopback("::") and is_loopback("[::]")
    assert not is_loopback("0.0.0.1") and not is_loopback("10.0.0.7")


@pytest.mark.parametrize("host", ["::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::ffff:0.0.0.0"])
def test_an_ipv4_mapped_loopback_address_is_this_machine(host: str) -> None:
    """Before: Python 3.11's ipaddress calls it no loopback, so a proxy in the environment was asked."""
    assert is_loopback(host)
    assert not is_loopback("::ffff:10.0.0.7")


def test_a_server_at_0_0_0_0_is_asked_directly_with_http_proxy_set(proxied: FakeHTTP) -> None:
    """vLLM run with --host 0.0.0.0 prints http://0.0.0.0:8000: asked through the proxy, the key went to
    the proxy and the server was "unreachable"."""
    chat = {"choices": [{"message": {"role": "assistant", "content": "A"}}], "usage": {"prompt_tokens": 3}}
    routes = {
        "GET /v1/models": lambda _: (200, {"data": [{"id": "m"}]}),
        "POST /v1/chat/completions": lambda _: (200, chat),
    }
    with fake_http(routes) as fake:
        base = fake.url.replace("127.0.0.1", "0.0.0.0") + "/v1"
        assert served_models(base, api_key="sk-local-0123456789") == ["m"]
        model = ServerChatModel(base_url=base, model="m", api_key="sk-local-0123456789")
        assert model.invoke("hi").content == "A"
    assert proxied.requests == []
    assert [r.path for r in fake.requests] == ["/v1/models", "/v1/chat/completions"]


# ----------------------------------------------------------------------------- replies the server broke off


def _sse(*chunks: dict, done: bool = True) -> str:
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "smollm2"}
    return "".join(f"data: {json.dumps({**head, **c})}\n\n" for c in chunks) + ("data: [DONE]\n\n" if done else "")


_PARTIAL = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "<answer>Vie"}}]}


@pytest.mark.parametrize("reason", ["abort", "error"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_reply_the_server_aborted_is_an_error_naming_the_server_not_a_turn(reason: str, streamed: bool) -> None:
    """Before: vLLM's (and SGLang's) finish_reason "abort" or "error" came back as the model's whole
    turn, its partial text read as the answer."""
    whole = {**_completion(30), "choices": [{**_completion(30)["choices"][0], "finish_reason": reason}]}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}
    route = (lambda _body: (200, _sse(_PARTIAL, last))) if streamed else (lambda _body: (200, whole))
    with fake_http({"POST /v1/chat/completions": route}) as fake:
        with pytest.raises(
            IncompleteReplyError, match=r"^http://127\.0\.0\.1:\d+/v1 \(model 'smollm2'\) broke off"
        ) as info:
            await llm(f"{fake.url}/v1", streaming=streamed).ainvoke(QUESTION)
    assert f"finish_reason {reason!r}" in str(info.value)
    assert isinstance(info.value, ProtocolError) and is_transient(info.value)  # retried, then fails its trajectory


@pytest.mark.parametrize("done", [False, True])
def test_a_stream_cut_off_before_its_finish_reason_is_an_error_not_a_turn(done: bool) -> None:
    """Before: a server that closed the connection mid-reply (no chunked encoding to tell) or sent an
    SSE error event left a partial reply that read as a whole turn (a cut "<answer>Vie" answered "Vie")."""
    with fake_http({"POST /v1/chat/completions": lambda _body: (200, _sse(_PARTIAL, done=done))}) as fake:
        with pytest.raises(IncompleteReplyError, match="without a finish_reason"):
            list(llm(f"{fake.url}/v1").stream(QUESTION))


@pytest.mark.parametrize("last", [{"delta": None}, {}])
def test_a_finish_reason_on_a_chunk_without_a_delta_ends_the_reply(last: dict) -> None:
    """ChatOpenAI drops a chunk whose delta is null or missing: a finish reason sent on one was unseen,
    and the whole reply was refused as cut off."""
    end = {"choices": [{"index": 0, **last, "finish_reason": "stop"}]}
    rest = {"choices": [{"index": 0, "delta": {"content": "nna</answer>"}}]}
    with fake_http({"POST /v1/chat/completions": lambda _body: (200, _sse(_PARTIAL, rest, end))}) as fake:
        chunks = list(llm(f"{fake.url}/v1").stream(QUESTION))
    merged = sum(chunks[1:], chunks[0])
    assert (merged.content, merged.response_metadata.get("finish_reason")) == ("<answer>Vienna</answer>", "stop")


async def test_usage_a_server_sends_on_every_chunk_is_counted_once() -> None:
    """vLLM and SGLang with stream_options.continuous_usage_stats send the usage so far on every chunk:
    LangChain summed those totals, and a 30-token prompt counted 30 per chunk (here 120)."""
    words = ["<answer>", "Vie", "nna</answer>"]
    chunks = [
        {
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": "stop" if i == 2 else None}],
            "usage": {"prompt_tokens": 30, "completion_tokens": i + 1, "total_tokens": 31 + i},
        }
        for i, w in enumerate(words)
    ]
    last = {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33}}
    with fake_http({"POST /v1/chat/completions": lambda _body: (200, _sse(*chunks, last))}) as fake:
        model = llm(f"{fake.url}/v1", streaming=True)
        reply = await model.ainvoke(QUESTION)
        streamed = list(model.stream(QUESTION))
    whole = {"input_tokens": 30, "output_tokens": 3, "total_tokens": 33}
    assert reply.content == "<answer>Vienna</answer>"
    assert {k: reply.usage_metadata[k] for k in whole} == whole
    merged = sum(streamed[1:], streamed[0]).usage_metadata
    assert {k: merged[k] for k in whole} == whole


async def test_an_error_sent_inside_a_stream_names_the_server_and_is_retried() -> None:
    """Before: vLLM's and SGLang's ``data: {"error": ...}`` after the reply began was the openai
    client's bare APIError ("engine died"), naming no server and never asked again. An HTTP error
    status stays the client's own error."""
    broken = _sse(_PARTIAL, done=False) + 'data: {"error": {"message": "engine\\ndied", "code": 500}}\n\n'
    with fake_http({"POST /v1/chat/completions": lambda _body: (200, broken)}) as fake:
        with pytest.raises(IncompleteReplyError, match=r"\(model 'smollm2'\) sent an error .* \(engine died\)") as info:
            await llm(f"{fake.url}/v1", streaming=True).ainvoke(QUESTION)
        assert is_transient(info.value)
        fake.routes["POST /v1/chat/completions"] = lambda _body: (429, {"error": {"message": "slow down"}})
        with pytest.raises(Exception, match="slow down") as info:
            await llm(f"{fake.url}/v1", streaming=True).ainvoke(QUESTION)
        assert type(info.value).__name__ == "OpenAIRateLimitError"


async def test_a_cut_off_stream_is_asked_again_and_the_whole_reply_kept() -> None:
    """The library's retries ask again after a cut-off stream, and only the whole second reply is the turn."""
    rest = {"choices": [{"index": 0, "delta": {"content": "nna</answer>"}, "finish_reason": "stop"}]}
    replies = iter([_sse(_PARTIAL, done=False), _sse(_PARTIAL, rest)])
    with fake_http({"POST /v1/chat/completions": lambda _body: (200, next(replies))}) as fake:
        model = llm(f"{fake.url}/v1", streaming=True)
        reply = await with_retries(lambda: model.ainvoke(QUESTION), base_delay=0.0)
    assert reply.content == "<answer>Vienna</answer>" and len(fake.requests) == 2


def test_a_server_that_takes_the_request_but_never_answers_is_called_hung_not_unreachable() -> None:
    """Before: "is unreachable (timed out): start the server, or fix base_url=", for a server that
    accepted the connection and sat on the request (a model still loading, a hung engine)."""

    def silent(_body: dict) -> tuple[int, Any]:
        time.sleep(3)
        return 200, {"data": []}

    with fake_http({"GET /v1/models": silent}) as fake:
        with pytest.raises(
            ServerCheckError, match=r"/v1/models did not answer within 0\.5 s while checking model"
        ) as info:
            check_server(f"{fake.url}/v1", "smollm2", timeout=0.5)
    assert "unreachable" not in str(info.value) and "start the server" not in str(info.value)


def test_a_server_that_trickles_its_reply_is_given_up_on_at_the_timeout() -> None:
    """Before: the timeout bounded each socket read, so a server sending a byte every 0.1 s kept a
    check with timeout=0.5 waiting for its whole reply (about 10 s here; as long as it trickled)."""
    import socket
    import threading

    body = b" " * 100 + b'{"data": [{"id": "smollm2"}]}'
    listener = socket.create_server(("127.0.0.1", 0))

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body))
                for byte in body:
                    time.sleep(0.1)
                    conn.sendall(bytes([byte]))
            except OSError:  # the check gave up and closed the connection
                pass

    threading.Thread(target=trickle, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    said = rf"^{url}/models did not answer within 0\.5 s while checking model 'smollm2': .*too slow"
    with listener, pytest.raises(ServerCheckError, match=said):
        check_server(url, "smollm2", timeout=0.5)


@pytest.mark.parametrize("streamed", [False, True])
async def test_logprobs_with_token_ids_for_text_are_an_error_naming_the_server_flag(streamed: bool) -> None:
    """Before: vLLM started with --return-tokens-as-token-ids sent "token_id:9906" (and its bytes) for
    each token; read as text, the first token covered the whole reply and the uncertainty regions fell
    on the wrong tokens, silently."""
    reply = json.loads(json.dumps(_completion(30)))
    entry = reply["choices"][0]["logprobs"]["content"][0]
    entry.update(token="token_id:9906", bytes=list(b"token_id:9906"))
    route = _streaming(lambda _body: (200, reply))
    with fake_http({**fake_server(), "POST /v1/chat/completions": route}) as fake:
        with pytest.raises(ProtocolError, match=r"\(model 'smollm2'\) sent a malformed reply: .*token_id:9906") as info:
            await llm(f"{fake.url}/v1", streaming=streamed).ainvoke(QUESTION)
        assert "--return-tokens-as-token-ids" in str(info.value)
        with pytest.raises(ServerCheckError, match="--return-tokens-as-token-ids"):
            check_server(f"{fake.url}/v1", "smollm2", top_logprobs=16, prefill=False)
