"""The embedded SmolLM2 through LocalChatModel: logprobs, prefix reuse, batching, stops, prefill.

Runs the real model on CPU (about two minutes); select with ``pytest -m slow``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse.errors import InputError
from langgraph_parallelmuse.models import LocalChatModel

pytestmark = pytest.mark.slow

# Prefix-cached and from-scratch prefills run different matmul shapes; float32 rounding then
# differs by up to ~3e-5 nats (measured, batched + cached vs plain); 1e-4 leaves margin
# without hiding a wrong position id or mask (those move logprobs by > 0.01).
LOGPROB_TOL = 1e-4

SYSTEM = SystemMessage("You are a concise assistant. Answer in one short sentence.")
QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "What do bees make?",
    "Count from one to ten, separated by commas.",
]


def ask(question: str) -> list:
    return [SYSTEM, HumanMessage(question)]


@pytest.fixture(scope="module")
def llm() -> LocalChatModel:
    model = LocalChatModel.embedded(max_tokens=16, temperature=0.0)
    model.engine  # noqa: B018 - load once, outside the timed tests
    return model


@pytest.fixture(scope="module")
def llm_plain() -> LocalChatModel:
    """Same weights, no prefix cache and no batching: the reference path."""
    return LocalChatModel.embedded(max_tokens=16, temperature=0.0, prefix_cache=False, batching=False)


def tokens_of(reply: AIMessage) -> list[dict]:
    return reply.response_metadata["logprobs"]["content"]


def test_logprobs_are_finite_and_tokens_concatenate_to_content(llm: LocalChatModel) -> None:
    reply = llm.invoke(ask(QUESTIONS[0]))
    entries = tokens_of(reply)
    assert reply.content and entries
    assert "".join(e["token"] for e in entries) == reply.content
    assert bytes(b for e in entries for b in e["bytes"]).decode() == reply.content
    for entry in entries:
        assert math.isfinite(entry["logprob"]) and entry["logprob"] <= 0
        tops = entry["top_logprobs"]
        assert len(tops) == 16
        values = [t["logprob"] for t in tops]
        assert values == sorted(values, reverse=True)
        # Greedy: the chosen token is the most likely one under the raw distribution.
        assert entry["logprob"] == pytest.approx(values[0], abs=1e-6)
    meta = reply.response_metadata
    assert meta["finish_reason"] in {"stop", "length"}
    assert meta["model_name"] == "SmolLM2-135M-Instruct"
    usage = reply.usage_metadata
    assert usage["output_tokens"] == len(entries)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_prefix_cache_gives_the_same_logprobs(llm: LocalChatModel, llm_plain: LocalChatModel) -> None:
    messages = ask("Why is the sky blue?")
    llm.invoke(messages)  # warm the cache with this prompt (+ its generation)
    cached = llm.invoke(messages)
    plain = llm_plain.invoke(messages)
    assert cached.usage_metadata["input_token_details"]["cache_read"] > 0
    assert plain.usage_metadata["input_token_details"]["cache_read"] == 0
    assert cached.content == plain.content
    for a, b in zip(tokens_of(cached), tokens_of(plain), strict=True):
        assert a["token"] == b["token"]
        assert abs(a["logprob"] - b["logprob"]) < LOGPROB_TOL
        for ta, tb in zip(a["top_logprobs"][:5], b["top_logprobs"][:5], strict=True):
            assert abs(ta["logprob"] - tb["logprob"]) < LOGPROB_TOL


def test_second_call_sharing_a_prefix_reads_the_cache(llm: LocalChatModel) -> None:
    document = "Document: The Eiffel Tower was completed in 1889 for the World's Fair in Paris."
    first = llm.invoke([SYSTEM, HumanMessage(f"{document}\nWhen was it completed?")])
    second = llm.invoke([SYSTEM, HumanMessage(f"{document}\nWhere is it?")])
    shared = second.usage_metadata["input_token_details"]["cache_read"]
    assert shared > 20
    assert shared < second.usage_metadata["input_tokens"]
    assert first.usage_metadata["input_tokens"] > 0


async def test_batched_greedy_matches_unbatched(llm: LocalChatModel, llm_plain: LocalChatModel) -> None:
    llm.engine.reset_stats()
    batched = await asyncio.gather(*(llm.ainvoke(ask(q)) for q in QUESTIONS))
    stats = llm.engine.stats()
    assert stats["mean_batch_size"] > 1.5, stats
    for question, reply in zip(QUESTIONS, batched, strict=True):
        reference = llm_plain.invoke(ask(question))
        assert reply.content == reference.content
        assert [e["token"] for e in tokens_of(reply)] == [e["token"] for e in tokens_of(reference)]


async def test_concurrent_requests_keep_their_own_stops_and_settings(
    llm: LocalChatModel, llm_plain: LocalChatModel
) -> None:
    jobs = [
        (ask(QUESTIONS[3]), [","], 16),
        (ask(QUESTIONS[3]), ["four"], 24),
        (ask(QUESTIONS[0]), ["Paris"], 12),
        (ask(QUESTIONS[2]), [], 5),
    ]
    replies = await asyncio.gather(*(llm.ainvoke(m, stop=stop, max_tokens=n) for m, stop, n in jobs))
    for (messages, stop, n), reply in zip(jobs, replies, strict=True):
        reference = llm_plain.invoke(messages, stop=stop, max_tokens=n)
        assert reply.content == reference.content
        assert reply.response_metadata["finish_reason"] == reference.response_metadata["finish_reason"]
        assert "".join(e["token"] for e in tokens_of(reply)) == reply.content
        assert all(s not in reply.content for s in stop)
        assert reply.usage_metadata["output_tokens"] <= n
    assert replies[3].response_metadata["finish_reason"] == "length"
    assert replies[3].usage_metadata["output_tokens"] == 5


def test_stop_string_inside_a_token_trims_that_token(llm: LocalChatModel) -> None:
    messages = ask(QUESTIONS[0])
    full = llm.invoke(messages)
    assert "Paris" in full.content, full.content
    reply = llm.invoke(messages, stop=["aris"])
    assert reply.content == full.content[: full.content.index("aris")]
    assert reply.response_metadata["finish_reason"] == "stop"
    entries = tokens_of(reply)
    assert "".join(e["token"] for e in entries) == reply.content
    # The token " Paris" is cut to " P" but keeps the logprob of the full token.
    whole = next(e for e in tokens_of(full) if "Paris" in e["token"])
    assert entries[-1]["token"].endswith("P")
    assert entries[-1]["logprob"] == pytest.approx(whole["logprob"], abs=LOGPROB_TOL)


def test_prefill_continues_the_assistant_text(llm: LocalChatModel) -> None:
    prefill = AIMessage("The capital of France is")
    prompt = llm.render_prompt([*ask(QUESTIONS[0]), prefill])
    assert prompt.endswith("<|im_start|>assistant\nThe capital of France is")
    assert llm.render_prompt([*ask(QUESTIONS[0]), AIMessage("<think>\n")]).endswith("<think>\n")
    reply = llm.invoke([*ask(QUESTIONS[0]), prefill])
    assert reply.content.startswith(" Paris"), reply.content
    assert "capital" not in reply.content


async def test_ainvoke_does_not_block_the_event_loop(llm: LocalChatModel) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    start = time.perf_counter()
    await llm.ainvoke(ask("Tell me about the ocean."), max_tokens=24, stop=[])
    elapsed = time.perf_counter() - start
    done.set()
    await task
    # A blocked loop would tick once; a free one ticks about every 10 ms of the call.
    assert elapsed > 0.2
    assert ticks >= elapsed / 0.01 * 0.3


def test_requests_from_threads_with_their_own_loops_are_batched(llm: LocalChatModel) -> None:
    barrier = threading.Barrier(3)
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        barrier.wait()
        reply = asyncio.run(llm.ainvoke(ask(QUESTIONS[i]), max_tokens=12))
        results[i] = reply.content

    llm.engine.reset_stats()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert llm.engine.stats()["mean_batch_size"] > 1.5


def test_sampling_with_a_seed_is_reproducible(llm: LocalChatModel) -> None:
    kwargs = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_tokens": 12}
    first = llm.invoke(ask("Write a word."), **kwargs)
    second = llm.invoke(ask("Write a word."), **kwargs)
    assert first.content == second.content
    off = llm.invoke(ask("Write a word."), logprobs=False, top_logprobs=0, max_tokens=4)
    assert "logprobs" not in off.response_metadata


def test_bad_call_arguments_are_rejected(llm: LocalChatModel) -> None:
    with pytest.raises(InputError, match="unsupported call arguments"):
        llm.invoke(ask("Hi"), frequency_penalty=1.0)
    with pytest.raises(InputError, match="top_logprobs"):
        llm.invoke(ask("Hi"), top_logprobs=21)
    with pytest.raises(ValueError, match="top_logprobs"):
        LocalChatModel.embedded(top_logprobs=30)
    assert llm.count_prompt_tokens(ask("Hi")) == llm.get_num_tokens_from_messages(ask("Hi"))
