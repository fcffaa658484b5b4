"""Time travel and human in the loop around the graph, as LangGraph users do them in Studio and in code:
replays and forks from earlier checkpoints (of the graph itself and of a parent app holding it), a
parent's ``interrupt()`` and pauses, edits of a paused run's state, a chat's turns, a parent node failing
after the research, each under ``stream(subgraphs=True)`` and ``astream_events`` too."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.graph import create_parallelmuse
from langgraph_parallelmuse.nodes import BUSY_THREADS, IN_FLIGHT
from tests.unit.fakes import Reply, ScriptedChatModel, answer_text, call_text, make_tools, research_responder, role_of

CITIES = {"Eiffel Tower": "Paris", "Colosseum": "Rome"}
EIFFEL, COLOSSEUM = "Where is the Eiffel Tower?", "Where is the Colosseum?"


def _step(index: int, messages: list[BaseMessage]) -> Reply:
    """Search, visit (the most uncertain call: the fork point), then answer the landmark's city."""
    city = next((c for name, c in CITIES.items() if name in messages[1].content), "unknown")
    steps = [
        Reply(call_text("search", "Find the city", query=city), regions={"tool_call": -0.3}),
        Reply(call_text("visit", "Open the page", doc=city), regions={"tool_call": -2.5}),
        Reply(answer_text(city, f"The page says {city}")),
    ]
    return steps[min(index, 2)]


def _graph(**kwargs: Any):
    """n=4 with branches: an initial trajectory, a fill, two branches at its visit."""
    model = ScriptedChatModel(responder=research_responder(_step))
    return create_parallelmuse(model, make_tools()[0], config={"n": 4, "k": 1, "t": 2}, **kwargs), model


def _roles(model: ScriptedChatModel, since: int = 0) -> Counter:
    return Counter(role_of(c["messages"]) for c in model.calls[since:])


def _asked(model: ScriptedChatModel, since: int = 0) -> set[str]:
    return {c["messages"][1].content for c in model.calls[since:] if role_of(c["messages"]) == "agent"}


def _nothing_held() -> bool:
    return not BUSY_THREADS._held and not IN_FLIGHT._held


class _Chat(MessagesState):
    """A chat app's state keeping the question and the answer, and a note its own nodes write."""

    question: str
    answer: str | None
    note: str


def _app(graph, saver, *, before=None, after=None, **compile_kwargs: Any):
    builder = StateGraph(_Chat)
    builder.add_node("research", graph)
    chain = [
        name for name, fn in (("before", before), ("research", None), ("after", after)) if name == "research" or fn
    ]
    for name, fn in (("before", before), ("after", after)):
        if fn is not None:
            builder.add_node(name, fn)
    for a, b in zip([START, *chain], [*chain, END], strict=True):
        builder.add_edge(a, b)
    return builder.compile(checkpointer=saver, **compile_kwargs)


# ----------------------------------------------------------------------------- forks past the rollout


async def test_a_fork_at_the_pause_before_aggregate_with_the_question_edited_is_refused_not_answered():
    """Before the fix the edited question was answered from the trajectories of the old one, with no model
    call but the aggregator's: 'Paris' for the Colosseum, the answer message saying it answered that question."""
    graph, model = _graph(checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    thread: dict[str, Any] = {"configurable": {"thread_id": "pause-edit"}}
    await graph.ainvoke({"question": EIFFEL}, thread)
    calls = len(model.calls)
    with pytest.raises(ConfigError, match=r"trajectories \(t0, f0, t0\.s1\.b0, t0\.s1\.b1\) were sampled for another"):
        await graph.aupdate_state(thread, {"question": COLOSSEUM})  # refused when made
    assert len(model.calls) == calls and (await graph.aget_state(thread)).values["question"] == EIFFEL
    # What the message says to do: edit the checkpoint after prepare, which samples the question anew.
    (prepared,) = [s async for s in graph.aget_state_history(thread) if s.next and s.next[0] == "initial_rollout"]
    fork = await graph.aupdate_state(prepared.config, {"question": COLOSSEUM})
    await graph.ainvoke(None, fork)  # pauses before aggregate again
    out = await graph.ainvoke(None, thread)
    assert out["answer"] == "Rome" and _asked(model, calls) == {COLOSSEUM}
    assert {t["answer"] for t in out["trajectories"]} == {"Rome"} and len(out["trajectories"]) == 4


async def test_an_edit_written_as_a_node_whose_edges_check_nothing_is_refused_by_the_next_node():
    """Written as crossover_rollout (a plain edge to aggregate), the edit is made; before the fix aggregate
    then answered 'Paris' to the Colosseum question."""
    graph, model = _graph(checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    thread: dict[str, Any] = {"configurable": {"thread_id": "as-crossover"}}
    await graph.ainvoke({"question": EIFFEL}, thread)
    fork = await graph.aupdate_state(thread, {"question": COLOSSEUM}, as_node="crossover_rollout")
    calls = len(model.calls)
    with pytest.raises(ConfigError, match="were sampled for another question"):
        await graph.ainvoke(None, fork)
    assert len(model.calls) == calls and _nothing_held()


async def test_a_fork_mid_rollout_with_a_trajectory_setting_edited_is_refused_when_it_is_made():
    """Before the fix, edited at the pause before the branches, the fork ran the branches at temperature 0.1
    beside the first wave's at 0.6, and its stats said 0.1 for all four."""
    graph, model = _graph(checkpointer=InMemorySaver(), interrupt_before=["branch_rollout"])
    thread: dict[str, Any] = {"configurable": {"thread_id": "mid-rollout"}}
    await graph.ainvoke({"question": EIFFEL}, thread)
    settings = (await graph.aget_state(thread)).values["settings"]
    calls = len(model.calls)
    with pytest.raises(ConfigError, match=r"trajectories \(t0, f0\) were sampled .* checkpoint after prepare"):
        await graph.aupdate_state(thread, {"settings": {**settings, "temperature": 0.1}})
    assert len(model.calls) == calls
    # An edit no trajectory depends on still goes on from the pause, the first wave kept.
    fork = await graph.aupdate_state(thread, {"settings": {**settings, "max_report_tokens": 64}})
    out = await graph.ainvoke(None, fork)
    assert out["answer"] == "Paris" and _roles(model, calls) == {"agent": 4, "compress": 4, "aggregate": 1}


async def test_a_partial_settings_edit_at_the_pause_is_refused_with_what_it_changed_and_how_to_edit():
    """``update_state(thread, {"settings": {"aggregation": "majority"}})``, a Stage-2 edit written partial:
    the whole settings are replaced, so n, k and t took their defaults. Before the fix the refusal said to
    edit only what Stage 2 reads (which the caller thought they did) and named no setting; before the fork
    check the run went on silently under the defaults (stats n=8 for four trajectories; from the pause
    before the branches, eight trajectories sampled)."""
    graph, model = _graph(checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    thread: dict[str, Any] = {"configurable": {"thread_id": "partial-edit"}}
    await graph.ainvoke({"question": EIFFEL}, thread)
    calls = len(model.calls)
    with pytest.raises(ConfigError, match=r"settings n=8 \(was 4\), k=2 \(was 1\), t=3 \(was 2\): update_state re"):
        await graph.aupdate_state(thread, {"settings": {"aggregation": "majority"}})
    assert len(model.calls) == calls
    # What the message says to do: the run's settings with the field changed.
    settings = (await graph.aget_state(thread)).values["settings"]
    fork = await graph.aupdate_state(thread, {"settings": {**settings, "aggregation": "majority"}})
    out = await graph.ainvoke(None, fork)
    assert out["answer"] == "Paris" and not _roles(model, calls)["agent"]


async def test_a_finished_run_written_again_as_prepare_with_another_question_is_refused_not_mixed():
    """Before the fix the new question's first wave replaced t0 and f0 by id while the old question's
    branches stayed: two trajectories answered 'Rome', two 'Paris', in one run."""
    graph, model = _graph(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "as-prepare"}}
    await graph.ainvoke({"question": EIFFEL}, thread)
    calls = len(model.calls)
    with pytest.raises(ConfigError, match="were sampled for another question"):
        await graph.aupdate_state(thread, {"question": COLOSSEUM}, as_node="prepare")
    assert len(model.calls) == calls


async def test_a_parents_paused_research_whose_question_is_edited_in_its_namespace_is_refused():
    """Studio's edit of the subgraph's state at its pause (the nested form of the first test)."""
    graph, model = _graph(interrupt_before=["aggregate"])
    app = _app(graph, InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "nested-edit"}}
    await app.ainvoke({"messages": [HumanMessage(EIFFEL)]}, thread)
    research = (await app.aget_state(thread, subgraphs=True)).tasks[0].state
    assert research.next == ("aggregate",)
    calls = len(model.calls)
    with pytest.raises(ConfigError, match="were sampled for another question"):
        await app.aupdate_state(research.config, {"question": COLOSSEUM})
    assert len(model.calls) == calls and _nothing_held()
    assert (await app.ainvoke(None, thread))["answer"] == "Paris"  # the paused run goes on unedited


# ----------------------------------------------------------------------------- replays (guards)


async def test_replaying_any_checkpoint_of_a_run_reuses_every_finished_trajectory():
    """A guard (it passes on the code before the fork check): from every checkpoint of the graph's own
    thread a replay runs no agent step again, keeps the four trajectories and answers as the run did."""
    graph, model = _graph(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "replays"}}
    first = await graph.ainvoke({"question": EIFFEL}, thread)
    threads = sorted(t["thread_id"] for t in first["trajectories"])
    history = [s async for s in graph.aget_state_history(thread)]
    assert len(history) == 11
    for snapshot in history[1:]:
        calls = len(model.calls)
        out = await graph.ainvoke(None, snapshot.config)
        assert out["answer"] == "Paris" and sorted(t["thread_id"] for t in out["trajectories"]) == threads
        assert not _roles(model, calls)["agent"] and _nothing_held()


def test_a_parent_apps_replay_reuses_the_research_and_its_fork_researches_the_edited_message():
    """A guard: the sync API on a SQLite saver, the graph a node of a chat app."""
    graph, model = _graph()
    with SqliteSaver.from_conn_string(":memory:") as saver:
        app = _app(graph, saver)
        thread: dict[str, Any] = {"configurable": {"thread_id": "parent-replay"}}
        app.invoke({"messages": [HumanMessage(EIFFEL)]}, thread)
        (before,) = [s for s in app.get_state_history(thread) if s.next == ("research",)]
        calls = len(model.calls)
        replayed = app.invoke(None, before.config)
        assert replayed["answer"] == "Paris" and not _roles(model, calls)["agent"]
        message = before.values["messages"][-1]
        fork = app.update_state(before.config, {"messages": [HumanMessage(COLOSSEUM, id=message.id)]})
        calls = len(model.calls)
        forked = app.invoke(None, fork)
        assert forked["answer"] == "Rome" and _asked(model, calls) == {COLOSSEUM}
        assert [m.content for m in forked["messages"]] == [COLOSSEUM, "Rome"] and _nothing_held()


# ----------------------------------------------------------------------------- a parent's interrupts (guards)


def _confirm(state: _Chat) -> dict:
    return {"note": f"confirmed {interrupt({'research': state['messages'][-1].content})}"}


def _review(state: _Chat) -> dict:
    return {"note": f"{state['note']}, reviewed {interrupt({'answer': state['answer']})}"}


@pytest.mark.parametrize("how", ["ainvoke", "astream_subgraphs", "astream_events"])
async def test_a_chat_with_interrupts_around_the_research_resumes_twice_per_turn_without_researching_again(how):
    """A guard: interrupt() before and after the research node, resumed with Command(resume=...), two
    turns on one thread, under each API a Studio or a chat UI drives."""
    graph, model = _graph()
    app = _app(graph, InMemorySaver(), before=_confirm, after=_review)
    thread: dict[str, Any] = {"configurable": {"thread_id": f"hitl-{how}"}}

    async def drive(inp: Any) -> None:
        if how == "ainvoke":
            await app.ainvoke(inp, thread)
        elif how == "astream_subgraphs":
            _ = [c async for c in app.astream(inp, thread, subgraphs=True, stream_mode=["updates", "custom"])]
        else:
            _ = [e async for e in app.astream_events(inp, thread, version="v2")]

    for question, city in ((EIFFEL, "Paris"), (COLOSSEUM, "Rome")):
        calls = len(model.calls)
        await drive({"messages": [HumanMessage(question)]})
        assert (await app.aget_state(thread)).next == ("before",) and len(model.calls) == calls
        await drive(Command(resume="yes"))
        assert (await app.aget_state(thread)).next == ("after",)
        researched = _roles(model, calls)
        await drive(Command(resume="ok"))
        state = await app.aget_state(thread)
        assert (
            not state.next and state.values["answer"] == city and state.values["note"] == "confirmed yes, reviewed ok"
        )
        assert _roles(model, calls) == researched == {"agent": 10, "compress": 4, "aggregate": 1}
        assert _asked(model, calls) == {question} and _nothing_held()


@pytest.mark.parametrize("api", ["sync", "async"])
async def test_a_parent_node_failing_after_the_research_resumes_without_researching_again(api):
    """A guard: the research node's checkpoint is kept; the resume runs only the failed node."""
    failures = [RuntimeError("the app's own node failed")]

    def after(state: _Chat) -> dict:
        if failures:
            raise failures.pop()
        return {"note": f"saved {state['answer']}"}

    graph, model = _graph()
    app = _app(graph, InMemorySaver(), after=after)
    thread: dict[str, Any] = {"configurable": {"thread_id": f"after-fails-{api}"}}
    inp = {"messages": [HumanMessage(EIFFEL)]}
    with pytest.raises(RuntimeError, match="own node failed"):
        if api == "sync":
            list(app.stream(inp, thread, subgraphs=True))
        else:
            _ = [c async for c in app.astream(inp, thread, subgraphs=True)]
    calls = len(model.calls)
    out = app.invoke(None, thread) if api == "sync" else await app.ainvoke(None, thread)
    assert out["note"] == "saved Paris" and len(model.calls) == calls and _nothing_held()


async def test_the_graphs_own_pause_resumed_by_a_command_after_a_stream_left_at_the_interrupt():
    """A guard: a stream the caller leaves at the ``__interrupt__`` chunk (without closing it) lets go of
    the thread as the generator is finalised; the resume (a Command, as Studio sends) is not refused."""
    graph, model = _graph(checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    thread: dict[str, Any] = {"configurable": {"thread_id": "left-stream"}}
    async for _, chunk in graph.astream({"question": EIFFEL}, thread, subgraphs=True):
        if "__interrupt__" in chunk:
            break
    calls = len(model.calls)
    out = await graph.ainvoke(Command(resume="go on"), thread)
    assert out["answer"] == "Paris" and _roles(model, calls) == {"aggregate": 1} and _nothing_held()


# ----------------------------------------------------------------------------- a run's own pauses


@pytest.mark.parametrize("api", ["sync", "async"])
async def test_a_runs_own_pause_without_a_checkpointer_is_an_error_not_an_answer_of_none(api):
    """``invoke(..., interrupt_before=[...])`` on a graph without a checkpointer: before the fix the run
    sampled every trajectory and wrote every report, stopped at the pause and returned answer None with no
    error, and nothing kept to resume from (the factory's pauses were refused so, not the run's)."""
    graph, model = _graph()
    inp = {"question": EIFFEL}
    with pytest.raises(ConfigError, match="no checkpointer to resume from"):
        if api == "sync":
            graph.invoke(inp, interrupt_before=["aggregate"])
        else:
            await graph.ainvoke(inp, interrupt_after=["collect"])
    assert model.calls == [] and _nothing_held()


async def test_a_runs_own_pause_on_a_checkpointed_thread_resumes_with_the_rollout_kept():
    """A guard: Studio's breakpoints are the run's own pauses, on the server's checkpointer."""
    graph, model = _graph(checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "breakpoint"}}
    paused = await graph.ainvoke({"question": EIFFEL}, thread, interrupt_before=["aggregate"])
    assert paused["answer"] is None and (await graph.aget_state(thread)).next == ("aggregate",)
    calls = len(model.calls)
    assert (await graph.ainvoke(None, thread))["answer"] == "Paris"
    assert _roles(model, calls) == {"aggregate": 1} and _nothing_held()
