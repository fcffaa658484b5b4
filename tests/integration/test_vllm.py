"""A real vLLM (CPU build, serving venv) with the embedded SmolLM2 exported at setup time.

One eager server for the module (about 40-70 s to start on 2 cores). What is pinned down:
logprobs with top_logprobs through ServerChatModel, the prefix cache reported as
``cached_tokens`` (and read by langchain-openai as ``input_token_details.cache_read``), the
continuation of a trailing assistant message, the token bound, and each check_server failure
that vLLM can really produce.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langgraph_parallelmuse.models.server import ServerChatModel, ServerCheckError, check_server
from langgraph_parallelmuse.segments import Sampling
from langgraph_parallelmuse.serving import vllm_counters
from tests.integration.conftest import SERVED_MODEL

pytestmark = pytest.mark.integration

# About 1,000 prompt tokens: several of vLLM's 128-token CPU KV blocks, so a repeat hits the cache.
LONG = " ".join(f"Fact {i}: the number {i} comes right before the number {i + 1}." for i in range(55))


def model(server, **kw) -> ServerChatModel:
    return ServerChatModel(
        base_url=f"{server.url}/v1",
        model=SERVED_MODEL,
        logprobs=True,
        top_logprobs=16,
        timeout=120,
        max_retries=0,
        **kw,
    )


def test_logprobs_with_top_logprobs_and_the_token_bound(vllm) -> None:
    llm = model(vllm)
    reply = llm.invoke(
        [HumanMessage("Count from 1 to 20, separated by commas.")],
        **Sampling(temperature=0.0, top_logprobs=16).kwargs(max_tokens=12, seed=1, model=llm),
    )
    entries = reply.response_metadata["logprobs"]["content"]
    assert reply.usage_metadata["output_tokens"] == len(entries) == 12
    assert reply.response_metadata["finish_reason"] == "length"
    for entry in entries:
        assert len(entry["top_logprobs"]) == 16
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the best alternative
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])
    assert "".join(e["token"] for e in entries) == reply.content


def test_second_identical_long_prompt_is_served_from_the_prefix_cache(vllm) -> None:
    llm = model(vllm)
    messages = [HumanMessage(LONG + " Which number comes right before 40?")]
    kwargs = Sampling(temperature=0.0).kwargs(max_tokens=4, seed=None, model=llm)
    before = vllm_counters(vllm.url)
    first = llm.invoke(messages, **kwargs)
    second = llm.invoke(messages, **kwargs)
    prompt = first.usage_metadata["input_tokens"]
    assert prompt > 900
    cached = second.usage_metadata["input_token_details"]["cache_read"]
    assert second.response_metadata["token_usage"]["prompt_tokens_details"]["cached_tokens"] == cached  # vLLM's field
    # Whole 128-token blocks, short of the last token (which must be computed to sample from).
    assert prompt - 128 <= cached < prompt and cached % 128 == 0
    assert first.usage_metadata["input_token_details"]["cache_read"] < cached
    after = vllm_counters(vllm.url)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
    assert after["vllm:prompt_tokens_cached_total"] - before["vllm:prompt_tokens_cached_total"] >= cached


def test_trailing_assistant_message_is_continued(vllm) -> None:
    llm = model(vllm)
    question = [HumanMessage(LONG + " Continue the list.")]
    prefill = "Fact 55: the number 55 comes right before the number"
    kwargs = Sampling(temperature=0.0).kwargs(max_tokens=4, seed=None, model=llm)
    opened = llm.invoke(question, **kwargs)
    continued = llm.invoke([*question, AIMessage(prefill)], **kwargs)
    # The continuation starts mid-sentence where the prefill stopped: the next number.
    assert continued.content.strip().startswith("56"), continued.content
    # Its prompt is the opened turn's plus the prefill, not a closed turn and a new header.
    grown = continued.usage_metadata["input_tokens"] - opened.usage_metadata["input_tokens"]
    assert 0 < grown <= len(prefill.split()) * 2
    assert continued.usage_metadata["input_token_details"]["cache_read"] >= 896  # the shared prefix


def test_check_server_accepts_vllm(vllm) -> None:
    check_server(f"{vllm.url}/v1", SERVED_MODEL, top_logprobs=16)
    check_server(f"{vllm.url}/v1", SERVED_MODEL, top_logprobs=20)  # --max-logprobs 20


def test_check_server_names_the_fix_for_what_vllm_refuses(vllm) -> None:
    base = f"{vllm.url}/v1"
    with pytest.raises(ServerCheckError) as info:
        check_server(base, "SmolLM2-135M-Instruct")
    assert f"{base} serves no model 'SmolLM2-135M-Instruct'; it serves ['smollm2']" in str(info.value)
    assert "--served-model-name SmolLM2-135M-Instruct" in str(info.value)
    with pytest.raises(ServerCheckError) as info:
        check_server(base, SERVED_MODEL, top_logprobs=32)
    assert "greater than max allowed: 20" in str(info.value)  # vLLM's own words, then the fix
    assert "--max-logprobs 32" in str(info.value)
    with pytest.raises(ServerCheckError, match="answered HTTP 404"):
        check_server(vllm.url, SERVED_MODEL)  # the root, not the /v1 API root
