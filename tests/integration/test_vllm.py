"""A real vLLM (CPU build, serving venv) with the embedded SmolLM2 exported at setup time.

One eager server for the module (about 40-70 s to start on 2 cores). What is pinned down:
logprobs with top_logprobs through ServerChatModel, the prefix cache reported as
``cached_tokens`` (and read by langchain-openai as ``input_token_details.cache_read``), the
continuation of a trailing assistant message, the token bound, each check_server failure
that vLLM can really produce, and the whole ParallelMuse pipeline with the guided driver: its
branches served their parents' prefixes from vLLM's cache, and its own accounting of every
stage's prompt and cached tokens equals the server's counters.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.models.server import ServerChatModel, ServerCheckError, check_server
from langgraph_parallelmuse.segments import Sampling
from langgraph_parallelmuse.serving import reset_prefix_cache, vllm_counters
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.integration.conftest import SERVED_MODEL, VLLM_BLOCK

pytestmark = [pytest.mark.integration, pytest.mark.serving]

# About 1,000 prompt tokens: many of the server's KV blocks (VLLM_BLOCK tokens), so a repeat hits the cache.
LONG = " ".join(f"Fact {i}: the number {i} comes right before the number {i + 1}." for i in range(55))


def model(server, **kw) -> ServerChatModel:
    return ServerChatModel(
        **{
            "base_url": f"{server.url}/v1",
            "model": SERVED_MODEL,
            "logprobs": True,
            "top_logprobs": 16,
            "timeout": 120,
            "max_retries": 0,
            **kw,
        }
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
    # Whole blocks, short of the last token (which must be computed to sample from).
    assert prompt - VLLM_BLOCK <= cached < prompt and cached % VLLM_BLOCK == 0
    assert first.usage_metadata["input_token_details"]["cache_read"] < cached
    after = vllm_counters(vllm.url)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
    assert after["vllm:prompt_tokens_cached_total"] - before["vllm:prompt_tokens_cached_total"] >= cached


def test_reset_prefix_cache_empties_it(vllm) -> None:
    llm = model(vllm)
    messages = [HumanMessage(LONG + " Which number comes right before 30?")]
    kwargs = Sampling(temperature=0.0).kwargs(max_tokens=2, seed=None, model=llm)
    llm.invoke(messages, **kwargs)
    assert llm.invoke(messages, **kwargs).usage_metadata["input_token_details"]["cache_read"] > 900
    reset_prefix_cache(vllm.url)
    assert llm.invoke(messages, **kwargs).usage_metadata["input_token_details"]["cache_read"] == 0


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
    support = check_server(f"{vllm.url}/v1", SERVED_MODEL, top_logprobs=16)
    assert support.prefill and support.scoring  # vLLM continues a reply and returns prompt_logprobs
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


async def test_a_cancelled_call_stops_its_request_on_vllm(vllm) -> None:
    """Consensus stop cancels running trajectories: their requests must stop on the server, not
    decode on to their token limit beside the work that goes on (vLLM counts no "abort" for a
    client that went away, so its running-requests gauge and its generated tokens tell)."""
    import asyncio
    import time

    llm = model(vllm, extra_body={"ignore_eos": True})  # nothing ends the request but its bound or a cancel
    kwargs = Sampling(temperature=0.0).kwargs(max_tokens=1500, seed=None, model=llm)

    async def gauge(wanted: float, within: float) -> dict[str, float]:
        deadline = time.monotonic() + within
        while (counters := vllm_counters(vllm.url))["vllm:num_requests_running"] != wanted:
            assert time.monotonic() < deadline, f"vllm:num_requests_running stayed off {wanted}: {counters}"
            await asyncio.sleep(0.2)
        return counters

    idle = await gauge(0, 30)
    call = asyncio.create_task(llm.ainvoke([HumanMessage("Count upwards from 1, one number a line.")], **kwargs))
    await gauge(1, 60)
    await asyncio.sleep(1.0)  # a few dozen tokens decoded
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    stopped = await gauge(0, 10)
    await asyncio.sleep(2.0)
    later = vllm_counters(vllm.url)
    generated = stopped["vllm:generation_tokens_total"] - idle["vllm:generation_tokens_total"]
    assert 0 < generated < 1500  # stopped well before its bound
    assert later["vllm:generation_tokens_total"] == stopped["vllm:generation_tokens_total"]  # and nothing since
    assert later["vllm:request_success_total"] == idle["vllm:request_success_total"]  # it never finished


async def test_a_continuation_scored_on_vllm_matches_the_in_process_model(vllm) -> None:
    """The guided driver's choice runs on vLLM from prompt logprobs with the same prompt and options:
    the same tokens and (bfloat16 vs float32 weights) nearly the same logprobs, so the same pick."""
    from langgraph_parallelmuse.driver import EVIDENCE_SYSTEM
    from langgraph_parallelmuse.models import LocalChatModel

    question = "The Eiffel Tower is in Paris, France.\n\nQuestion: Which country is the Eiffel Tower in?"
    messages = [SystemMessage(EVIDENCE_SYSTEM), HumanMessage(question + "\nAnswer with a short phrase.")]
    served, local = model(vllm), LocalChatModel.embedded()
    scores = {}
    for option in ("France", "Paris", "Düsseldorf"):
        a = await served.ainvoke(messages, continuation=option, top_logprobs=16)
        b = await local.ainvoke(messages, continuation=option, top_logprobs=16)
        assert a.content == b.content == option
        ours, theirs = (r.response_metadata["logprobs"]["content"] for r in (a, b))
        assert [e["token"] for e in ours] == [e["token"] for e in theirs]
        assert all(len(e["top_logprobs"]) == 16 for e in ours)
        for x, y in zip(ours, theirs, strict=True):
            assert x["logprob"] == pytest.approx(y["logprob"], abs=0.35)
        assert a.response_metadata["end_logprob"] == pytest.approx(b.response_metadata["end_logprob"], abs=0.35)
        scores[option] = [
            sum(e["logprob"] for e in r.response_metadata["logprobs"]["content"]) + r.response_metadata["end_logprob"]
            for r in (a, b)
        ]
    assert max(scores, key=lambda o: scores[o][0]) == max(scores, key=lambda o: scores[o][1])


# Small enough for CI (about 1-2 min on 2 busy cores): N=4 is one initial trajectory, its two
# branches from one step, and one fill.
PIPELINE = {
    "n": 4,
    "m": 1,
    "k": 1,
    "t": 2,
    "max_turns": 3,
    "max_step_tokens": 48,
    "max_report_tokens": 64,
    "top_logprobs": 16,
    "seed": 5,
    "driver": "guided",
    "mode": "exploration",
}
QUESTION = "Which country is the Eiffel Tower in, and what is the capital of that country?"


@pytest.fixture
def tools(small_corpus: Path, tmp_path: Path) -> list:
    return make_corpus_tools(CorpusIndex.from_jsonl(small_corpus, cache_dir=tmp_path / "index"))


def check_lineage(trajectories: list[dict]) -> list[dict]:
    """Every branch names its parent's thread, checkpoint and step and kept the parent's steps before it."""
    by_id = {t["id"]: t for t in trajectories}
    branches = [t for t in trajectories if t["origin"]["kind"] == "branch"]
    for branch in branches:
        origin = branch["origin"]
        parent, step = by_id[origin["parent"]], origin["step"]
        assert origin["parent_thread"] == parent["thread_id"] != branch["thread_id"]
        assert origin["checkpoint_id"] == parent["fork_points"][step] is not None
        assert branch["steps"][:step] == parent["steps"][:step]
        assert [o for o in branch["observations"] if o["step"] < step] == [
            o for o in parent["observations"] if o["step"] < step
        ]
        assert origin["prefix_tokens"] == parent["steps"][step]["context_tokens"] > 0
    return branches


def check_logprobs(trajectories: list[dict], top_logprobs: int) -> None:
    """Generated tokens carry vLLM's logprobs; tool-call steps have their generated regions scored.

    The guided driver has the model write every thought and every search query; a ``visit``
    opens the top unopened hit, prefilled, so its exploration region has no generated token.
    """
    searches = 0
    for traj in trajectories:
        for step, scores in zip(traj["steps"], traj["uncertainty"], strict=True):
            assert step["tokens"] and step["cache_reported"]
            for tok in step["tokens"]:
                assert math.isfinite(tok["logprob"]) and tok["logprob"] <= 0.0
                assert len(tok["top_logprobs"]) == top_logprobs
            if step["action"]["type"] == "tool_call":
                assert scores["reasoning"] is not None, (traj["id"], step)
            if step["action"].get("name") == "search":
                searches += 1
                assert scores["exploration"] is not None, (traj["id"], step)
    assert searches, "no search step"


async def test_the_whole_pipeline_on_vllm_with_the_guided_driver(vllm, tools) -> None:
    llm = model(vllm, timeout=300)
    graph = create_parallelmuse(llm, tools, config=PIPELINE)
    before = vllm_counters(vllm.url)
    result = await graph.ainvoke({"question": QUESTION})
    after = vllm_counters(vllm.url)

    trajectories, reports, stats = result["trajectories"], result["reports"], result["stats"]
    assert sorted(t["origin"]["kind"] for t in trajectories) == ["branch", "branch", "fill", "initial"]
    assert result["answer_source"] == "aggregator", result["answer_source"]
    assert result["answer"] in {r["answer"] for r in reports}
    assert len(reports) == sum(1 for t in trajectories if t["answer"]) > 0
    branches = check_lineage(trajectories)
    assert all(b["origin"]["region"] == "exploration" for b in branches)
    check_logprobs(trajectories, PIPELINE["top_logprobs"])

    for branch in branches:
        first = branch["steps"][branch["origin"]["step"]]
        # Its first call sends the parent's conversation at the fork point, which the parent's own
        # call at that step left in the cache: all of it but the last, partly filled block (and
        # the prompt's last token, which is always computed).
        assert first["conversation_cached_tokens"] >= branch["origin"]["prefix_tokens"] - VLLM_BLOCK, (
            first,
            branch["origin"],
        )

    # The run's own figures, per stage, observed: they add up to what vLLM itself counted.
    rollout, compress, aggregate = stats["rollout"], stats["compress"], stats["aggregate"]
    assert rollout["cache_reported"] and rollout["conversation_cached_tokens"] > 0
    assert compress["cached_prompt_tokens"] == sum(r["cached_prompt_tokens"] for r in reports)
    stages = (rollout, compress, aggregate)

    def grew(counter: str) -> float:
        return after[counter] - before[counter]

    assert grew("vllm:prompt_tokens_total") == sum(s["prompt_tokens"] for s in stages)
    assert grew("vllm:prompt_tokens_cached_total") == sum(s["cached_prompt_tokens"] for s in stages)
