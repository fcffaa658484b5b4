"""The README's "LangChain usage" examples, run with fakes: a node of a chat ``StateGraph``, a step
of an LCEL chain, ``.batch`` over questions, and callbacks / tracing (run names, tags, metadata).

Callback handlers (LangSmith's tracer is one) reach every stage and the trajectory subgraph
``parallelmuse.rollout``: LangChain hands the parent run's callbacks, tags and metadata to any
runnable invoked inside it through a context variable, so ``RolloutRunner`` keeps its own checkpoint
coordinates (own thread ids and checkpointer, langgraph#8458) and still shows up in traces; the
caller's other ``configurable`` keys (a user id a tool reads, a configurable model's choice) reach
every trajectory.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import ConfigurableField, RunnableConfig, RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_parallelmuse.graph import create_parallelmuse, rollout_runner
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    answer_text,
    call_text,
    make_tools,
    research_responder,
    role_of,
)

STEPS = [
    Reply(call_text("search", "Find the city", query="Eiffel Tower"), regions={"tool_call": -0.3}),
    Reply(call_text("visit", "Open the page", doc="Eiffel Tower"), regions={"tool_call": -2.5}),
    Reply(answer_text("Paris", "The page says Paris")),
]
STAGES = {
    "prepare",
    "initial_rollout",
    "select_branches",
    "branch_rollout",
    "collect",
    "compress",
    "aggregate",
}


def make_graph(config: dict | None = None):
    """``create_parallelmuse`` on a scripted logprob model (the README uses the embedded one)."""
    model = ScriptedChatModel(responder=research_responder(lambda i, msgs: STEPS[min(i, 2)]))
    graph = create_parallelmuse(model, make_tools()[0], config=config or {"n": 4, "k": 1, "t": 2})
    return graph, model


# ----------------------------------------------------------------------------- a chat app's node


def chat_app(graph, checkpointer=None):
    """README example: ParallelMuse as the answering node of a messages-based chat graph."""

    def greet(state: MessagesState) -> dict:
        return {"messages": [AIMessage("Let me research that.", name="frontdesk")]}

    builder = StateGraph(MessagesState)
    builder.add_node("frontdesk", greet)
    builder.add_node("research", graph)  # reads the last human message, appends an AIMessage
    builder.add_edge(START, "frontdesk")
    builder.add_edge("frontdesk", "research")
    builder.add_edge("research", END)
    return builder.compile(checkpointer=checkpointer)


async def test_node_of_a_messages_state_graph_appends_the_answer():
    graph, _ = make_graph()
    app = chat_app(graph)
    out = await app.ainvoke({"messages": [HumanMessage("Which city is the Eiffel Tower in?")]})
    kinds = [(type(m).__name__, m.name) for m in out["messages"]]
    assert kinds == [
        ("HumanMessage", None),
        ("AIMessage", "frontdesk"),
        ("AIMessage", "parallelmuse"),
    ]
    answer = out["messages"][-1]
    assert answer.content == "Paris"
    assert answer.response_metadata["answer_source"] == "aggregator"


def test_node_of_a_checkpointed_chat_keeps_the_conversation_sync():
    graph, model = make_graph({"n": 2, "mode": "none"})
    app = chat_app(graph, InMemorySaver())
    thread = {"configurable": {"thread_id": "chat-1"}}
    app.invoke({"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}, thread)
    out = app.invoke({"messages": [HumanMessage("And where is the Louvre?")]}, thread)
    assert [m.type for m in out["messages"]] == ["human", "ai", "ai", "human", "ai", "ai"]
    assert out["messages"][-1].content == "Paris" and out["messages"][-1].name == "parallelmuse"
    # The second turn researched the second question (the last human message).
    questions = {
        c["messages"][-1].content for c in model.calls if role_of(c["messages"]) == "agent" and len(c["messages"]) == 2
    }
    assert any("Louvre" in q for q in questions) and any("Eiffel" in q for q in questions)


# ----------------------------------------------------------------------------- LCEL and batch


def answer_chain(graph):
    """README example: question string in, answer string out."""
    return (
        RunnableLambda(lambda q: {"question": q}, name="to_input")
        | graph
        | RunnableLambda(lambda s: s["answer"], name="pick_answer")
    )


async def test_inside_an_lcel_chain():
    graph, _ = make_graph()
    assert await answer_chain(graph).ainvoke("Which city is the Eiffel Tower in?") == "Paris"


QUESTIONS = ["Which city is the Eiffel Tower in?", "Where is the Louvre?", "Where is Notre-Dame?"]


def test_batch_over_questions_sync():
    graph, model = make_graph({"n": 2, "mode": "none", "max_concurrency": 2})
    outs = graph.batch([{"question": q} for q in QUESTIONS], config={"max_concurrency": 2})
    assert [o["answer"] for o in outs] == ["Paris"] * 3
    assert [o["question"] for o in outs] == QUESTIONS
    assert all(len(o["trajectories"]) == 2 for o in outs)


async def test_abatch_of_the_chain_with_per_run_context():
    graph, _ = make_graph()
    chain = answer_chain(graph)
    assert await chain.abatch(QUESTIONS) == ["Paris"] * 3
    # Per-run settings travel as LangGraph context when the graph is called directly.
    outs = await graph.abatch([{"question": q} for q in QUESTIONS[:2]], context={"n": 2, "k": 0})
    assert [len(o["trajectories"]) for o in outs] == [2, 2]


# ----------------------------------------------------------------------------- callbacks / tracing


class RunRecorder(BaseCallbackHandler):
    """Records each chain/model/tool run: name, tags, metadata, parent (what a tracer sees)."""

    def __init__(self) -> None:
        self.runs: dict[UUID, dict[str, Any]] = {}

    def _start(
        self,
        kind: str,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str | None,
        tags: list[str] | None,
        metadata: dict | None,
    ) -> None:
        self.runs[run_id] = {
            "kind": kind,
            "name": name,
            "parent": parent_run_id,
            "tags": set(tags or ()),
            "metadata": dict(metadata or {}),
            "ended": False,
        }

    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None, metadata=None, **kwargs):
        self._start("chain", run_id, parent_run_id, kwargs.get("name"), tags, metadata)

    def on_chat_model_start(
        self,
        serialized,
        messages,
        *,
        run_id,
        parent_run_id=None,
        tags=None,
        metadata=None,
        **kwargs,
    ):
        self._start("llm", run_id, parent_run_id, kwargs.get("name"), tags, metadata)

    def on_tool_start(
        self,
        serialized,
        input_str,
        *,
        run_id,
        parent_run_id=None,
        tags=None,
        metadata=None,
        **kwargs,
    ):
        self._start("tool", run_id, parent_run_id, (serialized or {}).get("name"), tags, metadata)

    def _end(self, run_id: UUID) -> None:
        if run_id in self.runs:
            self.runs[run_id]["ended"] = True

    def on_chain_end(self, outputs, *, run_id, **kwargs):
        self._end(run_id)

    def on_llm_end(self, response, *, run_id, **kwargs):
        self._end(run_id)

    def on_tool_end(self, output, *, run_id, **kwargs):
        self._end(run_id)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.runs.values() if r["name"] == name]

    def ancestors(self, run: dict[str, Any]) -> list[str]:
        names, parent = [], run["parent"]
        while parent in self.runs:
            names.append(self.runs[parent]["name"])
            parent = self.runs[parent]["parent"]
        return names


def _check_trace(rec: RunRecorder, *, n_trajectories: int) -> None:
    names = Counter(r["name"] for r in rec.runs.values())
    assert STAGES <= set(names), names
    root = rec.named("parallelmuse-qa")
    assert len(root) == 1 and root[0]["parent"] is None
    # Every run of the trace carries the caller's tags and metadata (LangSmith filters on them).
    for run in rec.runs.values():
        assert {"my-app", "parallelmuse"} <= run["tags"], run
        assert run["metadata"].get("user") == "u-42", run
        assert run["ended"], run
    # Stage runs are the graph's nodes (LangGraph adds langgraph_node / step metadata).
    for stage in STAGES:
        for run in rec.named(stage):
            assert run["metadata"].get("langgraph_node") == stage
    # One rollout subgraph run per trajectory, under its stage, with the trajectory's metadata.
    rollouts = rec.named("parallelmuse.rollout")
    assert len(rollouts) == n_trajectories
    assert {r["metadata"]["langgraph_node"] for r in rollouts} == {
        "initial_rollout",
        "branch_rollout",
    }
    assert all("parallelmuse-qa" in rec.ancestors(r) for r in rollouts)
    ids = sorted(r["metadata"]["trajectory_id"] for r in rollouts)
    assert ids == ["f0", "t0", "t0.s1.b0", "t0.s1.b1"]
    for run in rollouts:
        if run["metadata"]["trajectory_id"].startswith("t0.s1."):  # branches name their fork point
            assert run["metadata"]["fork_step"] == 1 and run["metadata"]["parent_thread"].endswith("/t0")
    # Agent-step model calls sit inside the rollout runs (think node), reports inside compress.
    llm_parents = Counter(
        next(a for a in rec.ancestors(r) if a in ("think", "compress", "aggregate"))
        for r in rec.runs.values()
        if r["kind"] == "llm"
    )
    assert llm_parents["think"] >= n_trajectories and llm_parents["compress"] == n_trajectories
    assert llm_parents["aggregate"] == 1
    tools = [r for r in rec.runs.values() if r["kind"] == "tool"]
    assert tools and all("parallelmuse.rollout" in rec.ancestors(t) for t in tools)


TRACE_CONFIG = {
    "run_name": "parallelmuse-qa",
    "tags": ["my-app", "parallelmuse"],
    "metadata": {"user": "u-42"},
}


async def test_callbacks_see_every_stage_and_the_rollout_subgraph():
    graph, _ = make_graph()
    rec = RunRecorder()
    out = await graph.ainvoke({"question": "Which city is the Eiffel Tower in?"}, {**TRACE_CONFIG, "callbacks": [rec]})
    assert out["answer"] == "Paris"
    _check_trace(rec, n_trajectories=4)


def test_callbacks_under_the_sync_api():
    graph, _ = make_graph()
    rec = RunRecorder()
    out = graph.invoke({"question": "Which city is the Eiffel Tower in?"}, {**TRACE_CONFIG, "callbacks": [rec]})
    assert out["answer"] == "Paris"
    _check_trace(rec, n_trajectories=4)


@pytest.mark.parametrize("checkpointed", [False, True])
async def test_traced_rollouts_keep_their_own_threads(checkpointed):
    """Callbacks reach the rollout subgraph, its checkpoints stay in its own threads (#8458)."""
    graph, _ = make_graph()
    saver = InMemorySaver() if checkpointed else None
    app = chat_app(graph, saver)
    rec = RunRecorder()
    cfg = {"callbacks": [rec], "configurable": {"thread_id": "chat-7"}}
    await app.ainvoke({"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}, cfg)
    assert len(rec.named("parallelmuse.rollout")) == 4
    # The runner's own memory keeps none: a run nothing can resume deletes its threads when it ends.
    assert set(rollout_runner(graph).checkpointer.storage) == set()
    if checkpointed:
        # The trajectories live in the app's checkpointer, beside the run's own checkpoints.
        runner_threads = set(saver.storage) - {"chat-7"}
        assert len(runner_threads) == 4 and all("/" in t for t in runner_threads)
        assert all(t.startswith("chat-7:") for t in runner_threads)
        parent_namespaces = set(saver.storage["chat-7"])
        assert all("rollout" not in ns and "think" not in ns for ns in parent_namespaces)


def test_the_served_studio_graph_routes_every_call_of_a_question_by_one_key(monkeypatch):
    """graphs/openai_tavily.py behind vllm-router: PARALLELMUSE_ROUTING_HEADER puts the question's key
    on every call (a plain ChatOpenAI sent none, so one question's calls scattered over replicas)."""
    import runpy
    from pathlib import Path

    from langchain_core.messages import HumanMessage

    from langgraph_parallelmuse.models.routing import routing_scope

    monkeypatch.setenv("PARALLELMUSE_ROUTING_HEADER", "x-session-id")
    module = runpy.run_path(str(Path(__file__).resolve().parents[2] / "graphs" / "openai_tavily.py"))
    chat = module["_chat"]("served-model")
    assert chat.supports_prefill is False and chat.supports_scoring is False  # new turns only: the free driver
    with routing_scope("Which city is the Eiffel Tower in?"):
        first = chat._get_request_payload([HumanMessage("a trajectory's prompt")])
        second = chat._get_request_payload([HumanMessage("a report's prompt")])
    assert first["extra_headers"]["x-session-id"] == second["extra_headers"]["x-session-id"]
    monkeypatch.delenv("PARALLELMUSE_ROUTING_HEADER")
    plain = module["_chat"]("served-model")._get_request_payload([HumanMessage("q")])
    assert "extra_headers" not in plain


async def test_a_tool_reads_the_callers_configurable_inside_every_trajectory():
    """LangChain's per-request pattern: a tool reads config["configurable"] (a user id, a tenant's key)."""
    seen = []

    @tool
    async def search(query: str, config: RunnableConfig) -> str:
        """Search the web."""
        seen.append(config["configurable"].get("user_id"))
        return "Snippets: the Eiffel Tower is in Paris."

    steps = [call_text("search", query="Eiffel Tower"), answer_text("Paris")]
    model = ScriptedChatModel(responder=research_responder(lambda i, msgs: steps[min(i, 1)]))
    graph = create_parallelmuse(model, [search], config={"n": 2, "mode": "none"})
    await graph.ainvoke({"question": "Which city is the Eiffel Tower in?"}, {"configurable": {"user_id": "alice"}})
    assert seen == ["alice", "alice"]


def test_a_configurable_models_choice_reaches_the_agent_steps_too_sync():
    """A model made configurable (configurable_fields, init_chat_model(configurable_fields=...)) runs as the
    run's config chose it in every call: the trajectories', not only the reports' and the aggregator's."""
    chosen = []

    def choice(messages):
        chosen.append(role_of(messages))
        return research_responder(lambda i, msgs: answer_text("Rome"))(messages)

    default = ScriptedChatModel(responder=research_responder(lambda i, msgs: answer_text("Paris")))
    model = default.configurable_fields(responder=ConfigurableField(id="responder"))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 1, "mode": "none"})
    out = graph.invoke({"question": "Where is the Colosseum?"}, {"configurable": {"responder": choice}})
    assert out["trajectories"][0]["answer"] == "Rome"
    assert set(chosen) == {"agent", "compress", "aggregate"}
