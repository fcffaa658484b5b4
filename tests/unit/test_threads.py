"""The library in a multi-threaded web service: threads calling the sync API at once, threads that each
run their own event loop (``asyncio.run``), all on one compiled graph, one saver and one model."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_parallelmuse import nodes as nodes_module
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.models import InferenceEngine, LocalChatModel
from langgraph_parallelmuse.models.server import ServerChatModel
from tests.unit.fakes import Reply, ScriptedChatModel, answer_text, call_text, make_tools, research_responder
from tests.unit.tiny_model import tiny_chat_engine


def _in_threads(calls: list[Callable[[], Any]], *, seconds: float = 120) -> list[Any]:
    """Each call's result (or the exception it raised) from a thread of its own, all started at once;
    "hung" for a call still running after ``seconds`` (a deadlock fails the test, never hangs it)."""
    results: list[Any] = ["hung"] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds)
    return results


# ----------------------------------------------------------------------------- a server model on several loops


@contextmanager
def _keep_alive_chat_server(connections: list | None = None) -> Iterator[str]:
    """An OpenAI-compatible chat server on loopback that keeps connections open (HTTP/1.1), as vLLM does:
    a client pool then reuses a connection for the next call. Each call's client address goes into
    ``connections``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if connections is not None:
                connections.append(self.client_address)
            self.rfile.read(int(self.headers.get("content-length") or 0))
            reply = {
                "choices": [{"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that drops its connection is no server error here

    server = Quiet(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("proxy", [None, "http://127.0.0.1:9"], ids=["no proxy", "a proxy in the environment"])
def test_a_server_model_shared_by_threads_that_each_run_their_own_event_loop_answers_every_call(monkeypatch, proxy):
    # One HTTP pool served every loop: a connection opened by a thread's asyncio.run, which had closed,
    # failed the next thread's call ("Event loop is closed"), and threads at once failed with
    # "... is bound to a different event loop". (With a proxy set, the loopback URL's own direct
    # client was shared alike.)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    if proxy:
        monkeypatch.setenv("http_proxy", proxy)
    with _keep_alive_chat_server() as url:
        model = ServerChatModel(base_url=url, model="m")

        def ask() -> str:
            try:
                return asyncio.run(model.ainvoke([HumanMessage("Capital of France?")])).content
            except Exception as exc:  # noqa: BLE001 - shown in the assertion
                return f"{type(exc).__name__}: {exc}"

        one_after_another = [_in_threads([ask])[0] for _ in range(3)]
        at_once = _in_threads([ask] * 6)
        from_the_sync_api = model.invoke([HumanMessage("Capital of France?")]).content
    assert one_after_another == ["Paris"] * 3
    assert at_once == ["Paris"] * 6
    assert from_the_sync_api == "Paris"


def test_server_models_made_and_dropped_on_one_event_loop_share_its_connections(monkeypatch):
    # A pool per model: each model made (one per request of a web service) opened a connection of its
    # own, left open once the model was dropped ("ResourceWarning: unclosed transport" when collected),
    # where ChatOpenAI's cached client served them all on one.
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    connections: list = []

    async def ask(url: str) -> list[str]:
        return [(await ServerChatModel(base_url=url, model="m").ainvoke("Capital?")).content for _ in range(4)]

    with _keep_alive_chat_server(connections) as url:
        assert asyncio.run(ask(url)) == ["Paris"] * 4
    assert len(connections) == 4 and len(set(connections)) == 1


# ----------------------------------------------------------------------------- one graph, many threads


def _agent(index: int, messages: list[BaseMessage]) -> Reply:
    """A trajectory of its own per question (a search, then the question's answer), replies delayed a
    little so the runs of several threads interleave."""
    question = messages[1].content
    number = question.split(":")[0]
    if index == 0:
        return Reply(call_text("search", f"Find {number}", query=f"capital of {number}"), delay=0.005)
    return Reply(answer_text(f"City{number}", f"It says City{number}"), delay=0.003)


def _research_graph(saver: InMemorySaver | None) -> Any:
    model = ScriptedChatModel(responder=research_responder(_agent))
    return create_parallelmuse(model, make_tools()[0], config={"n": 3, "mode": "none"}, checkpointer=saver)


def _outcome(out: dict) -> tuple:
    """What a run answers and how: its answer, its trajectories' steps and answers, its reports."""
    trajectories = sorted((t["id"], [s["text"] for s in t["steps"]], t["answer"]) for t in out["trajectories"])
    return out["question"], out["answer"], trajectories, sorted(r["answer"] for r in out["reports"])


def _streamed(graph: Any, inp: dict, config: dict) -> tuple:
    """A run through ``stream``: its outcome and its progress events' answers."""
    events, out = [], None
    for mode, chunk in graph.stream(inp, config, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(chunk)
        else:
            out = chunk
    finished = sorted(e["answer"] for e in events if e["event"] == "trajectory_finished")
    return _outcome(out), finished


def test_runs_on_other_thread_ids_from_many_threads_at_once_each_get_their_own_run():
    # A guard: threads calling invoke, stream and asyncio.run(ainvoke) at once on one graph, saver and
    # model, each on a thread_id of its own, get what each run alone gets: no ThreadBusyError, no
    # other run's answer, trajectories or progress events, and no hold left behind.
    saver = InMemorySaver()
    graph = _research_graph(saver)

    def run(how: str, number: int) -> Callable[[], tuple]:
        inp, config = {"question": f"Q{number}: which city?"}, {"configurable": {"thread_id": f"chat-{number}"}}
        if how == "invoke":
            return lambda: (_outcome(graph.invoke(inp, config)), None)
        if how == "stream":
            return lambda: _streamed(graph, inp, config)
        return lambda: (_outcome(asyncio.run(graph.ainvoke(inp, config))), None)

    hows = ["invoke", "stream", "ainvoke"] * 3
    alone = [run(how, number)() for number, how in enumerate(hows)]
    graph = _research_graph(InMemorySaver())  # a fresh saver: the runs alone do not answer these
    together = _in_threads([run(how, number) for number, how in enumerate(hows)])
    assert together == alone
    assert [outcome[1] for outcome, _ in together] == [f"CityQ{n}" for n in range(len(hows))]
    assert not nodes_module.BUSY_THREADS._held and not nodes_module.IN_FLIGHT._held


# ----------------------------------------------------------------------------- the engine, callers on many loops


@pytest.fixture(scope="module")
def engine():
    engine = tiny_chat_engine()
    yield engine
    engine.close()


def test_the_engine_answers_each_thread_and_event_loop_its_own_request_and_drops_the_abandoned_ones(engine):
    # A guard: threads calling invoke, stream, and asyncio.run(ainvoke / astream) at once, some giving
    # up early (a wait_for that times out, a stream closed after its first piece), each get the reply
    # they get alone, and the engine keeps no request of theirs.
    model = LocalChatModel(max_tokens=12, temperature=0.0, top_logprobs=2)
    model._engine = engine

    def ask(number: int) -> list[HumanMessage]:
        return [HumanMessage(f"the cat {number} is on the mat and the dog {number * 7} is")]

    async def streamed(number: int) -> str:
        return "".join([chunk.content async for chunk in model.astream(ask(number))])

    async def given_up(number: int) -> str:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(model.ainvoke(ask(number)), 0.001)
        return "gave up"

    def closed_early(number: int) -> str:
        pieces = model.stream(ask(number))
        next(pieces)
        pieces.close()
        return "closed"

    calls = {
        "invoke": lambda n: model.invoke(ask(n)).content,
        "stream": lambda n: "".join(chunk.content for chunk in model.stream(ask(n))),
        "ainvoke": lambda n: asyncio.run(model.ainvoke(ask(n))).content,
        "astream": lambda n: asyncio.run(streamed(n)),
    }
    alone = {n: model.invoke(ask(n)).content for n in range(4)}
    plan = [(how, n) for n in range(4) for how in calls]
    quitters = [lambda n=n: asyncio.run(given_up(n)) for n in range(4)] + [
        lambda n=n: closed_early(n) for n in range(4)
    ]
    results = _in_threads([lambda how=how, n=n: calls[how](n) for how, n in plan] + quitters)
    assert results[: len(plan)] == [alone[n] for _, n in plan]
    assert results[len(plan) :] == ["gave up"] * 4 + ["closed"] * 4
    # Every abandoned request has left the engine (it drops one at its next decode step).
    assert _in_threads([lambda: engine.generate(_probe(engine)).finish_reason])[0] in ("stop", "length")
    assert not [future for future in engine._futures if not future.done()]


def _probe(engine: InferenceEngine) -> Any:
    from langgraph_parallelmuse.models import GenerationRequest

    return GenerationRequest(engine.tokenizer("the cat").input_ids, max_new_tokens=2, temperature=0.0)


def test_a_run_on_a_threads_own_event_loop_leaves_no_closed_loop_behind():
    # The concurrency bounds are kept per event loop, and a semaphore a task waited on holds its loop:
    # every thread's asyncio.run (a web service's request) stayed referenced with its semaphores.
    graph = _research_graph(None)
    loops: list[weakref.ref] = []

    async def run(number: int) -> dict:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        # One trajectory at a time: the others wait for the bound, on this loop.
        return await graph.ainvoke({"question": f"Q{number}: which city?"}, context={"max_concurrency": 1})

    answers = [_in_threads([lambda n=n: asyncio.run(run(n))])[0]["answer"] for n in range(4)]
    gc.collect()
    assert answers == [f"CityQ{n}" for n in range(4)]
    # The last one is let go of by the next run on another loop.
    assert [ref() is None for ref in loops[:-1]] == [True] * 3
