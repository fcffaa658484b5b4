"""The compiled graph dropped into existing LangGraph apps and LangChain chains, the way a LangGraph
engineer would use it: a node of a checkpointed chat graph with state of its own, streaming,
time travel, a parent's interrupts, cancellation, and a parent's context."""

from __future__ import annotations

import asyncio
import operator
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, Send, interrupt

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.graph import create_parallelmuse
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    answer_text,
    call_text,
    cancel_when,
    make_tools,
    research_responder,
    role_of,
)

CITIES = {"Eiffel Tower": "Paris", "Colosseum": "Rome", "Louvre": "Paris"}


def by_question(index: int, messages: list[BaseMessage]) -> str:
    """The agent answers the city of whatever landmark the question (the first human turn) names."""
    question = messages[1].content
    return answer_text(next((city for name, city in CITIES.items() if name in question), "unknown"))


def make_graph(config: dict | None = None, **kwargs: Any):
    model = ScriptedChatModel(responder=research_responder(by_question))
    graph = create_parallelmuse(model, make_tools()[0], config=config or {"n": 2, "mode": "none"}, **kwargs)
    return graph, model


def asked_questions(model: ScriptedChatModel, since: int = 0) -> set[str]:
    return {c["messages"][1].content for c in model.calls[since:] if role_of(c["messages"]) == "agent"}


class ChatState(MessagesState):
    """A chat app's state that also keeps the question and the answer, as many apps do."""

    question: str
    answer: str | None


def chat_app(graph, *, checkpointer=None):
    builder = StateGraph(ChatState)
    builder.add_node("research", graph)
    builder.add_edge(START, "research")
    builder.add_edge("research", END)
    return builder.compile(checkpointer=checkpointer)


# ----------------------------------------------------------------------------- a chat app's follow-up


async def test_a_follow_up_in_a_checkpointed_parent_with_a_question_key_researches_the_new_message():
    # Before the fix turn 2 silently answered turn 1's question again: the graph wrote `question`
    # into the parent's state, read it back on the next turn as an explicit question, and the record
    # of what it had asked (`asked`) lived only in the subgraph's own state, gone after each run.
    graph, model = make_graph()
    app = chat_app(graph, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "chat-1"}}
    first = await app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, thread)
    calls = len(model.calls)
    second = await app.ainvoke({"messages": [HumanMessage("Where is the Colosseum?")]}, thread)
    assert (first["question"], first["answer"]) == ("Where is the Eiffel Tower?", "Paris")
    assert (second["question"], second["answer"]) == ("Where is the Colosseum?", "Rome")
    assert asked_questions(model, calls) == {"Where is the Colosseum?"}
    assert [m.content for m in second["messages"]] == [
        "Where is the Eiffel Tower?",
        "Paris",
        "Where is the Colosseum?",
        "Rome",
    ]


def test_a_follow_up_in_a_checkpointed_parent_with_a_question_key_sync():
    graph, _ = make_graph()
    app = chat_app(graph, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "chat-2"}}
    app.invoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, thread)
    second = app.invoke({"messages": [HumanMessage("Where is the Colosseum?")]}, thread)
    assert second["answer"] == "Rome" and second["messages"][-1].content == "Rome"


async def test_a_follow_up_passed_back_by_hand_without_a_checkpointer_researches_the_new_message():
    # An app without a checkpointer keeps the conversation itself and sends the last output back
    # with the next human message: the answer message records what it answered.
    graph, _ = make_graph()
    app = chat_app(graph)
    first = await app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]})
    second = await app.ainvoke({**first, "messages": [*first["messages"], HumanMessage("Where is the Colosseum?")]})
    assert second["answer"] == "Rome"


async def test_a_question_key_still_wins_over_the_messages_it_came_with():
    graph, model = make_graph()
    app = chat_app(graph, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "chat-3"}}
    await app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, thread)
    out = await app.ainvoke({"question": "Where is the Louvre?", "messages": [HumanMessage("thanks!")]}, thread)
    assert out["question"] == "Where is the Louvre?"
    calls = len(model.calls)
    # The same question again with no new human message: the finished trajectories are reused.
    again = await app.ainvoke({"question": "Where is the Louvre?"}, thread)
    assert again["question"] == "Where is the Louvre?" and asked_questions(model, calls) == set()


# ----------------------------------------------------------------------------- streaming

STEPS = [
    Reply(call_text("search", "Find the city", query="Eiffel Tower"), regions={"tool_call": -0.3}),
    Reply(call_text("visit", "Open the page", doc="Eiffel Tower"), regions={"tool_call": -2.5}),
    Reply(answer_text("Paris", "The page says Paris")),
]


def branching_graph(**kwargs: Any):
    model = ScriptedChatModel(responder=research_responder(lambda i, messages: STEPS[min(i, 2)]))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 4, "k": 1, "t": 2}, **kwargs)
    return graph, model


async def test_the_messages_stream_of_a_chat_carries_the_reply_not_the_reports_or_the_aggregators_raw_text():
    # Before the fix a chat UI streaming stream_mode="messages" (the usual way to show a reply as
    # it comes) showed every compressed report and the aggregator's "<answer>Paris" as replies of
    # the assistant before the answer itself: the reports' and the aggregation's model calls ran in
    # the graph's own namespace, beside the answer message.
    graph, _ = branching_graph()
    inp = {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}
    streamed = [(msg.content, meta["langgraph_node"]) async for msg, meta in graph.astream(inp, stream_mode="messages")]
    assert streamed == [("Paris", "aggregate")]
    # The internal calls still reach callbacks and astream_events (traces).
    events = [e async for e in graph.astream_events(inp, version="v2") if e["event"] == "on_chat_model_end"]
    assert {e["metadata"]["langgraph_node"] for e in events} == {"think", "compress", "aggregate"}


async def test_the_messages_stream_with_subgraphs_still_shows_the_trajectories_thinking():
    graph, _ = branching_graph()
    inp = {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}
    nodes = Counter()
    async for _, (_msg, meta) in graph.astream(inp, stream_mode="messages", subgraphs=True):
        nodes[meta["langgraph_node"]] += 1
    assert nodes == {"think": 10, "aggregate": 1}  # every agent step of 4 trajectories, and the reply


def test_the_sync_messages_stream_carries_the_reply_too():
    graph, _ = branching_graph()
    inp = {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}
    assert [msg.content for msg, _ in graph.stream(inp, stream_mode="messages")] == ["Paris"]


# ----------------------------------------------------------------------------- a parent's context


@dataclass
class _AppContext:
    """A parent app's context: its own settings, one named like ours and unset (``None``)."""

    user_id: str = "u1"
    temperature: float | None = None  # the app's own model's temperature; None: that model's default


async def test_a_parents_unset_context_field_named_like_a_setting_keeps_the_factory_value():
    # Before the fix the parent's temperature=None was read as our setting and every run of the
    # app failed: "ConfigError: invalid ParallelMuse config: temperature: Input should be a valid number".
    graph, model = make_graph({"n": 2, "mode": "none", "temperature": 0.3})
    parent = StateGraph(MessagesState, context_schema=_AppContext)
    parent.add_node("research", graph)
    parent.add_edge(START, "research")
    app, question = parent.compile(), {"messages": [HumanMessage("Where is the Colosseum?")]}
    with warnings.catch_warnings():
        # langgraph-api copies a run's context into configurable: the unset field is no misplaced setting
        warnings.simplefilter("error")
        out = await app.ainvoke(question, {"configurable": {"temperature": None}}, context=_AppContext())
    assert out["messages"][-1].content == "Rome"
    agent = [c for c in model.calls if role_of(c["messages"]) == "agent"]
    assert agent and all(c["kwargs"].get("temperature") == 0.3 for c in agent)


@dataclass
class _RetrieverAppContext:
    """A RAG app's context: its retriever's top-k and its own model's greedy temperature."""

    k: int = 4
    temperature: float = 0.0
    parallelmuse: dict[str, Any] = field(default_factory=dict)


class _ResearchState(MessagesState):
    trajectories: list[dict[str, Any]]


def _research_app(graph, context_schema: type | None = None):
    parent = StateGraph(_ResearchState, context_schema=context_schema)
    parent.add_node("research", graph)
    parent.add_edge(START, "research")
    return parent.compile()


async def test_a_parents_parallelmuse_entry_is_read_alone_and_its_own_k_stays_its_own():
    # Before the fix the app's retriever k=4 was read as ours: every run raised "n=4 < m + m*k*t = 9".
    graph, _ = branching_graph()
    context = {"user_id": "u1", "k": 4, "parallelmuse": {"n": 4, "k": 1}}
    out = await _research_app(graph).ainvoke(
        {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}, context=context
    )
    assert out["messages"][-1].content == "Paris"
    assert Counter(t["origin"]["kind"] for t in out["trajectories"]) == {"initial": 1, "branch": 2, "fill": 1}


async def test_an_empty_parallelmuse_entry_keeps_the_factory_temperature_not_the_apps():
    # Before the fix the app's own temperature=0.0 made every sample greedy, silently.
    graph, model = make_graph({"n": 2, "mode": "none", "temperature": 0.3})
    app = _research_app(graph, _RetrieverAppContext)
    out = await app.ainvoke({"messages": [HumanMessage("Where is the Colosseum?")]}, context=_RetrieverAppContext())
    assert out["messages"][-1].content == "Rome"
    agent = [c for c in model.calls if role_of(c["messages"]) == "agent"]
    assert agent and all(c["kwargs"].get("temperature") == 0.3 for c in agent)


async def test_a_parents_field_that_breaks_the_config_names_itself_and_the_way_out():
    graph, _ = branching_graph()
    app = _research_app(graph)
    with pytest.raises(ConfigError, match=r"n=4 < m \+ m\*k\*t = 9") as err:
        await app.ainvoke(
            {"messages": [HumanMessage("Which city is the Eiffel Tower in?")]}, context={"user_id": "u1", "k": 4}
        )
    assert str(err.value).endswith(
        "(read from the parent graph's context field 'k'; put ParallelMuse's settings under "
        "context['parallelmuse'] to keep the app's own 'k' out)"
    )
    # The graph's own context is ours: no parent to blame.
    with pytest.raises(ConfigError, match=r"n=4 < m \+ m\*k\*t = 9") as err:
        await graph.ainvoke({"question": "Which city is the Eiffel Tower in?"}, context={"k": 4})
    assert "parent" not in str(err.value)


# ----------------------------------------------------------------------------- a parent's fan-out


class _FanOut(TypedDict):
    questions: list[str]
    answers: Annotated[list[str], operator.add]


async def test_a_parents_send_fan_out_through_a_node_function_collects_every_answer():
    # README "Composition": the graph itself as the node that Send targets writes `question` once per
    # branch into a key without a reducer (InvalidUpdateError); a node function returning only what
    # the parent collects does not.
    graph, model = make_graph()

    async def research(question: str) -> dict:
        out = await graph.ainvoke({"question": question})
        return {"answers": [out["answer"]]}

    builder = StateGraph(_FanOut)
    builder.add_node("research", research)
    builder.add_conditional_edges(START, lambda s: [Send("research", q) for q in s["questions"]])
    app = builder.compile()
    out = await app.ainvoke({"questions": ["Where is the Eiffel Tower?", "Where is the Colosseum?"]})
    assert sorted(out["answers"]) == ["Paris", "Rome"]
    assert asked_questions(model) == {"Where is the Eiffel Tower?", "Where is the Colosseum?"}


_TWICE = [
    Reply(call_text("search", "Find the city", query="Eiffel Tower"), regions={"tool_call": -2.5}, delay=0.05),
    Reply(answer_text("Paris", "The page says Paris"), delay=0.05),
]


async def _fan_out(config: dict, questions: list[str], thread_id: str) -> tuple[dict, ScriptedChatModel, dict]:
    """A checkpointed parent's Send fan-out over ``questions``: its output, the model, and the number of
    checkpoints of each trajectory thread (by trajectory id) in the parent's saver, where they live."""
    from langgraph.constants import CONFIG_KEY_CHECKPOINTER

    from langgraph_parallelmuse.graph import rollout_runner

    model = ScriptedChatModel(responder=research_responder(lambda i, messages: _TWICE[min(i, 1)]))
    graph = create_parallelmuse(model, make_tools()[0], config=config)

    async def research(question: str) -> dict:
        out = await graph.ainvoke({"question": question})
        return {"answers": [[(t["id"], t["answer"], len(t["steps"])) for t in out["trajectories"]]]}

    builder = StateGraph(_FanOut)
    builder.add_node("research", research)
    builder.add_conditional_edges(START, lambda s: [Send("research", q) for q in s["questions"]])
    saver = InMemorySaver()
    app = builder.compile(checkpointer=saver)
    out = await app.ainvoke({"questions": questions}, {"configurable": {"thread_id": thread_id}})
    rollouts = rollout_runner(graph).graph
    checkpoints = {}
    for thread in [t for t in saver.storage if t.startswith(f"{thread_id}:")]:
        config = {"configurable": {"thread_id": thread, CONFIG_KEY_CHECKPOINTER: saver}}
        if history := [s async for s in rollouts.aget_state_history(config)]:  # not a thread only looked up
            checkpoints[thread.rsplit("/", 1)[1]] = len(history)
    return out, model, checkpoints


@pytest.mark.parametrize(
    "config",
    [{"n": 2, "mode": "none"}, {"n": 4, "k": 1, "t": 2}, {"n": 4, "k": 1, "t": 2, "branching": "online"}],
    ids=["from_scratch", "post_hoc", "online"],
)
async def test_a_fan_out_asking_one_question_twice_on_a_checkpointed_thread_is_one_run(config):
    """Both branches have one run id (the parent's thread, the question, the settings): before, both
    drove the same trajectory threads at once, twice the model calls for one set of trajectories, and a
    thread history holding two different step 0s. Now the second waits for each trajectory and reuses
    it, as asking again later on the thread does."""
    question = "Where is the Eiffel Tower?"
    _, alone, checkpoints_alone = await _fan_out(config, [question], "solo")
    out, model, checkpoints = await _fan_out(config, [question, question], "chat")
    first, second = (sorted(a) for a in out["answers"])  # in the order they finished
    assert first == second and len(first) == config["n"] and {a for _, a, _ in first} == {"Paris"}
    agent_calls = [c for c in model.calls if role_of(c["messages"]) == "agent"]
    assert len(agent_calls) == len([c for c in alone.calls if role_of(c["messages"]) == "agent"])
    # Each trajectory thread holds one run's snapshots: no second writer's step 0 among them.
    assert checkpoints == checkpoints_alone and len(checkpoints) == config["n"]
    from langgraph_parallelmuse.nodes import IN_FLIGHT

    assert not IN_FLIGHT._held  # every claim ended with its trajectory


async def test_a_run_cancelled_on_a_checkpointed_thread_leaves_no_claim_and_resumes_at_once():
    from langgraph_parallelmuse.nodes import IN_FLIGHT

    model = ScriptedChatModel(responder=research_responder(lambda i, messages: _TWICE[min(i, 1)]))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 2, "mode": "none"})
    app = chat_app(graph, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "cancelled"}}
    ask = {"messages": [HumanMessage("Where is the Eiffel Tower?")]}
    run = asyncio.create_task(app.ainvoke(ask, thread))
    await cancel_when(run, lambda: model.calls)
    assert not IN_FLIGHT._held
    out = await asyncio.wait_for(app.ainvoke(ask, thread), 10)
    assert out["answer"] == "Paris"


def test_a_sync_call_blocking_the_loop_that_runs_the_same_run_is_refused_not_hung(monkeypatch):
    """``invoke`` inside a coroutine while that loop runs the same question on the same thread (a
    notebook's task, then a sync cell): the sync run's nodes waited for the claims of a task on the
    loop the call blocks, forever."""
    from langgraph_parallelmuse.nodes import IN_FLIGHT

    monkeypatch.setattr(IN_FLIGHT, "STALL_SECONDS", 1.0)
    model = ScriptedChatModel(responder=research_responder(lambda i, messages: _TWICE[min(i, 1)]))
    # The trajectory threads are shared, not the run's own (two runs there at once are refused first).
    saver = InMemorySaver()
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 2, "mode": "none"}, trajectory_checkpointer=saver)
    thread: dict[str, Any] = {"configurable": {"thread_id": "blocked"}}
    said: list[BaseException] = []

    async def notebook() -> str:
        running = asyncio.create_task(graph.ainvoke({"question": "Where is the Eiffel Tower?"}, thread))
        while not model.calls:
            await asyncio.sleep(0.005)
        try:
            graph.invoke({"question": "Where is the Eiffel Tower?"}, thread)  # blocks this loop
        except RuntimeError as exc:
            said.append(exc)
        return (await running)["answer"]

    answers: list[str] = []
    worker = threading.Thread(target=lambda: answers.append(asyncio.run(notebook())), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the sync call hung"
    assert "has run nothing for 1 s: a sync call (invoke, batch, stream)" in str(said[0]) and "ainvoke" in str(said[0])
    assert answers == ["Paris"] and not IN_FLIGHT._held  # the running run went on and finished


# ----------------------------------------------------------------------------- a parent's interrupts


async def test_a_parents_interrupt_before_the_research_node_can_change_the_question():
    graph, model = make_graph()

    def confirm(state: MessagesState) -> dict:
        answer = interrupt({"research": state["messages"][-1].content})
        return {} if answer == "yes" else {"messages": [HumanMessage(answer)]}

    builder = StateGraph(MessagesState)
    builder.add_node("confirm", confirm)
    builder.add_node("research", graph)
    builder.add_edge(START, "confirm")
    builder.add_edge("confirm", "research")
    builder.add_edge("research", END)
    app = builder.compile(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "hitl-1"}}
    paused = await app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, thread)
    assert paused["__interrupt__"][0].value == {"research": "Where is the Eiffel Tower?"} and not model.calls
    out = await app.ainvoke(Command(resume="Where is the Colosseum?"), thread)
    assert out["messages"][-1].content == "Rome" and asked_questions(model) == {"Where is the Colosseum?"}


# ----------------------------------------------------------------------------- cancellation


async def test_cancelling_a_parents_ainvoke_mid_wave_leaves_no_task_and_no_held_slot():
    # README: under the async API a cancel stops everything. Here mid branch wave, the graph a node
    # of a parent app, max_concurrency 2 (a slot left held would stall the next run).
    def slow(index: int, messages: list[BaseMessage]) -> Reply:
        return Reply(STEPS[min(index, 2)].text, regions=STEPS[min(index, 2)].regions, delay=0.1)

    model = ScriptedChatModel(responder=research_responder(slow))
    config = {"n": 4, "k": 1, "t": 2, "max_concurrency": 2}
    graph = create_parallelmuse(model, make_tools()[0], config=config)
    app = chat_app(graph)
    before = asyncio.all_tasks()
    run = asyncio.create_task(app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}))
    # The first wave (initial + fill) makes 6 calls: at the 7th a branch runs.
    await cancel_when(run, lambda: len(model.calls) >= 7)
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()
    calls = len(model.calls)
    await asyncio.sleep(0.3)
    assert len(model.calls) == calls  # nothing went on calling the model
    out = await asyncio.wait_for(app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}), 30)
    assert out["answer"] == "Paris"


# ----------------------------------------------------------------------------- time travel


async def test_replaying_from_the_checkpoint_before_aggregate_reruns_only_the_aggregation():
    graph, model = branching_graph(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "travel-1"}}
    first = await graph.ainvoke({"question": "Which city is the Eiffel Tower in?"}, thread)
    (before,) = [s async for s in graph.aget_state_history(thread) if s.next == ("aggregate",)]
    calls = len(model.calls)
    replayed = await graph.ainvoke(None, before.config)
    assert Counter(role_of(c["messages"]) for c in model.calls[calls:]) == {"aggregate": 1}
    assert replayed["answer"] == first["answer"] == "Paris"
    assert len(replayed["trajectories"]) == 4 and len(replayed["reports"]) == 4


@pytest.mark.parametrize("paused_before", ["initial_rollout", "aggregate"])
def test_a_checkpoint_edited_with_update_state_as_the_last_node_that_wrote_it_can_be_forked(paused_before):
    """update_state runs the edges of the node it writes as, which LangGraph runs without a runtime:
    every edge that read the run's settings crashed (AttributeError: 'NoneType' object has no
    attribute 'context'), e.g. reports edited at the documented pause before aggregate."""
    graph, model = make_graph(checkpointer=InMemorySaver(), interrupt_before=[paused_before])
    thread: dict[str, Any] = {"configurable": {"thread_id": f"edit-{paused_before}"}}
    graph.invoke({"question": "Where is the Eiffel Tower?"}, thread)
    edited = graph.update_state(thread, {"stats": {"edited": True}})
    assert graph.invoke(None, edited)["answer"] == "Paris"


async def test_a_fork_whose_question_was_edited_after_prepare_researches_it_not_the_old_questions_threads():
    """Before the fix the fork ran the edited question's jobs in the threads of the question prepare
    had seen, found them finished and answered 'Paris' to a question about the Colosseum, calling no model."""
    graph, model = make_graph(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "travel-2"}}
    first = await graph.ainvoke({"question": "Where is the Eiffel Tower?"}, thread)
    (prepared,) = [s async for s in graph.aget_state_history(thread) if s.next == ("initial_rollout",) * 2]
    fork = await graph.aupdate_state(prepared.config, {"question": "Where is the Colosseum?"}, as_node="prepare")
    calls = len(model.calls)
    forked = await graph.ainvoke(None, fork)
    assert asked_questions(model, calls) == {"Where is the Colosseum?"}
    assert (forked["answer"], first["answer"]) == ("Rome", "Paris")
    old, new = ({t["thread_id"] for t in out["trajectories"]} for out in (first, forked))
    assert not old & new
    again = len(model.calls)
    replayed = await graph.ainvoke(None, fork)  # the fork's own threads, found again: no model call
    assert replayed["answer"] == "Rome" and asked_questions(model, again) == set()


# ----------------------------------------------------------------------------- runs, threads and settings

STEPS = [
    Reply(call_text("search", "Find the country first", query="capital of France"), regions={"tool_call": -0.2}),
    Reply(call_text("visit", "Open the page", doc="Paris"), regions={"tool_call": -2.5}, delay=0.05),
    Reply(answer_text("Paris", "It says Paris"), delay=0.05),
]
QUESTION = "What is the capital of France?"


def stepping_graph(config: dict | None = None, **kwargs: Any):
    model = ScriptedChatModel(responder=research_responder(lambda i, messages: STEPS[min(i, 2)]))
    graph = create_parallelmuse(model, make_tools()[0], config=config or {"n": 4, "m": 1, "k": 1, "t": 3}, **kwargs)
    return graph, model


def agent_calls(model: ScriptedChatModel, since: int = 0) -> int:
    return sum(role_of(c["messages"]) == "agent" for c in model.calls[since:])


async def test_a_thread_id_without_a_checkpointer_samples_anew():
    """A thread_id passed for tracing alone replayed the first run's trajectories: 0 model calls."""
    graph, model = stepping_graph()
    for _ in range(2):
        before = len(model.calls)
        await graph.ainvoke({"question": QUESTION}, {"configurable": {"thread_id": "user-42"}})
        assert agent_calls(model, before) == 9


@pytest.mark.parametrize("branching", ["post_hoc", "online"])
async def test_the_run_configs_max_concurrency_bounds_the_model_calls(branching):
    """Online branching runs every trajectory inside one node, which LangGraph's bound does not reach."""
    graph, model = stepping_graph({"n": 7, "m": 1, "k": 2, "t": 3, "branching": branching})
    await graph.ainvoke({"question": QUESTION}, {"max_concurrency": 1})
    assert model.peak_in_flight == 1


async def test_max_concurrency_is_no_part_of_a_runs_identity():
    """Asked again with a lower max_concurrency, the run sampled every trajectory anew; resumed with
    one, it was refused as a clash of settings."""
    graph, model = stepping_graph(checkpointer=InMemorySaver(), interrupt_before=["branch_rollout"])
    thread = {"configurable": {"thread_id": "t"}}
    await graph.ainvoke({"question": QUESTION}, thread)
    out = await graph.ainvoke(None, thread, context={"max_concurrency": 2})
    assert out["answer"] == "Paris"
    before = len(model.calls)
    await graph.ainvoke({"question": QUESTION}, thread, context={"max_concurrency": 1})
    await graph.ainvoke(None, thread, context={"max_concurrency": 1})
    assert agent_calls(model, before) == 0


async def test_a_parent_apps_raw_context_values_are_validated_before_they_are_compared():
    """A parent without this context_schema passes "4": prepare took it as 4, the next node refused
    the raw "4" as a clash with the stored 4."""
    graph, _ = stepping_graph()
    app = chat_app(graph)
    out = await app.ainvoke({"messages": [HumanMessage(QUESTION)]}, context={"n": "4", "seed": "7"})
    assert out["messages"][-1].content == "Paris"


async def test_a_new_run_on_the_thread_does_not_show_the_last_runs_answer_source():
    graph, _ = stepping_graph(checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    thread = {"configurable": {"thread_id": "t"}}
    await graph.ainvoke({"question": QUESTION}, thread)
    assert (await graph.ainvoke(None, thread))["answer_source"] != "none"
    await graph.ainvoke({"question": "What is the capital of Germany?"}, thread)
    values = (await graph.aget_state(thread)).values
    assert (values["answer"], values["answer_source"]) == (None, "none")


def test_rollout_runner_finds_the_runner_of_a_graph_the_user_compiled_or_copied():
    from langgraph_parallelmuse.graph import build_parallelmuse_graph, rollout_runner

    builder = build_parallelmuse_graph(ScriptedChatModel(), make_tools()[0])
    compiled = builder.compile()
    for graph in (compiled, compiled.with_config(tags=["x"]), compiled.copy()):
        assert rollout_runner(graph) is rollout_runner(builder)


def test_rollout_runner_finds_the_runner_of_a_graph_wrapped_with_retry():
    # RunnableRetry forwards no attribute to the graph it wraps: "not a ParallelMuse graph".
    from langgraph_parallelmuse.graph import rollout_runner

    graph, _ = make_graph()
    for wrapped in (graph.with_retry(), graph.with_config(tags=["x"]).with_retry().with_listeners()):
        assert rollout_runner(wrapped) is rollout_runner(graph)


async def test_the_run_configs_max_concurrency_bounds_each_run_of_a_batch_on_its_own():
    """It became one semaphore shared by every run that passed the value: a batch of two ran as one."""
    model = ScriptedChatModel(responder=research_responder(lambda i, m: Reply(answer_text("Paris"), delay=0.2)))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 4, "mode": "none", "aggregation": "majority"})
    await graph.abatch([{"question": f"Capital of country {i}?"} for i in range(2)], {"max_concurrency": 2})
    assert model.peak_in_flight == 4


async def test_a_trajectory_checkpointer_alone_lets_a_question_asked_again_on_the_thread_reuse_its_trajectories():
    saver, thread = InMemorySaver(), {"configurable": {"thread_id": "job-17"}}
    for expected_calls in (2, 0):  # a second process after a crash: a new graph, the same database
        model = ScriptedChatModel(responder=research_responder(lambda i, m: answer_text("Paris")))
        config = {"n": 2, "mode": "none", "aggregation": "majority"}
        graph = create_parallelmuse(model, make_tools()[0], config=config, trajectory_checkpointer=saver)
        await graph.ainvoke({"question": QUESTION}, thread)
        assert agent_calls(model) == expected_calls
