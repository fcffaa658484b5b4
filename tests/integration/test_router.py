"""Real routers (vllm-router, sglang-router) in front of two real vLLM replicas.

Where requests went is read from each replica's own Prometheus counters
(``vllm:request_success_total``), not from the router. Two eager replicas start together (about
1-1.5 min on 2 cores); a router starts in about a second. The last tests run small ParallelMuse
graphs through the router: with the per-question key every call of a question (trajectories,
branches, reports, aggregation) lands on one replica; round-robin spreads one question over both.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage

from langgraph_parallelmuse import create_parallelmuse
from langgraph_parallelmuse.models.routing import routing_scope
from langgraph_parallelmuse.models.server import ServerChatModel, ServerCheckError, check_server, route_id
from langgraph_parallelmuse.segments import Gen, Sampling, generate_turn
from langgraph_parallelmuse.serving import ROUTERS, router_server, vllm_counters
from langgraph_parallelmuse.tools import CorpusIndex, make_corpus_tools
from tests.integration.conftest import SERVED_MODEL
from tests.unit.http_fakes import fake_http

pytestmark = [pytest.mark.integration, pytest.mark.serving]

KEYS = ["question one", "question two", "question three", "question four"]


def finished(workers) -> list[float]:
    return [vllm_counters(w.url)["vllm:request_success_total"] for w in workers]


def ask_all(router, key: str, *, calls: int = 4, prefill: bool = True) -> None:
    """One question's calls as the library makes them: new turns, prefilled turns, a report prompt."""
    llm = ServerChatModel(
        base_url=f"{router.url}/v1",
        model=SERVED_MODEL,
        routing_header=router.routing_header,
        logprobs=True,
        top_logprobs=2,
        timeout=120,
        max_retries=0,
    )
    kwargs = Sampling(temperature=0.0, top_logprobs=2).kwargs(max_tokens=1, seed=None, model=llm)
    prompts = [
        [HumanMessage(key)],
        [HumanMessage(f"Write a report about: {key}")],  # starts differently: only the scope routes it
        *([[HumanMessage(key), AIMessage("<think>")]] if prefill else []),
    ]
    with routing_scope(key):
        for i in range(calls):
            llm.invoke(prompts[i % len(prompts)], **kwargs)


def delta_of(workers, call) -> list[float]:
    before = finished(workers)
    call()
    return [a - b for a, b in zip(finished(workers), before, strict=True)]


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_every_call_of_one_question_reaches_one_replica(vllm_pair, serving_venv, kind, tmp_path) -> None:
    prefill = kind == "vllm-router"  # sglang-router breaks continue_final_message on vLLM (below)
    with router_server([w.url for w in vllm_pair], venv=serving_venv, kind=kind, log_dir=tmp_path) as router:
        assert router.routing_header == ROUTERS[kind].routing_header
        homes = []
        for key in KEYS:
            delta = delta_of(vllm_pair, lambda key=key: ask_all(router, key, prefill=prefill))
            assert sorted(delta) == [0, 4], f"{kind}: the calls of {key!r} went {delta}"
            homes.append(delta.index(4))
        # A second round of the same keys lands where the first did.
        for key, home in zip(KEYS, homes, strict=True):
            delta = delta_of(vllm_pair, lambda key=key: ask_all(router, key, calls=2, prefill=prefill))
            assert delta[home] == 2, f"{kind}: {key!r} moved from replica {home}: {delta}"


def test_round_robin_scatters_one_question(vllm_pair, serving_venv, tmp_path) -> None:
    """What the official ParallelMuse code does, and what defeats each replica's prefix cache."""
    urls = [w.url for w in vllm_pair]
    with router_server(urls, venv=serving_venv, policy="round_robin", log_dir=tmp_path) as router:
        delta = delta_of(vllm_pair, lambda: ask_all(router, KEYS[0]))
    assert delta == [2, 2]


def test_check_server_through_the_routers(vllm_pair, serving_venv, tmp_path) -> None:
    """vllm-router passes every check; sglang-router 0.3.2 fails two, each with vLLM's own words."""
    import openai

    urls = [w.url for w in vllm_pair]
    with router_server(urls, venv=serving_venv, kind="vllm-router", log_dir=tmp_path) as router:
        check_server(f"{router.url}/v1", SERVED_MODEL)
    with router_server(urls, venv=serving_venv, kind="sglang-router", log_dir=tmp_path) as router:
        # It answers /v1/models itself, with a placeholder, instead of the workers' list.
        with pytest.raises(ServerCheckError, match=r"serves no model 'smollm2'; it serves \['unknown'\]"):
            check_server(f"{router.url}/v1", SERVED_MODEL)
        llm = ServerChatModel(base_url=f"{router.url}/v1", model=SERVED_MODEL, max_retries=0, timeout=60)
        assert llm.invoke([HumanMessage("Name a city.")], max_tokens=2).content  # a new turn works
        with pytest.raises(openai.BadRequestError, match="continue_final_message and add_generation_prompt"):
            llm.invoke([HumanMessage("Name a city."), AIMessage("The city of")], max_tokens=2)


def _completion(_body: dict) -> tuple[int, dict]:
    message = {"role": "assistant", "content": "A"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return 200, {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": SERVED_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
        "usage": usage,
    }


def _worker_routes() -> dict:
    return {
        "GET /v1/models": lambda _: (200, {"object": "list", "data": [{"id": SERVED_MODEL}]}),
        "GET /health": lambda _: (200, {}),
        "POST /v1/chat/completions": _completion,
    }


@pytest.mark.parametrize("kind", sorted(ROUTERS))
def test_what_each_router_forwards(serving_venv, kind, tmp_path) -> None:
    """The real router in front of a recording worker: the body and header a vLLM worker receives."""
    routes = _worker_routes()
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>"}],
        "max_tokens": 3,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    with fake_http(routes) as worker, router_server([worker.url], venv=serving_venv, kind=kind, log_dir=tmp_path) as r:
        headers = {"content-type": "application/json", r.routing_header: "key-1"}
        request = urllib.request.Request(f"{r.url}/v1/chat/completions", json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200
    sent = next(x for x in reversed(worker.requests) if x.path == "/v1/chat/completions")
    assert sent.body["continue_final_message"] is True
    assert sent.headers[r.routing_header] == "key-1"
    if kind == "vllm-router":
        assert sent.body["add_generation_prompt"] is False and sent.body["max_tokens"] == 3
    else:  # sglang-router 0.3.2 rewrites the request in SGLang's schema
        assert "add_generation_prompt" not in sent.body
        assert sent.body["max_completion_tokens"] == 3 and "max_tokens" not in sent.body


def _home(router, workers, value: str) -> int:
    """The worker a routing header value lands on (a first sight assigns it, for sglang-router)."""
    before = [len(w.requests) for w in workers]
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 1}
    headers = {"content-type": "application/json", router.routing_header: value}
    request = urllib.request.Request(f"{router.url}/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30):
        pass
    return next(i for i, w in enumerate(workers) if len(w.requests) > before[i])


@pytest.mark.parametrize("kind", sorted(ROUTERS))
async def test_a_hung_replicas_question_is_retried_on_the_other(serving_venv, kind, tmp_path) -> None:
    """A replica that hangs (its /health answers, its requests never do) keeps its keys: neither
    router moves them (none within 40 s, BENCHMARKS section 7). The library's retry goes under
    another key, so the question's call is answered by the other replica instead of timing out."""
    released = threading.Event()

    def hang(_body: dict) -> tuple[int, dict]:
        released.wait(60)
        return 500, {"error": {"message": "released"}}

    with fake_http(_worker_routes()) as a, fake_http(_worker_routes()) as b:
        workers = [a, b]
        try:
            with router_server([a.url, b.url], venv=serving_venv, kind=kind, log_dir=tmp_path) as router:
                key = next(
                    k
                    for k in (f"question {i}" for i in range(64))
                    if _home(router, workers, route_id(k)) == 1 and _home(router, workers, route_id(k, attempt=1)) == 0
                )
                b.routes["POST /v1/chat/completions"] = hang
                started = len(b.requests)
                # The defaults but the timeout (600 s). With 2 s every try timed out once in CI, under
                # load, and nothing said where the tries went: the failure below says it, with the log.
                llm = ServerChatModel(
                    base_url=f"{router.url}/v1", model=SERVED_MODEL, routing_header=router.routing_header, timeout=5
                )
                try:
                    with routing_scope(key):
                        turn = await generate_turn(llm, [HumanMessage(key)], [Gen(max_tokens=1)], sampling=Sampling())
                except Exception as exc:  # noqa: BLE001 - the failure is reported with what explains it
                    tries = [[r.headers.get(router.routing_header) for r in w.requests[-3:]] for w in workers]
                    pytest.fail(f"{exc!r}; last routing headers at a, b: {tries}; router log:\n{router.log_tail()}")
        finally:
            released.set()
    assert turn.text == "A"
    # Chat calls only: the router's own health checks of its workers (GET /health) reach b too.
    calls = [r for r in b.requests[started:] if r.path == "/v1/chat/completions"]
    assert [r.headers[router.routing_header] for r in calls] == [route_id(key)]  # it hung
    answered = [r for r in a.requests if r.path == "/v1/chat/completions"]
    assert answered[-1].headers[router.routing_header] == route_id(key, attempt=1)  # the retry's answer


# The smallest run with every kind of call: an initial trajectory, one branch, one fill, their
# reports and the aggregation (about 20-30 calls; well under a minute per run on vLLM).
RUN = {
    "n": 3,
    "m": 1,
    "k": 1,
    "t": 1,
    "max_turns": 2,
    "max_step_tokens": 32,
    "max_report_tokens": 48,
    "seed": 2,
    "driver": "guided",
}
QUESTIONS = [
    "Which country is the Eiffel Tower in, and what is the capital of that country?",
    "Which river flows through London?",
]


class CallCounter(BaseCallbackHandler):
    """Counts the chat-model calls the library makes (each one request to the router)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.calls += 1


@pytest.fixture
def tools(small_corpus: Path, tmp_path: Path) -> list:
    return make_corpus_tools(CorpusIndex.from_jsonl(small_corpus, cache_dir=tmp_path / "index"))


async def run_question(router, tools: list, question: str, *, header: bool = True) -> tuple[dict, int]:
    counter = CallCounter()
    llm = ServerChatModel(
        base_url=f"{router.url}/v1",
        model=SERVED_MODEL,
        routing_header=router.routing_header if header else None,
        logprobs=True,
        top_logprobs=16,
        timeout=300,
        max_retries=0,
        callbacks=[counter],
    )
    result = await create_parallelmuse(llm, tools, config=RUN).ainvoke({"question": question})
    kinds = sorted(t["origin"]["kind"] for t in result["trajectories"])
    assert kinds == ["branch", "fill", "initial"] and result["reports"], result["stats"]
    return result, counter.calls


async def test_every_call_of_a_pipeline_run_reaches_one_replica(vllm_pair, serving_venv, tools, tmp_path) -> None:
    with router_server([w.url for w in vllm_pair], venv=serving_venv, log_dir=tmp_path) as router:
        for question in QUESTIONS:
            before = finished(vllm_pair)
            _, calls = await run_question(router, tools, question)
            delta = [a - b for a, b in zip(finished(vllm_pair), before, strict=True)]
            assert sorted(delta) == [0, calls], f"{question!r}: {calls} calls went {delta}"


async def test_round_robin_spreads_a_pipeline_run_over_both_replicas(vllm_pair, serving_venv, tools, tmp_path) -> None:
    urls = [w.url for w in vllm_pair]
    with router_server(urls, venv=serving_venv, policy="round_robin", log_dir=tmp_path) as router:
        before = finished(vllm_pair)
        _, calls = await run_question(router, tools, QUESTIONS[0])
        delta = [a - b for a, b in zip(finished(vllm_pair), before, strict=True)]
    assert sum(delta) == calls and min(delta) >= calls // 2 - 1, delta  # alternating: about half each
