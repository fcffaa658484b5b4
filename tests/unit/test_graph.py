"""The full ParallelMuse graph with fakes: budget, branch picks, map-reduce, I/O, streaming, APIs,
composition."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_parallelmuse import nodes as nodes_module
from langgraph_parallelmuse.errors import (
    ConfigError,
    InputError,
    MissingLogprobsError,
    ParallelMuseError,
    ThreadBusyError,
)
from langgraph_parallelmuse.graph import create_parallelmuse, rollout_runner
from tests.unit.fakes import (
    Reply,
    ScriptedChatModel,
    agent_step,
    answer_text,
    call_text,
    cancel_when,
    make_tools,
    research_responder,
    role_of,
)

QUESTION = "What is the capital of France?"

# Step 1's tool call is the most uncertain exploration; step 2's thought the most uncertain
# reasoning.
STEPS = [
    Reply(
        call_text("search", "Find the country first", query="capital of France"),
        regions={"tool_call": -0.2, "think": -0.3},
    ),
    Reply(call_text("visit", "Open the page", doc="Paris"), regions={"tool_call": -2.5, "think": -0.1}),
    Reply(answer_text("Paris", "It says Paris"), regions={"think": -3.0, "answer": -0.1}),
]


def by_step(steps=STEPS):
    return lambda index, messages: steps[min(index, len(steps) - 1)]


def _graph(config, *, agent=None, aggregate=None, tools=None, **kwargs):
    responder_kwargs = {} if aggregate is None else {"aggregate": aggregate}
    model = ScriptedChatModel(responder=research_responder(agent or by_step(), **responder_kwargs))
    tool_list, calls = make_tools() if tools is None else tools
    graph = create_parallelmuse(model, tool_list, config=config, **kwargs)
    return graph, model, calls


def _kinds(out):
    return Counter(t["origin"]["kind"] for t in out["trajectories"])


def _roles(model):
    return Counter(role_of(c["messages"]) for c in model.calls)


# ----------------------------------------------------------------------------- budget


@pytest.mark.parametrize(
    ("n", "m", "k", "t", "mode", "initial", "branch", "fill"),
    [
        (1, 1, 0, 1, "none", 1, 0, 0),
        (3, 1, 2, 3, "none", 1, 0, 2),
        (4, 1, 1, 2, "exploration", 1, 2, 1),
        (8, 1, 2, 3, "exploration", 1, 6, 1),  # paper defaults
        (5, 2, 1, 1, "reasoning", 2, 2, 1),
        (6, 2, 1, 2, "mixed", 2, 4, 0),
        (7, 1, 3, 2, "all", 1, 6, 0),
    ],
)
async def test_n_trajectories_come_out_for_every_valid_budget(n, m, k, t, mode, initial, branch, fill):
    graph, model, _ = _graph({"n": n, "m": m, "k": k, "t": t, "mode": mode})
    out = await graph.ainvoke({"question": QUESTION})

    assert len(out["trajectories"]) == n
    assert _kinds(out) == Counter({"initial": initial, "branch": branch, "fill": fill}) - Counter()
    assert len({tr["id"] for tr in out["trajectories"]}) == n
    assert len({tr["thread_id"] for tr in out["trajectories"]}) == n
    assert all(tr["status"] == "answered" and tr["answer"] == "Paris" for tr in out["trajectories"])
    budget = out["stats"]["budget"]
    assert (budget["n"], budget["initial"], budget["branches"], budget["fill"]) == (
        n,
        initial,
        branch,
        fill,
    )
    assert out["stats"]["rollout"]["trajectories"] == n
    assert out["stats"]["rollout"]["by_kind"] == {
        "initial": initial,
        "branch": branch,
        "fill": fill,
    }
    # Map-reduce: one report per answered trajectory, one aggregation.
    assert len(out["reports"]) == n
    roles = _roles(model)
    assert roles["compress"] == n and roles["aggregate"] == 1
    assert out["answer"] == "Paris" and out["answer_source"] == "aggregator"


async def test_branch_origins_point_at_the_most_uncertain_exploration_step():
    # A trajectory checkpointer of the user's own keeps the threads after the run, to read the fork point.
    config = {"n": 4, "m": 1, "k": 1, "t": 2, "mode": "exploration"}
    graph, model, calls = _graph(config, trajectory_checkpointer=InMemorySaver())
    out = await graph.ainvoke({"question": QUESTION})
    parent = next(tr for tr in out["trajectories"] if tr["origin"]["kind"] == "initial")
    branches = [tr for tr in out["trajectories"] if tr["origin"]["kind"] == "branch"]

    assert parent["uncertainty"][1]["exploration"] == pytest.approx(math.exp(2.5))
    snap = await rollout_runner(graph).fork_point(parent["thread_id"], 1)
    assert len(branches) == 2
    for br in branches:
        origin = br["origin"]
        assert origin["parent"] == parent["id"]
        assert origin["parent_thread"] == parent["thread_id"]
        assert origin["step"] == 1
        assert origin["region"] == "exploration"
        assert origin["score"] == pytest.approx(math.exp(2.5))
        assert origin["checkpoint_id"] == snap.config["configurable"]["checkpoint_id"]
        assert br["steps"][:1] == parent["steps"][:1]
    assert sorted(br["id"] for br in branches) == ["t0.s1.b0", "t0.s1.b1"]
    # Branches did not re-run the prefix's search: initial + fill searched, branches only visited.
    assert len(calls["search"]) == 2
    assert len(calls["visit"]) == 4
    assert out["stats"]["rollout"]["tool_calls"] == 6
    assert out["stats"]["rollout"]["reused_prefix_tokens"] > 0


async def test_reasoning_mode_branches_from_the_most_uncertain_thought():
    graph, _, _ = _graph({"n": 3, "m": 1, "k": 1, "t": 2, "mode": "reasoning"})
    out = await graph.ainvoke({"question": QUESTION})
    origins = [tr["origin"] for tr in out["trajectories"] if tr["origin"]["kind"] == "branch"]
    assert [(o["step"], o["region"]) for o in origins] == [(2, "reasoning"), (2, "reasoning")]
    assert origins[0]["score"] == pytest.approx(math.exp(3.0))


async def test_k2_exploration_picks_both_tool_steps_most_uncertain_first():
    events = []
    graph, _, _ = _graph({"n": 8, "m": 1, "k": 2, "t": 3})
    async for event in graph.astream({"question": QUESTION}, stream_mode="custom"):
        events.append(event)
    picked = [(e["step"], e["region"]) for e in events if e["event"] == "branch_picked"]
    assert picked == [(1, "exploration"), (0, "exploration")]


async def test_fewer_pickable_steps_than_k_are_filled_from_scratch_and_reported():
    # The initial trajectory answers at once: it has no exploration region to branch from.
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 3}, agent=lambda i, msgs: Reply(answer_text("Paris")))
    out = await graph.ainvoke({"question": QUESTION})
    assert len(out["trajectories"]) == 4
    assert _kinds(out) == Counter({"initial": 1, "fill": 3})
    budget = out["stats"]["budget"]
    assert budget["branches_planned"] == 3 and budget["branches"] == 0
    assert budget["shortfall_filled"] == 3 and budget["fill"] == 3


async def test_a_trajectory_runs_to_max_turns_past_langchains_default_recursion_limit():
    # Inside the graph the rollout subgraph inherited LangChain's recursion limit of 25 (two
    # supersteps a step): max_turns >= 13 failed the whole run with GraphRecursionError.
    model = ScriptedChatModel(
        responder=research_responder(lambda i, m: Reply(call_text("search", f"s{i}", query=f"q{i}")))
    )
    graph = create_parallelmuse(
        model, make_tools()[0], config={"n": 1, "mode": "none", "max_turns": 14, "max_context_tokens": 10**6}
    )
    (traj,) = (await graph.ainvoke({"question": QUESTION}))["trajectories"]
    assert traj["status"] == "max_turns" and len(traj["steps"]) == 14


async def test_missing_logprobs_fail_fast_unless_mode_is_none():
    no_lp = lambda i, msgs: Reply(answer_text("Paris"), logprobs=False)  # noqa: E731
    graph, model, _ = _graph({"n": 3, "k": 1, "t": 2}, agent=no_lp)
    with pytest.raises(MissingLogprobsError, match="mode='none'"):
        await graph.ainvoke({"question": QUESTION})
    assert _roles(model) == Counter({"agent": 1})  # no branch, no report was attempted

    graph, _, _ = _graph({"n": 3, "mode": "none"}, agent=no_lp)
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] == "Paris" and len(out["trajectories"]) == 3


# ----------------------------------------------------------------------------- map-reduce


def _answers_in_call_order(*answers):
    """Agent whose successive answer steps give ``answers`` (then repeat the last)."""
    counter = itertools.count()
    lock = threading.Lock()

    def agent(index, messages):
        if index < 2:
            return STEPS[index]
        with lock:
            i = next(counter)
        return Reply(answer_text(answers[min(i, len(answers) - 1)]))

    return agent


async def test_n_trajectories_to_n_reports_to_one_answer():
    seen = {}

    def aggregate(messages):
        seen["prompt"] = messages[-1].content
        return "<answer>Lyon</answer>"  # the minority: the aggregator's pick, not a vote

    graph, model, _ = _graph(
        {"n": 3, "mode": "none"},
        agent=_answers_in_call_order("Paris", "Lyon", "Paris"),
        aggregate=aggregate,
    )
    out = await graph.ainvoke({"question": QUESTION})

    assert sorted(tr["answer"] for tr in out["trajectories"]) == ["Lyon", "Paris", "Paris"]
    assert len(out["reports"]) == 3
    assert {r["trajectory_id"] for r in out["reports"]} == {tr["id"] for tr in out["trajectories"]}
    by_id = {tr["id"]: tr["answer"] for tr in out["trajectories"]}
    assert all(r["answer"] == by_id[r["trajectory_id"]] and r["status"] == "ok" for r in out["reports"])
    # The aggregator saw the question and the three reports, not the trajectories.
    prompt = seen["prompt"]
    assert QUESTION in prompt
    assert "Report 1:" in prompt and "Report 3:" in prompt and "Report 4:" not in prompt
    assert "Snippets for" not in prompt  # no raw tool output
    assert _roles(model)["aggregate"] == 1
    assert out["answer"] == "Lyon" and out["answer_source"] == "aggregator"
    assert out["stats"]["compress"]["reports"] == 3


async def test_failed_aggregation_falls_back_to_the_majority():
    def aggregate(messages):
        raise RuntimeError("aggregator down")

    graph, _, _ = _graph(
        {"n": 3, "mode": "none"},
        agent=_answers_in_call_order("Lyon", "Paris", "Paris"),
        aggregate=aggregate,
    )
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] == "Paris"
    assert out["answer_source"] == "majority_fallback"
    assert out["stats"]["aggregate"]["error"] == "the aggregator's model call failed: RuntimeError: aggregator down"


@pytest.mark.parametrize("stage", ["compress", "aggregate"])
async def test_a_wrong_setting_met_by_a_report_or_the_aggregator_ends_the_run(stage):
    """As in the rollout: an error every call would meet (a server without prompt_logprobs told to
    score) is the user's to fix, not a fallback that hides it."""

    def wrong(messages):
        raise ConfigError("http://127.0.0.1:8000/v1 returned no prompt_logprobs: pass supports_scoring=False")

    responder = research_responder(_answers_in_call_order("Paris", "Paris"), **{stage: wrong})
    graph = create_parallelmuse(
        ScriptedChatModel(responder=responder), make_tools()[0], config={"n": 2, "mode": "none"}
    )
    with pytest.raises(ConfigError, match="supports_scoring=False") as info:
        await graph.ainvoke({"question": QUESTION})
    # Without a checkpointer the aggregator's error is all the caller gets: it carries the finished work.
    # (A report's node holds one trajectory: its error carries none; the checkpoint or the stream keeps it.)
    result = info.value.result
    if stage == "aggregate":
        assert result["question"] == QUESTION
        assert [t["answer"] for t in result["trajectories"]] == ["Paris", "Paris"]
        assert len(result["reports"]) == 2
    else:
        assert result is None


async def test_a_report_error_under_a_checkpointer_leaves_the_work_in_the_checkpoint():
    def wrong(messages):
        raise ConfigError("returned no prompt_logprobs: pass supports_scoring=False")

    responder = research_responder(_answers_in_call_order("Paris", "Paris"), compress=wrong)
    graph = create_parallelmuse(
        ScriptedChatModel(responder=responder),
        make_tools()[0],
        config={"n": 2, "mode": "none"},
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "reports"}}
    with pytest.raises(ConfigError) as info:
        await graph.ainvoke({"question": QUESTION}, config)
    # The error holds one report's job; the thread holds the work, which a resume continues.
    assert info.value.result is None
    state = await graph.aget_state(config)
    assert [t.name for t in state.tasks] == ["compress", "compress"]
    assert len(state.values["trajectories"]) == 2


async def test_one_stored_error_raised_for_two_questions_carries_each_runs_own_work():
    """A model wrapper that re-raises one stored instance: the second question's error carried the
    first question's trajectories. The first caller's instance keeps its own (why it is not overwritten)."""
    stored = ConfigError("returned no prompt_logprobs: pass supports_scoring=False")

    def agent(index, messages):
        return answer_text("Paris" if "France" in messages[1].content else "Rome")

    def aggregate(messages):
        raise stored

    graph = create_parallelmuse(
        ScriptedChatModel(responder=research_responder(agent, aggregate=aggregate)),
        make_tools()[0],
        config={"n": 2, "mode": "none"},
    )
    raised = []
    for question in ("What is the capital of France?", "What is the capital of Italy?"):
        with pytest.raises(ConfigError) as info:
            await graph.ainvoke({"question": question})
        raised.append(info.value)
    first, second = raised
    assert first is stored and first.result["question"] == "What is the capital of France?"
    assert second.result["question"] == "What is the capital of Italy?"
    assert [t["answer"] for t in second.result["trajectories"]] == ["Rome", "Rome"]
    assert type(second) is ConfigError and str(second) == str(stored) and second.__cause__ is stored


async def test_a_down_compressor_and_aggregator_leave_their_reasons_in_the_result_and_the_events():
    """Before, the reports fell back and the majority stood in with the reason only in a log line."""

    def down(messages):
        raise ConnectionRefusedError("127.0.0.1:8000 refused the connection")

    responder = research_responder(_answers_in_call_order("Paris", "Paris", "Lyon"), compress=down, aggregate=down)
    graph = create_parallelmuse(
        ScriptedChatModel(responder=responder), make_tools()[0], config={"n": 3, "mode": "none"}
    )
    events, out = [], None
    async for mode, chunk in graph.astream({"question": QUESTION}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(chunk)
        else:
            out = chunk
    reason = "the model call failed: ConnectionRefusedError: 127.0.0.1:8000 refused the connection"
    assert [r["status"] for r in out["reports"]] == ["fallback"] * 3
    assert {r["problem"] for r in out["reports"]} == {reason}
    assert out["stats"]["compress"]["fallback_problems"] == [reason]
    assert out["answer"] == "Paris" and out["answer_source"] == "majority_fallback"
    assert "ConnectionRefusedError" in out["stats"]["aggregate"]["error"]
    assert {e["problem"] for e in events if e["event"] == "report_written"} == {reason}
    assert "ConnectionRefusedError" in next(e for e in events if e["event"] == "answer")["error"]


async def test_separate_aggregator_model_gets_only_the_aggregation():
    graph_model = ScriptedChatModel(responder=research_responder(by_step()))
    aggregator = ScriptedChatModel(script=["<answer>Paris</answer>"])
    tools, _ = make_tools()
    graph = create_parallelmuse(graph_model, tools, aggregator_model=aggregator, config={"n": 2, "mode": "none"})
    out = await graph.ainvoke({"question": QUESTION})
    assert len(aggregator.calls) == 1 and role_of(aggregator.calls[0]["messages"]) == "aggregate"
    assert _roles(graph_model)["aggregate"] == 0 and _roles(graph_model)["compress"] == 2
    assert out["answer"] == "Paris"


@pytest.mark.parametrize("aggregation", ["majority", "weighted", "max_tool_calls"])
async def test_baseline_aggregations_skip_compression(aggregation):
    graph, model, _ = _graph(
        {"n": 3, "mode": "none", "aggregation": aggregation},
        agent=_answers_in_call_order("Paris", "Paris", "Lyon"),
    )
    out = await graph.ainvoke({"question": QUESTION})
    assert _roles(model) == Counter({"agent": 9})
    assert out["reports"] == []
    assert out["answer"] == "Paris" and out["answer_source"] == aggregation


async def test_no_answer_anywhere_gives_answer_none():
    # Every trajectory ran out of turns without answering (a model that fails outright raises instead).
    never = lambda i, msgs: Reply(call_text("search", "Keep looking", query=f"q{i}"))  # noqa: E731
    graph, _, _ = _graph({"n": 2, "mode": "none", "max_turns": 2}, agent=never)
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] is None and out["answer_source"] == "none"
    assert [tr["status"] for tr in out["trajectories"]] == ["max_turns", "max_turns"]
    assert out["stats"]["rollout"]["failed"] == 0
    assert out["messages"][-1].content.startswith("No answer")


# ----------------------------------------------------------------------------- input / output


async def test_messages_input_appends_an_ai_message_with_the_answer():
    graph, model, _ = _graph({"n": 2, "mode": "none"})
    out = await graph.ainvoke({"messages": [HumanMessage("Hi"), AIMessage("Hello!"), HumanMessage(QUESTION)]})
    assert out["question"] == QUESTION
    assert [type(m) for m in out["messages"]] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    reply = out["messages"][-1]
    assert reply.content == "Paris" == out["answer"]
    assert reply.name == "parallelmuse"
    assert reply.response_metadata["answer_source"] == "aggregator"
    agent_prompts = [c["messages"] for c in model.calls if role_of(c["messages"]) == "agent"]
    assert all(p[1].content == QUESTION for p in agent_prompts)


async def test_the_answer_message_is_named_after_the_graph():
    """Always 'parallelmuse' before: two ParallelMuse nodes of one chat could not be told apart."""
    graph, _, _ = _graph({"n": 2, "mode": "none"}, name="small_model")
    out = await graph.ainvoke({"messages": [HumanMessage(QUESTION)]})
    assert out["messages"][-1].name == "small_model" and out["answer"] == "Paris"
    # Sent on as a message name, it must be one an API takes (OpenAI: letters, digits, "_" and "-").
    graph, _, _ = _graph({"n": 2, "mode": "none"}, name="Research agent (small)")
    out = await graph.ainvoke({"messages": [HumanMessage(QUESTION)]})
    assert out["messages"][-1].name == "Research_agent_small_"


@pytest.mark.parametrize(
    "payload",
    [
        {"question": ""},
        {"question": "   \n "},
        {"messages": []},
        {"messages": [AIMessage("I am not a question")]},
        {"messages": [HumanMessage("  ")]},
        {"question": "x" * 5000},
        {"question": "\u200b\u200b"},  # zero-width spaces, which str.strip keeps
        {"messages": [HumanMessage("\u2060\ufeff")]},
    ],
)
async def test_unusable_input_raises_input_error_before_any_model_call(payload):
    graph, model, calls = _graph({"n": 2, "mode": "none"})
    with pytest.raises(InputError):
        await graph.ainvoke(payload)
    assert model.calls == []
    assert calls == {"search": [], "visit": []}


async def test_a_blank_question_beside_messages_is_the_last_human_message():
    """A parent state with ``question: str = ""`` passes the blank default with its messages: it failed
    every run ("the question is empty")."""
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    out = await graph.ainvoke({"question": "", "messages": [HumanMessage(QUESTION)]})
    assert out["question"] == QUESTION and out["answer"] == "Paris"


@pytest.mark.parametrize("question", [" ", "\u200b\u200b"])
def test_unusable_input_also_raises_under_sync_invoke(question):
    graph, model, _ = _graph({"n": 2, "mode": "none"})
    with pytest.raises(InputError, match="the question is empty"):
        graph.invoke({"question": question})
    assert model.calls == []


def test_tools_without_search_and_bad_config_are_rejected_at_build_time():
    model = ScriptedChatModel()
    _, visit = make_tools()[0]
    with pytest.raises(InputError, match="search"):
        create_parallelmuse(model, [visit])
    with pytest.raises(ConfigError, match="n=2"):
        create_parallelmuse(model, make_tools()[0], config={"n": 2})
    assert model.calls == []


# ----------------------------------------------------------------------------- streaming


async def test_custom_stream_yields_progress_events_in_order():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    events = [e async for e in graph.astream({"question": QUESTION}, stream_mode="custom")]
    names = [e["event"] for e in events]

    counts = Counter(names)
    assert counts["run_started"] == 1
    assert counts["trajectory_started"] == counts["trajectory_finished"] == 4
    assert counts["branch_picked"] == 1
    assert counts["report_written"] == 4
    assert counts["answer"] == 1
    assert names[0] == "run_started" and names[-1] == "answer"
    assert events[-1]["answer"] == "Paris"
    pick = names.index("branch_picked")
    # The initial trajectory and the fill-in (which runs beside it) finish before the pick; the
    # two branches start after it.
    assert names[:pick].count("trajectory_finished") == 2
    assert names[pick + 1 :].count("trajectory_started") == 2
    assert names.index("report_written") > max(i for i, n in enumerate(names) if n == "trajectory_finished")
    picked = events[pick]
    assert (picked["parent"], picked["step"], picked["region"]) == ("t0", 1, "exploration")
    finished = [e for e in events if e["event"] == "trajectory_finished"]
    assert {e["id"] for e in finished} == {"t0", "t0.s1.b0", "t0.s1.b1", "f0"}
    assert all(e["status"] == "answered" and e["answer"] == "Paris" for e in finished)


def test_sync_custom_stream():
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    names = [e["event"] for e in graph.stream({"question": QUESTION}, stream_mode="custom")]
    assert names[0] == "run_started" and names[-1] == "answer"
    assert names.count("trajectory_finished") == 2 and "branch_picked" not in names


# ----------------------------------------------------------------------------- sync / async / batch


def test_sync_invoke():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    out = graph.invoke({"question": QUESTION})
    assert out["answer"] == "Paris"
    assert _kinds(out) == Counter({"initial": 1, "branch": 2, "fill": 1})


def test_sync_batch():
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    outs = graph.batch([{"question": QUESTION}, {"question": "Where is the Louvre?"}])
    assert [o["question"] for o in outs] == [QUESTION, "Where is the Louvre?"]
    assert all(o["answer"] == "Paris" and len(o["trajectories"]) == 2 for o in outs)
    # Each run has its own trajectory threads.
    threads = [tr["thread_id"] for o in outs for tr in o["trajectories"]]
    assert len(set(threads)) == 4


async def test_async_batch():
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    outs = await graph.abatch([{"question": QUESTION}, {"question": "Where is the Louvre?"}])
    assert [o["answer"] for o in outs] == ["Paris", "Paris"]


async def test_per_run_context_overrides_the_budget():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    out = await graph.ainvoke({"question": QUESTION}, context={"n": 2, "mode": "none"})
    assert len(out["trajectories"]) == 2 and _kinds(out) == Counter({"initial": 1, "fill": 1})


async def test_per_run_context_keeps_the_base_config_fields_it_does_not_override():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2, "max_turns": 2, "temperature": 0.1})
    out = await graph.ainvoke({"question": QUESTION}, context={"n": 2, "mode": "none"})
    assert out["stats"]["config"]["max_turns"] == 2
    assert out["stats"]["config"]["temperature"] == 0.1


async def test_settings_passed_in_configurable_are_named_in_a_warning_not_silently_ignored():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    cfg = {"configurable": {"n": 2, "mode": "none", "user_id": "u1"}}
    with pytest.warns(UserWarning, match=r"sets n=2, mode='none'.*context=\{'n': 2, 'mode': 'none'\}"):
        out = await graph.ainvoke({"question": QUESTION}, cfg)
    assert out["stats"]["config"]["n"] == 4  # not read from configurable, as the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same keys given as context as well: nothing to warn about
        await graph.ainvoke({"question": QUESTION}, cfg, context={"n": 2, "mode": "none"})


async def test_invalid_per_run_context_raises_config_error():
    graph, model, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    with pytest.raises(ConfigError):
        await graph.ainvoke({"question": QUESTION}, context={"n": 2, "m": 3})
    assert model.calls == []


async def test_max_concurrency_bounds_model_calls_in_flight():
    slow = lambda i, msgs: Reply(answer_text("Paris"), delay=0.05)  # noqa: E731
    graph, model, _ = _graph({"n": 4, "mode": "none", "max_concurrency": 1}, agent=slow)
    await graph.ainvoke({"question": QUESTION})
    assert model.peak_in_flight == 1


async def test_a_runs_context_lowers_max_concurrency_within_the_factorys_bound_and_cannot_lift_it():
    # Each value had a bound of its own: a run lowering it to 1 beside one at the factory's 2 had 3
    # calls in flight, and a context of 64 lifted the operator's bound.
    slow = lambda i, msgs: Reply(answer_text("Paris"), delay=0.05)  # noqa: E731
    graph, model, _ = _graph({"n": 4, "mode": "none", "max_concurrency": 2}, agent=slow)
    await asyncio.gather(
        graph.ainvoke({"question": QUESTION}), graph.ainvoke({"question": QUESTION}, context={"max_concurrency": 1})
    )
    assert model.peak_in_flight == 2
    graph, model, _ = _graph({"n": 4, "mode": "none", "max_concurrency": 2}, agent=slow)
    await graph.ainvoke({"question": QUESTION}, context={"max_concurrency": 64})
    assert model.peak_in_flight == 2
    graph, model, _ = _graph({"n": 4, "mode": "none", "max_concurrency": 8}, agent=slow)
    await graph.ainvoke({"question": QUESTION}, context={"max_concurrency": 1})
    assert model.peak_in_flight == 1


# ----------------------------------------------------------------------------- composition


class Outer(TypedDict, total=False):
    question: str
    answer: str | None
    shouted: str


def _outer(graph, checkpointer=None):
    outer = StateGraph(Outer)
    outer.add_node("parallelmuse", graph)
    outer.add_node("shout", lambda s: {"shouted": (s["answer"] or "").upper()})
    outer.add_edge(START, "parallelmuse")
    outer.add_edge("parallelmuse", "shout")
    outer.add_edge("shout", END)
    return outer.compile(checkpointer=checkpointer)


async def test_compiled_graph_as_a_node_of_another_state_graph():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    out = await _outer(graph).ainvoke({"question": QUESTION})
    assert out == {"question": QUESTION, "answer": "Paris", "shouted": "PARIS"}


def test_compiled_graph_as_a_node_of_a_checkpointed_graph_sync():
    graph, model, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    saver = InMemorySaver()
    app = _outer(graph, saver)
    cfg: dict[str, Any] = {"configurable": {"thread_id": "conversation-1"}}
    out = app.invoke({"question": QUESTION}, cfg)
    assert out["shouted"] == "PARIS"
    # Trajectory threads are named after the parent thread (resumable) and live in the app's saver.
    assert any(tid.startswith("conversation-1:") for tid in saver.storage)
    assert not rollout_runner(graph).checkpointer.storage
    calls_after_first = len(model.calls)
    # Same thread, same question: the finished trajectories are found, not rolled out again.
    again = app.invoke({"question": QUESTION}, cfg)
    assert again["answer"] == "Paris"
    agent_calls = [c for c in model.calls[calls_after_first:] if role_of(c["messages"]) == "agent"]
    assert agent_calls == []


async def test_the_same_question_asked_with_other_settings_samples_anew():
    # Before the fix the run id named only the question: the second run reused the trajectories the
    # first settings made while its stats reported the new ones.
    model = ScriptedChatModel(responder=research_responder(lambda index, messages: answer_text("Paris")))
    saver = InMemorySaver()
    tools, _ = make_tools()
    config = {"n": 2, "mode": "none", "aggregation": "majority"}
    graph = create_parallelmuse(model, tools, config=config, checkpointer=saver, trajectory_checkpointer=saver)
    cfg: dict[str, Any] = {"configurable": {"thread_id": "chat-2"}}
    await graph.ainvoke({"question": QUESTION}, cfg)
    first = len(model.calls)
    await graph.ainvoke({"question": QUESTION}, cfg)
    assert len(model.calls) == first  # same settings: nothing sampled again
    out = await graph.ainvoke({"question": QUESTION}, cfg, context={"temperature": 1.2})
    resampled = [c for c in model.calls[first:] if role_of(c["messages"]) == "agent"]
    assert len(resampled) == 2 and all(c["kwargs"].get("temperature") == 1.2 for c in resampled)
    assert out["stats"]["config"]["temperature"] == 1.2


async def test_another_graph_sharing_the_trajectory_checkpointer_samples_its_own_trajectories():
    # A small and a strong model side by side on one thread and one trajectory database: the run id
    # named only the question and the settings, so the second graph returned the first's answers.
    saver, tools = InMemorySaver(), make_tools()[0]
    small = ScriptedChatModel(name="small", responder=research_responder(lambda i, m: answer_text("Lyon")))
    strong = ScriptedChatModel(name="strong", responder=research_responder(lambda i, m: answer_text("Paris")))
    config = {"n": 2, "mode": "none", "aggregation": "majority"}
    cfg: dict[str, Any] = {"configurable": {"thread_id": "compare-1"}}
    for model, answer in ((small, "Lyon"), (strong, "Paris")):
        graph = create_parallelmuse(model, tools, config=config, trajectory_checkpointer=saver)
        out = await graph.ainvoke({"question": QUESTION}, cfg)
        assert [t["answer"] for t in out["trajectories"]] == [answer, answer]
    assert sum(role_of(c["messages"]) == "agent" for c in strong.calls) == 2


async def test_two_parallelmuse_nodes_of_one_checkpointed_app_sample_their_own_trajectories():
    """Same model type and name, tools of the same names over other backends: before, the second
    node found the first one's finished trajectories on the thread and answered from its search."""

    def agent(index, messages):
        if index == 0:
            return Reply(call_text("search", "look", query="capital of France"))
        text = " ".join(str(m.content) for m in messages)
        return Reply(answer_text("WEB" if "web says" in text else "WIKI"))

    graphs, calls = {}, {}
    for name in ("wiki", "web"):
        tools, calls[name] = make_tools(search=lambda q, name=name: f"{name} says Paris")
        model = ScriptedChatModel(responder=research_responder(agent))
        graphs[name] = create_parallelmuse(model, tools, config={"n": 2, "mode": "none", "aggregation": "majority"})

    class App(MessagesState):
        wiki: str
        web: str

    app = StateGraph(App)
    for name, graph in graphs.items():

        async def node(state, graph=graph, name=name):
            return {name: (await graph.ainvoke({"messages": state["messages"]}))["answer"]}

        app.add_node(name, node)
    app.add_edge(START, "wiki")
    app.add_edge("wiki", "web")
    out = await app.compile(checkpointer=InMemorySaver()).ainvoke(
        {"messages": [HumanMessage(QUESTION)]}, {"configurable": {"thread_id": "app-1"}}
    )
    assert (out["wiki"], out["web"]) == ("WIKI", "WEB")
    assert len(calls["web"]["search"]) == len(calls["wiki"]["search"]) == 2


async def test_a_parents_retry_of_the_node_continues_the_same_run_not_a_new_one():
    """LangGraph counts a retried subgraph into its checkpoint namespace ("pm:<id>|1|prepare:<id>"):
    read as a node, the retry got a new run key and sampled every trajectory again."""
    from langgraph.types import RetryPolicy

    down = {"left": 2}

    def agent(index, messages):
        if index == 1 and down["left"] > 0:
            down["left"] -= 1
            raise RuntimeError("server down")
        return Reply(call_text("search", "look", query="capital of France")) if index == 0 else answer_text("Paris")

    saver, (tools, calls) = InMemorySaver(), make_tools()
    model = ScriptedChatModel(responder=research_responder(agent))
    graph = create_parallelmuse(model, tools, config={"n": 2, "mode": "none", "aggregation": "majority"})
    app = StateGraph(MessagesState)
    app.add_node("pm", graph, retry_policy=RetryPolicy(initial_interval=0.01, retry_on=ParallelMuseError))
    app.add_edge(START, "pm")
    out = await app.compile(checkpointer=saver).ainvoke(
        {"messages": [HumanMessage(QUESTION)]}, {"configurable": {"thread_id": "c"}}
    )
    assert out["messages"][-1].content == "Paris"
    assert len({t.rsplit("/", 1)[0] for t in saver.storage if "/" in t}) == 1  # one run id, as many threads as N
    assert len(calls["search"]) == 2  # each trajectory's first step was not run again


async def test_when_no_trajectory_answered_the_result_says_why():
    """Every trajectory out of context (a llama.cpp slot smaller than the prompt): the answer message
    said only that no trajectory produced one."""
    from langgraph_parallelmuse.errors import ContextOverflowError

    def agent(index, messages):
        return ContextOverflowError("the prompt has 9000 tokens but max_context_tokens is 8192")

    graph, _, _ = _graph({"n": 2, "mode": "none"}, agent=agent)
    out = await graph.ainvoke({"messages": [HumanMessage(QUESTION)]})
    assert [t["status"] for t in out["trajectories"]] == ["context_exhausted"] * 2
    assert out["answer"] is None and out["answer_source"] == "none"
    assert "no trajectory answered (2 context_exhausted): the context is exhausted at step 0" in (
        out["messages"][-1].content
    )


async def test_the_factory_pauses_before_a_node_and_the_paused_run_resumes():
    """Before, a pause needed a graph compiled by hand, on which rollout_runner() refused to work."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    cfg: dict[str, Any] = {"configurable": {"thread_id": "paused"}}
    paused = await graph.ainvoke({"question": QUESTION}, cfg)
    assert paused["answer"] is None and len(paused["reports"]) == 2
    assert (await graph.aget_state(cfg)).next == ("aggregate",)
    assert rollout_runner(graph) is not None  # the trajectories can be read while it waits
    assert (await graph.ainvoke(None, cfg))["answer"] == "Paris"
    assert _roles(model)["aggregate"] == 1


async def test_a_paused_run_whose_stored_settings_a_later_version_refuses_says_how_to_resume_it(monkeypatch):
    """Settings an earlier version took (402e770: seed=-1, n above today's cap) stored with a paused run:
    the resume failed with 'seed=-1: use a whole number ... or no seed', which no setting given now
    changes. The error says the stored settings are refused and how to correct them on the thread."""
    from langgraph_parallelmuse import config as config_module

    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver(), interrupt_before=["aggregate"])
    cfg: dict[str, Any] = {"configurable": {"thread_id": "refused-later"}}
    await graph.ainvoke({"question": QUESTION}, cfg)
    monkeypatch.setattr(config_module, "MAX_N", 1)  # the "later version": n=2 is refused now
    with pytest.raises(ConfigError, match=r"settings stored with this run are refused now .*n=2.*update_state"):
        await graph.ainvoke(None, cfg)
    state = await graph.aget_state(cfg)
    corrected = await graph.aupdate_state(cfg, {"settings": {**state.values["settings"], "n": 1}})
    assert (await graph.ainvoke(None, corrected))["answer"] == "Paris"  # the correction the message names works


@pytest.mark.parametrize("pause", [("aggregate",), "aggregate"])
async def test_the_factory_pauses_at_nodes_named_in_a_tuple_or_alone(pause):
    """A tuple (a Sequence, as the factory's types say) or one node's name failed the build with
    TypeError: can only concatenate tuple (not "list") to tuple."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver(), interrupt_before=pause)
    cfg: dict[str, Any] = {"configurable": {"thread_id": "paused-tuple"}}
    assert (await graph.ainvoke({"question": QUESTION}, cfg))["answer"] is None
    assert (await graph.aget_state(cfg)).next == ("aggregate",)
    assert (await graph.ainvoke(None, cfg))["answer"] == "Paris"


def test_the_factory_refuses_pauses_that_are_no_node_names():
    with pytest.raises(InputError, match="interrupt_after=5 is not a list of node names"):
        _graph({"n": 2, "mode": "none"}, interrupt_after=5)


def _research_app(graph, checkpointer=None):
    builder = StateGraph(MessagesState)
    builder.add_node("research", graph)
    builder.add_edge(START, "research")
    builder.add_edge("research", END)
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("nested", [False, True])
async def test_a_pause_with_no_checkpointer_to_resume_from_is_an_error_not_an_answer_of_none(nested):
    """Before, the run stopped at the pause and returned answer None, answer_source 'none' and no error:
    the trajectories and reports were made, then lost with nothing to resume from."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, interrupt_before=["aggregate"])
    app = _research_app(graph) if nested else graph  # nested: a parent app without a checkpointer
    with pytest.raises(ConfigError, match="no checkpointer to resume from"):
        await app.ainvoke({"messages": [HumanMessage(QUESTION)]})
    assert model.calls == []  # refused before any trajectory ran


def test_pauses_on_a_graph_compiled_without_checkpoints_are_refused_when_it_is_built():
    """Before, under a checkpointed parent every resume researched the question again and paused again."""
    with pytest.raises(InputError, match="checkpointer=False"):
        _graph({"n": 2, "mode": "none"}, interrupt_after=["collect"], checkpointer=False)
    _graph({"n": 2, "mode": "none"}, checkpointer=False)  # without pauses it is a graph as before


async def test_a_paused_graph_under_a_checkpointed_parent_resumes_to_its_answer():
    """A guard (it passes on the code before pauses were checked): the check refuses no saver a parent lends."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, interrupt_before=["aggregate"])
    app = _research_app(graph, InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "chat"}}
    await app.ainvoke({"messages": [HumanMessage(QUESTION)]}, cfg)
    assert (await app.aget_state(cfg)).next == ("research",)
    assert (await app.ainvoke(None, cfg))["messages"][-1].content == "Paris"
    assert _roles(model)["aggregate"] == 1


class _EngineModel(ScriptedChatModel):
    """A model with in-process engine counters (requests served), like LocalChatModel."""

    served: int = 0
    dies: bool = False

    def engine_stats(self) -> dict[str, int]:
        return {"requests": self.served, "decode_tokens": 5 * self.served}

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        if self.dies:
            raise ParallelMuseError("the process dies here")
        self.served += 1
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


async def test_engine_stats_of_a_run_resumed_in_another_process_count_that_process_only(monkeypatch):
    # The counters at the run's start were subtracted from a fresh process's: -4,995 requests.
    outer, saver, tools = InMemorySaver(), InMemorySaver(), make_tools()[0]
    responder = research_responder(lambda i, m: answer_text("Paris"))
    cfg: dict[str, Any] = {"configurable": {"thread_id": "job-51"}}
    config = {"n": 2, "mode": "none", "aggregation": "majority"}
    first = _EngineModel(responder=responder, served=5000, dies=True)
    graph = create_parallelmuse(first, tools, config=config, checkpointer=outer, trajectory_checkpointer=saver)
    with pytest.raises(ParallelMuseError):
        await graph.ainvoke({"question": QUESTION}, cfg)
    monkeypatch.setattr(nodes_module, "_PROCESS", "another process")
    second = _EngineModel(responder=responder)
    graph = create_parallelmuse(second, tools, config=config, checkpointer=outer, trajectory_checkpointer=saver)
    engine = (await graph.ainvoke(None, cfg))["stats"]["engine"]
    assert engine["requests"] == second.served > 0 and engine["partial"] == "the run resumed in another process"


def _chain(graph):
    return RunnableLambda(lambda q: {"question": q}) | graph | RunnableLambda(lambda s: s["answer"])


async def test_compiled_graph_inside_an_lcel_chain_async():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2})
    assert await _chain(graph).ainvoke(QUESTION) == "Paris"
    assert await _chain(graph).abatch([QUESTION, "Where is the Louvre?"]) == ["Paris", "Paris"]


async def test_an_lcel_chain_streams_with_the_graph_bound_to_stream_values():
    """The README's way to stream a chain: unbound, the next step gets the graph's updates."""
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    chain = RunnableLambda(lambda q: {"question": q}) | graph.bind(stream_mode="values")
    chain |= RunnableLambda(lambda s: s["answer"])
    assert [chunk async for chunk in chain.astream(QUESTION)] == ["Paris"]
    with pytest.raises(KeyError, match="answer"):
        [chunk async for chunk in _chain(graph).astream(QUESTION)]


def test_compiled_graph_inside_an_lcel_chain_sync():
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    assert _chain(graph).invoke(QUESTION) == "Paris"
    assert _chain(graph).batch([QUESTION, "Where is the Louvre?"]) == ["Paris", "Paris"]


def test_sync_invoke_works_when_the_caller_has_a_running_event_loop():
    graph, _, _ = _graph({"n": 2, "mode": "none"})

    async def notebook_cell():  # ipykernel runs cells with a running event loop
        return graph.invoke({"question": QUESTION})

    error = out = None
    try:
        out = asyncio.run(notebook_cell())
    except RuntimeError as exc:
        error = str(exc)
    with warnings.catch_warnings():  # the node coroutine asyncio.run refused is never awaited
        warnings.simplefilter("ignore", RuntimeWarning)
        gc.collect()
    assert error is None, error
    assert out["answer"] == "Paris"


def test_agent_step_helper_counts_earlier_turns():
    # Guards the fake's routing: step index = AI turns already in the prompt.
    assert agent_step([HumanMessage("q")]) == 0
    assert agent_step([HumanMessage("q"), AIMessage("a"), HumanMessage("r"), AIMessage("b")]) == 2


def test_sync_invoke_runs_every_model_call_on_one_long_lived_loop():
    """Clients cached per process (langchain-openai's httpx AsyncClient) bind to the loop they
    first ran on; a fresh loop per node would close their connections under later calls."""
    loops = set()

    class LoopRecordingModel(ScriptedChatModel):
        async def _agenerate(self, *args, **kwargs):
            loops.add(id(asyncio.get_running_loop()))
            return await super()._agenerate(*args, **kwargs)

    model = LoopRecordingModel(responder=research_responder(by_step()))
    tools, _ = make_tools()
    graph = create_parallelmuse(model, tools, config={"n": 4, "m": 1, "k": 1, "t": 2})
    assert graph.invoke({"question": QUESTION})["answer"] == "Paris"
    assert graph.invoke({"question": QUESTION})["answer"] == "Paris"
    assert len(loops) == 1


async def test_a_second_question_on_the_same_thread_starts_clean():
    """In a checkpointed chat thread the previous run's trajectories, reports and picks must not leak."""
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "chat"}}
    first = await graph.ainvoke({"question": QUESTION}, cfg)
    second = await graph.ainvoke({"question": "Where is the Louvre?"}, cfg)
    assert len(first["trajectories"]) == len(second["trajectories"]) == 4
    assert _kinds(second) == Counter({"initial": 1, "branch": 2, "fill": 1})
    assert {t["thread_id"].split("/")[0] for t in second["trajectories"]} != {
        t["thread_id"].split("/")[0] for t in first["trajectories"]
    }
    assert len(second["reports"]) == 4 and second["stats"]["rollout"]["trajectories"] == 4


async def check_delete_with_trajectories(saver) -> None:
    """Three runs on threads that look alike, then the library's delete of one (also run on PostgreSQL)."""
    from langgraph_parallelmuse.persistence import adelete_thread_with_trajectories

    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, checkpointer=saver)
    for thread in ("chat_1", "chat_10", "chat_1:notes"):  # "_" is a LIKE wildcard; ":" the run's separator
        await graph.ainvoke({"question": QUESTION}, {"configurable": {"thread_id": thread}})

    async def threads() -> set[str]:
        return {c.config["configurable"]["thread_id"] async for c in saver.alist(None)}

    made = {t for t in await threads() if t.startswith("chat_1:") and t.count("/") == 1}
    assert len(made) == 4 + 4  # "chat_1"'s trajectories and "chat_1:notes"'s
    deleted = await adelete_thread_with_trajectories(saver, "chat_1")
    mine = {t for t in made if not t.startswith("chat_1:notes:")}
    assert deleted[0] == "chat_1" and set(deleted[1:]) == mine and len(mine) == 4
    left = await threads()
    assert not left & set(deleted)
    assert {"chat_10", "chat_1:notes"} <= left and made - mine <= left
    assert await adelete_thread_with_trajectories(saver, "chat_1") == []  # nothing left of it
    await saver.adelete_thread("chat_10")  # Studio's delete: the trajectories stay, and are found later
    late = await adelete_thread_with_trajectories(saver, "chat_10")
    assert len(late) == 4 and all(t.startswith("chat_10:") for t in late)
    with pytest.raises(ConfigError, match="give the id of the thread"):
        await adelete_thread_with_trajectories(saver, "")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_deleting_a_thread_deletes_its_trajectory_threads_and_no_other(kind, tmp_path) -> None:
    """``adelete_thread`` (Studio's delete) leaves the trajectories' own threads; the library's delete
    finds them by the name a run gives them, and keeps threads that only look alike."""
    from langgraph_parallelmuse.persistence import open_checkpointer

    if kind == "memory":
        await check_delete_with_trajectories(InMemorySaver())
        return
    async with open_checkpointer(str(tmp_path / "runs.sqlite")) as saver:
        await check_delete_with_trajectories(saver)


def test_deleting_a_thread_of_a_sync_sqlite_saver_deletes_its_trajectory_threads(tmp_path) -> None:
    """A sync SqliteSaver holds the trajectory threads too since this session: the delete refused it."""
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    from langgraph_parallelmuse.persistence import adelete_thread_with_trajectories

    saver = SqliteSaver(sqlite3.connect(str(tmp_path / "app.db"), check_same_thread=False))
    graph, _, _ = _graph({"n": 2, "mode": "none"}, checkpointer=saver)
    for thread in ("chat", "chat2"):
        graph.invoke({"question": QUESTION}, {"configurable": {"thread_id": thread}})
    threads = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
    made = {t for t in threads if t.startswith("chat:")}
    assert len(made) == 2
    assert set(asyncio.run(adelete_thread_with_trajectories(saver, "chat"))) == made | {"chat"}
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == threads - made - {"chat"}


@pytest.mark.parametrize("edit", ["question", "settings"])
async def test_deleting_a_thread_deletes_the_threads_of_a_fork_whose_question_or_settings_were_edited(edit) -> None:
    saver = InMemorySaver()
    graph, _, _ = _graph({"n": 2, "mode": "none"}, checkpointer=saver)
    thread = {"configurable": {"thread_id": "chat"}}
    await graph.ainvoke({"question": QUESTION}, thread)
    (prepared,) = [s async for s in graph.aget_state_history(thread) if "initial_rollout" in s.next]
    edited = {"question": "Where is the Colosseum?", "settings": {**prepared.values["settings"], "temperature": 0.1}}
    fork = await graph.aupdate_state(prepared.config, {edit: edited[edit]}, as_node="prepare")
    await graph.ainvoke(None, fork)
    made = {t for t in saver.storage if t.startswith("chat:")}
    assert len(made) == 4 and any("~" in t for t in made)  # the fork's threads are named apart
    from langgraph_parallelmuse.persistence import adelete_thread_with_trajectories

    deleted = await adelete_thread_with_trajectories(saver, "chat")
    assert set(deleted) == made | {"chat"} and not set(saver.storage)


async def _fork_after_prepare(graph, thread: dict[str, Any], **edits: Any):
    """The first run on ``thread``, and a fork from its checkpoint after prepare with ``edits`` to its settings."""
    first = await graph.ainvoke({"question": QUESTION}, thread)
    (prepared,) = [s async for s in graph.aget_state_history(thread) if s.next and s.next[0] == "initial_rollout"]
    settings = {**prepared.values["settings"], **edits}
    return first, await graph.aupdate_state(prepared.config, {"settings": settings}, as_node="prepare")


def _agent_calls(model, since: int) -> list[dict[str, Any]]:
    return [c for c in model.calls[since:] if role_of(c["messages"]) == "agent"]


@pytest.mark.parametrize("edits", [{"temperature": 0.1}, {"seed": 7}, {"n": 3}, {"max_turns": 4}])
async def test_a_fork_whose_settings_were_edited_after_prepare_samples_anew_with_them(edits):
    """Before the fix the fork ran its jobs in the threads prepare had named for the old settings,
    found them finished and answered from them: no model call, trajectories of the old settings."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "edited-settings"}}
    first, fork = await _fork_after_prepare(graph, thread, **edits)
    calls = len(model.calls)
    forked = await graph.ainvoke(None, fork)
    agent = _agent_calls(model, calls)
    assert len(forked["trajectories"]) == edits.get("n", 2) and forked["answer"] == "Paris"
    assert len(agent) == sum(len(t["steps"]) for t in forked["trajectories"])  # every step sampled anew
    assert all(c["kwargs"]["temperature"] == edits.get("temperature", 0.6) for c in agent)
    assert forked["stats"]["config"] == {**first["stats"]["config"], **edits}  # what the fork ran with
    if "seed" in edits:
        assert all(c["kwargs"].get("seed") is not None for c in agent)
    old, new = ({t["thread_id"] for t in out["trajectories"]} for out in (first, forked))
    assert not old & new
    again = len(model.calls)
    replayed = await graph.ainvoke(None, fork)  # the fork's own threads, found again: no model call
    assert replayed["answer"] == "Paris" and not _agent_calls(model, again)
    assert {t["thread_id"] for t in replayed["trajectories"]} == new


async def test_a_fork_of_a_run_prepared_before_asked_kept_its_settings_samples_anew_with_the_edited_ones():
    """A run of 402e770 (``asked`` without ``settings``), forked after an upgrade with its temperature
    edited: before the fix the fork answered from the old temperature's threads, no model call, while its
    stats said temperature=0.1. ``prepare``'s ``stats['config']`` holds what such a run was prepared with."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "prepared-before-settings"}}
    first = await graph.ainvoke({"question": QUESTION}, thread)
    (prepared,) = [s async for s in graph.aget_state_history(thread) if s.next and s.next[0] == "initial_rollout"]
    old_format = {"question": QUESTION, "message_id": None}  # no "settings": as 402e770's prepare wrote it
    edited = {**prepared.values["settings"], "temperature": 0.1}
    fork = await graph.aupdate_state(prepared.config, {"asked": old_format, "settings": edited}, as_node="prepare")
    calls = len(model.calls)
    forked = await graph.ainvoke(None, fork)
    agent = _agent_calls(model, calls)
    assert len(agent) == sum(len(t["steps"]) for t in forked["trajectories"])  # every step sampled anew
    assert all(c["kwargs"]["temperature"] == 0.1 for c in agent)
    assert not {t["thread_id"] for t in first["trajectories"]} & {t["thread_id"] for t in forked["trajectories"]}
    # collect rewrites stats['config']: the prepared settings are kept in ``asked`` for the nodes after it.
    asked = (await graph.aget_state(thread)).values["asked"]
    assert asked["settings"]["temperature"] == 0.6 and forked["stats"]["config"]["temperature"] == 0.1


@pytest.mark.parametrize(
    ("edits", "stage2"),
    [
        ({"max_concurrency": 1, "max_report_tokens": 64}, {"compress": 2, "aggregate": 1}),
        ({"aggregation": "majority", "max_aggregate_tokens": 100}, {}),
    ],
)
async def test_a_fork_editing_only_settings_no_trajectory_depends_on_keeps_the_finished_trajectories(edits, stage2):
    """A guard (it passes on the code before settings counted): how many run at once and what Stage 2
    does (the aggregation, the reports' form and bounds) change no trajectory: the fork reads the
    finished ones and only Stage 2 runs again, with the new settings."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "stage2-settings"}}
    first, fork = await _fork_after_prepare(graph, thread, **edits)
    calls = len(model.calls)
    forked = await graph.ainvoke(None, fork)
    assert Counter(role_of(c["messages"]) for c in model.calls[calls:]) == stage2
    assert [t["thread_id"] for t in forked["trajectories"]] == [t["thread_id"] for t in first["trajectories"]]
    assert forked["answer"] == "Paris"


async def test_a_fork_after_collect_editing_the_aggregation_records_the_settings_it_ran_with():
    """Only collect wrote stats['config']: a fork from after it aggregated by majority while its
    stats said aggregation='parallelmuse'."""
    graph, model, _ = _graph({"n": 2, "mode": "none"}, checkpointer=InMemorySaver())
    thread: dict[str, Any] = {"configurable": {"thread_id": "fork-after-collect"}}
    await graph.ainvoke({"question": QUESTION}, thread)
    (collected,) = [s async for s in graph.aget_state_history(thread) if s.next and s.next[0] == "compress"]
    settings = {**collected.values["settings"], "aggregation": "majority"}
    fork = await graph.aupdate_state(collected.config, {"settings": settings}, as_node="collect")
    calls = len(model.calls)
    forked = await graph.ainvoke(None, fork)
    assert forked["answer_source"] == "majority" and len(model.calls) == calls  # no report, no aggregator
    assert forked["stats"]["config"]["aggregation"] == "majority"


async def test_a_run_resumed_after_a_stop_runs_none_of_its_finished_trajectories_again():
    """A guard (it passes on the code before settings counted): the settings prepare records are
    compared with the run's own on resume; unedited, the resume finds the first wave in the threads
    prepare named and runs only the branches."""
    saver = InMemorySaver()
    graph, model, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, checkpointer=saver, interrupt_before=["branch_rollout"])
    cfg: dict[str, Any] = {"configurable": {"thread_id": "stopped"}}
    await graph.ainvoke({"question": QUESTION}, cfg)  # stops before the branches, as a crash would
    kept = {t: len(saver.storage[t][""]) for t in saver.storage if t != "stopped"}
    calls = len(model.calls)
    out = await graph.ainvoke(None, cfg)
    assert out["answer"] == "Paris" and _kinds(out) == {"initial": 1, "branch": 2, "fill": 1}
    assert {t: len(saver.storage[t][""]) for t in kept} == kept  # the first wave did not run again
    branches = [t for t in out["trajectories"] if t["origin"]["kind"] == "branch"]
    own_steps = sum(len(t["steps"]) - t["origin"]["step"] for t in branches)
    assert len(_agent_calls(model, calls)) == own_steps


async def test_a_branch_send_carries_a_reference_to_the_parent_checkpoint_not_the_trajectory():
    from langgraph_parallelmuse.agent import RolloutRunner
    from langgraph_parallelmuse.config import make_config
    from langgraph_parallelmuse.nodes import ParallelMuseNodes

    model = ScriptedChatModel(responder=research_responder(by_step()))
    runner = RolloutRunner(model, make_tools()[0])
    config = make_config(n=3, k=1, t=2)
    nodes = ParallelMuseNodes(runner, aggregator=model, config=config)
    state = {"question": QUESTION, "run_id": "r", "round": 0, "settings": config.model_dump()}
    (initial,) = [s.arg["job"] for s in nodes.launch_initial(state)]
    parent = await runner.run_job(initial, question=QUESTION)
    state.update(trajectories=[parent], picks=[])
    state.update(await nodes.select_branches(state))
    sends = nodes.launch_branches(state)

    assert [s.node for s in sends] == ["branch_rollout", "branch_rollout"]
    snap = await runner.fork_point(parent["thread_id"], 1)
    for sibling, send in enumerate(sends):
        assert set(send.arg) == {"question", "settings", "job"}  # no trajectory, no logprobs in the payload
        job = send.arg["job"]
        assert job["thread_id"] == f"r/t0.s1.b{sibling}"
        assert job["origin"]["parent_thread"] == parent["thread_id"] == "r/t0"
        assert job["origin"]["checkpoint_id"] == snap.config["configurable"]["checkpoint_id"]
        assert job["origin"]["step"] == 1
    calls_before = len(model.calls)
    branch = await runner.run_job(sends[0].arg["job"])
    # The fork started from exactly that checkpoint: its first prompt is the parent's at step 1.
    parent_prompt = next(c for c in model.calls if agent_step(c["messages"]) == 1)["messages"]
    assert model.calls[calls_before]["messages"] == parent_prompt
    assert branch["steps"][:1] == parent["steps"][:1]


class _KeyRecordingModel(ScriptedChatModel):
    """Records the routing key of every call, as ServerChatModel would send it in the router's header."""

    keys: list = []

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        from langgraph_parallelmuse.models.routing import routing_key

        self.keys.append(routing_key(messages))
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


async def test_every_call_of_one_question_carries_one_routing_key():
    """Trajectories, branches, reports and the aggregation: one key, so a router keeps them on one replica."""
    model = _KeyRecordingModel(responder=research_responder(by_step()), keys=[])
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 4, "m": 1, "k": 1, "t": 2})
    out = await graph.ainvoke({"question": QUESTION})
    assert _roles(model)["compress"] == len(out["reports"]) and _roles(model)["aggregate"] == 1
    assert len(model.keys) == len(model.calls) and set(model.keys) == {QUESTION}


def test_the_graphs_input_and_output_json_schemas_build():
    # Studio's input and output forms: on Python < 3.12 pydantic refused typing.TypedDict, so both
    # were None and `as_tool()` failed.
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    assert "question" in graph.get_input_jsonschema()["properties"]
    assert "answer" in graph.get_output_jsonschema()["properties"]


async def test_a_chat_threads_next_human_message_is_the_next_question():
    # Before the fix the previous run's question stayed in the state and won over the new message:
    # turn 2 answered turn 1's question again (Studio's chat mode, any checkpointed chat app).
    model = ScriptedChatModel(responder=research_responder(lambda index, messages: answer_text("Paris")))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 2, "mode": "none"}, checkpointer=InMemorySaver())
    cfg: dict[str, Any] = {"configurable": {"thread_id": "chat-3"}}
    first = await graph.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, cfg)
    second = await graph.ainvoke({"messages": [HumanMessage("Where is the Louvre?")]}, cfg)
    assert (first["question"], second["question"]) == ("Where is the Eiffel Tower?", "Where is the Louvre?")
    third = await graph.ainvoke({"question": "Where is the Colosseum?"}, cfg)  # a question key still wins
    assert third["question"] == "Where is the Colosseum?"
    again = await graph.ainvoke({"question": "Where is the Colosseum?"}, cfg)  # the same again: no old message
    assert again["question"] == "Where is the Colosseum?"


@dataclass
class _AppContext:
    user_id: str
    temperature: float = 0.2


async def test_as_a_node_of_a_graph_with_its_own_context_it_reads_only_its_fields():
    # Before the fix the parent's context (here a dataclass with a field of ours) was an error.
    model = ScriptedChatModel(responder=research_responder(lambda index, messages: answer_text("Paris")))
    graph = create_parallelmuse(model, make_tools()[0], config={"n": 2, "mode": "none"})
    parent = StateGraph(MessagesState, context_schema=_AppContext)
    parent.add_node("research", graph)
    parent.add_edge(START, "research")
    app = parent.compile()
    out = await app.ainvoke({"messages": [HumanMessage("Where is the Eiffel Tower?")]}, context=_AppContext("u1"))
    assert out["messages"][-1].content == "Paris"
    agent = [c for c in model.calls if role_of(c["messages"]) == "agent"]
    assert agent and all(c["kwargs"].get("temperature") == 0.2 for c in agent)


async def test_a_restarted_process_resumes_the_branches_from_the_trajectories_kept_in_the_graphs_checkpointer():
    """A server keeps a run's checkpoints in its database; a graph given no trajectory checkpointer
    keeps the trajectories there too, so a new process (a fresh graph, an empty memory) resumes a run
    stopped before its branches: they fork from the parent's checkpoints, which are still there,
    and the finished first wave (the initial trajectory and the fill) is not run again."""
    from langgraph_parallelmuse.graph import build_parallelmuse_graph

    saver = InMemorySaver()  # stands in for the server's database: it outlives the process
    config = {"n": 4, "m": 1, "k": 1, "t": 2}
    cfg: dict[str, Any] = {"configurable": {"thread_id": "server-thread"}}

    def process(interrupt: bool):
        model = ScriptedChatModel(responder=research_responder(by_step()))
        graph = build_parallelmuse_graph(model, make_tools()[0], config=config)
        return graph.compile(checkpointer=saver, interrupt_before=["branch_rollout"] if interrupt else None), model

    first, _ = process(interrupt=True)
    await first.ainvoke({"question": QUESTION}, cfg)  # stops before the branches, as a crash would
    assert (await first.aget_state(cfg)).next == ("branch_rollout", "branch_rollout")
    kept = {t: len(saver.storage[t][""]) for t in saver.storage if t != "server-thread"}
    assert sorted(t.rsplit("/", 1)[1] for t in kept) == ["f0", "t0"]  # the first wave, in the graph's own saver
    second, model = process(interrupt=False)  # the restarted process
    out = await second.ainvoke(None, cfg)
    assert out["answer"] == "Paris" and _kinds(out) == {"initial": 1, "branch": 2, "fill": 1}
    branch = next(t for t in out["trajectories"] if t["origin"]["kind"] == "branch")
    # the branch's prefix is the parent's, read back from the saver the first process wrote
    parent = next(t for t in out["trajectories"] if t["origin"]["kind"] == "initial")
    step = branch["origin"]["step"]
    assert [s["text"] for s in branch["steps"][:step]] == [s["text"] for s in parent["steps"][:step]]
    assert parent["thread_id"] in kept
    assert {t: len(saver.storage[t][""]) for t in kept} == kept  # the first wave did not run again


async def test_a_branch_whose_fork_point_an_in_memory_saver_lost_names_the_cause():
    """With an in-memory trajectory checkpointer of its own, a restarted process has lost the
    parents' checkpoints: the resumed branch must say so, not that a checkpoint is the wrong one."""
    from langgraph_parallelmuse.graph import build_parallelmuse_graph

    saver, cfg = InMemorySaver(), {"configurable": {"thread_id": "server-thread"}}

    def process(interrupt: bool):
        model = ScriptedChatModel(responder=research_responder(by_step()))
        graph = build_parallelmuse_graph(
            model, make_tools()[0], config={"n": 4, "m": 1, "k": 1, "t": 2}, trajectory_checkpointer=InMemorySaver()
        )
        return graph.compile(checkpointer=saver, interrupt_before=["branch_rollout"] if interrupt else None)

    await process(interrupt=True).ainvoke({"question": QUESTION}, cfg)
    with pytest.raises(ParallelMuseError, match="is not in the trajectory checkpointer: an in-memory saver lost it"):
        await process(interrupt=False).ainvoke(None, cfg)


def test_only_savers_known_to_take_any_thread_id_are_lent_to_the_trajectories():
    """LangGraph Platform's own saver keys checkpoints by the UUID threads its API made: a trajectory
    thread is kept out of it (and out of any saver not known to take it), in the runner's memory."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from langgraph_parallelmuse.agent import RolloutRunner, lend_checkpointer

    class PlatformSaver(BaseCheckpointSaver):  # stands in for a saver of unknown thread-id rules
        pass

    # langgraph-api wraps the app's own checkpointer (langgraph.json) in an adapter of this module.
    Adapter = type("_CustomCheckpointerAdapter", (BaseCheckpointSaver,), {"__module__": "langgraph_api._checkpointer"})

    def wrapped(inner):
        adapter = Adapter()
        adapter._inner = inner
        return adapter

    runner = RolloutRunner(ScriptedChatModel(), make_tools()[0])
    memory = InMemorySaver()
    for saver, lent in [
        (memory, True),
        (wrapped(memory), True),
        (PlatformSaver(), False),
        (wrapped(PlatformSaver()), False),
        (None, False),
    ]:
        with lend_checkpointer(runner, saver):
            assert (runner.saver is saver) is lent and (lent or runner.saver is runner.checkpointer)
    # A runner given its own checkpointer keeps it whatever a run lends; a run lends to its own runner
    # only (one a tool builds under a node keeps its memory: its threads could meet another question's).
    own = RolloutRunner(ScriptedChatModel(), make_tools()[0], checkpointer=InMemorySaver())
    other = RolloutRunner(ScriptedChatModel(), make_tools()[0])
    with lend_checkpointer(own, memory), lend_checkpointer(runner, memory):
        assert own.saver is own.checkpointer and other.saver is other.checkpointer and runner.saver is memory


def test_a_saver_bound_to_another_event_loop_is_not_lent():
    """The sync API runs the graph on a loop of its own: an async SQLite/Postgres saver opened on the
    caller's loop cannot be used there, so the trajectories keep the runner's memory, as before."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from langgraph_parallelmuse.agent import RolloutRunner, lend_checkpointer, lendable

    async def opened_here():
        async with AsyncSqliteSaver.from_conn_string(":memory:") as saver:
            assert lendable(saver)  # on its own loop
            return saver

    saver = asyncio.run(opened_here())
    runner = RolloutRunner(ScriptedChatModel(), make_tools()[0])

    async def on_another_loop():
        with lend_checkpointer(runner, saver):
            return runner.saver

    assert asyncio.run(on_another_loop()) is runner.checkpointer


async def test_a_graph_given_a_checkpointer_keeps_its_trajectories_there_and_shows_them_after_the_run():
    saver = InMemorySaver()
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, checkpointer=saver)
    out = await graph.ainvoke({"question": QUESTION}, {"configurable": {"thread_id": "th"}})
    runner = rollout_runner(graph)
    assert runner.checkpointer is saver
    thread = out["trajectories"][0]["thread_id"]
    history = [s async for s in runner.graph.aget_state_history({"configurable": {"thread_id": thread}})]
    assert history and thread in saver.storage  # the README's inspection, outside a run


async def test_a_graph_compiled_without_checkpoints_keeps_its_trajectories_out_of_its_parents_saver():
    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, checkpointer=False)
    saver = InMemorySaver()
    await _outer(graph, saver).ainvoke({"question": QUESTION}, {"configurable": {"thread_id": "parent"}})
    assert set(saver.storage) == {"parent"}
    assert rollout_runner(graph).checkpointer.storage  # its own memory


def test_a_sync_only_trajectory_checkpointer_is_refused_when_the_graph_is_built():
    """As langgraph's sync PostgresSaver: it has no async methods, and the base class's raise a bare
    NotImplementedError at the first checkpoint of the first run."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    class PostgresSaver(BaseCheckpointSaver):
        def get_tuple(self, config):
            return None

    with pytest.raises(ConfigError, match="PostgresSaver has no async methods: pass its async counterpart"):
        _graph({"n": 4, "m": 1, "k": 1, "t": 2}, trajectory_checkpointer=PostgresSaver())


# ----------------------------------------------------------------------------- what the factory takes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"model": "openai:gpt-4o-mini"},
            "model='openai:gpt-4o-mini' is a model name, not a model: pass a chat model object, e.g. "
            "init_chat_model('openai:gpt-4o-mini', logprobs=True, top_logprobs=16)",
        ),
        ({"model": None}, "model=None (NoneType) is not a chat model: pass a chat model object, e.g. init_chat_model("),
        (
            {"aggregator_model": "gpt-4o"},
            "aggregator_model='gpt-4o' is a model name, not a model: pass a chat model object, e.g. "
            "init_chat_model('gpt-4o')",
        ),
        ({"aggregator_model": object()}, "(object) is not a chat model"),
    ],
)
def test_a_model_that_is_no_chat_model_is_refused_when_the_graph_is_built(kwargs, message):
    """Before, the graph built: a model name or None then failed every run inside a node
    (AttributeError: 'str' object has no attribute 'name'), and an aggregator name made every run
    fall back to the majority vote, said only in stats.aggregate.error."""
    agent = ScriptedChatModel()
    with pytest.raises(InputError) as info:
        create_parallelmuse(**{"model": agent, **kwargs}, tools=make_tools()[0], config={"n": 2, "mode": "none"})
    assert message in str(info.value)
    assert agent.calls == []


@pytest.mark.parametrize("wrap", ["bind", "with_retry", "with_fallbacks"])
@pytest.mark.parametrize("which", ["model", "aggregator_model"])
async def test_runnables_wrapping_a_chat_model_are_still_taken(wrap, which):
    def wrapped() -> Any:
        model, spare = (ScriptedChatModel(responder=research_responder(by_step())) for _ in range(2))
        return {
            "bind": lambda: model.bind(stop=None),
            "with_retry": lambda: model.with_retry(stop_after_attempt=2),
            "with_fallbacks": lambda: model.with_fallbacks([spare]),
        }[wrap]()

    models = {"model": ScriptedChatModel(responder=research_responder(by_step())), which: wrapped()}
    graph = create_parallelmuse(tools=make_tools()[0], config={"n": 2, "mode": "none"}, **models)
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] == "Paris" and out["answer_source"] == "aggregator"
    assert [t["status"] for t in out["trajectories"]] == ["answered", "answered"]


def _undocumented(query: str) -> str:
    return "no results"


def test_tools_that_are_no_list_of_tools_are_refused_naming_the_fix():
    """Before: AttributeError ('tuple' object has no attribute 'name': a pydantic tool iterates over its
    fields) or one over each character of a string."""
    model, (search, visit) = ScriptedChatModel(), make_tools()[0]
    cases = [
        (search, "tools is one tool ('search'), not a list of tools: pass [search]"),
        ("search", "tools='search' (str) is not a list of tools: pass e.g. make_corpus_tools(index)"),
        ({"search": search}, "(dict) is not a list of tools"),
        ([search, "visit"], "tool 'visit' (str) is not a tool: wrap a function with @tool"),
        ([search, lambda doc: doc], "(function) is not a tool: wrap a function with @tool"),
        ([_undocumented, visit], "tool function '_undocumented' cannot be made a tool (Function must have a docstring"),
    ]
    for tools, message in cases:
        with pytest.raises(InputError) as info:
            create_parallelmuse(model, tools)
        assert message in str(info.value), tools
    assert model.calls == []


async def test_plain_functions_are_made_tools_as_tool_node_makes_them():
    """Before: AttributeError: 'function' object has no attribute 'name', at run time."""
    searched: list[str] = []

    async def search(query: str) -> str:
        """Search the web; returns result snippets with document titles."""
        searched.append(query)
        return f"Snippets for {query}: the capital of France is Paris."

    def visit(doc: str) -> str:
        """Open a document by title; returns its text."""
        return f"Document {doc}: Paris is the capital of France."

    model = ScriptedChatModel(responder=research_responder(by_step()))
    graph = create_parallelmuse(model, [search, visit], config={"n": 2, "mode": "none"})
    assert sorted(t.name for t in rollout_runner(graph).tools) == ["search", "visit"]
    out = await graph.ainvoke({"question": QUESTION})
    assert out["answer"] == "Paris" and searched == ["capital of France"] * 2
    observations = [o for t in out["trajectories"] for o in t["observations"]]
    assert any("Paris is the capital of France" in str(o) for o in observations)


# ----------------------------------------------------------------------------- early stop on plain sampling


def _floor_calibration(tmp_path) -> str:
    from langgraph_parallelmuse.calibration import Calibration

    regions = ("exploration", "reasoning", "all")
    cal = Calibration(
        "nll", 0.8, dict.fromkeys(regions, 1e9), {}, confidence_floor=1.0, confidence_window=4, top_logprobs=16
    )
    return str(cal.save(tmp_path / "floor.json"))


async def test_early_stop_stops_a_low_confidence_trajectory_of_plain_sampling(tmp_path):
    """Before, mode='none' with early_stop asked for a calibration, and with one refused it as needing
    a branching mode: DeepConf's own setting (plain sampling) could not be run."""
    runners = itertools.count()
    sure, unsure = -3.0, -0.02  # DeepConf's confidence is the negated mean top logprob: 3.0 and 0.02

    def agent(index, messages):
        if index == 0:
            me = next(runners)
            return Reply(call_text("search", f"runner {me}", query="capital"), logprob=unsure if me == 1 else sure)
        second = "runner 1" in " ".join(str(m.content) for m in messages)
        return Reply(answer_text("Lyon" if second else "Paris"), logprob=unsure if second else sure)

    model = ScriptedChatModel(responder=research_responder(agent))
    config = {"n": 3, "mode": "none", "early_stop": True, "calibration": _floor_calibration(tmp_path)}
    graph = create_parallelmuse(model, make_tools()[0], config=config)
    out = await graph.ainvoke({"question": QUESTION})
    assert sorted(t["status"] for t in out["trajectories"]) == ["answered", "answered", "stopped"]
    stopped = next(t for t in out["trajectories"] if t["status"] == "stopped")
    assert "< floor 1.000" in stopped["error"] and stopped["answer"] is None
    assert out["answer"] == "Paris" and stopped["id"] not in {r["trajectory_id"] for r in out["reports"]}


async def test_early_stop_on_plain_sampling_refuses_a_model_without_logprobs(tmp_path):
    # The agent checks logprobs only for a branching mode: early_stop would never stop anything.
    no_lp = lambda i, msgs: Reply(answer_text("Paris"), logprobs=False)  # noqa: E731
    config = {"n": 3, "mode": "none", "early_stop": True, "calibration": _floor_calibration(tmp_path)}
    graph, model, _ = _graph(config, agent=no_lp)
    with pytest.raises(MissingLogprobsError, match=r"no token logprobs, which early_stop reads.*early_stop=False"):
        await graph.ainvoke({"question": QUESTION})
    assert all(role_of(c["messages"]) == "agent" for c in model.calls)  # no report, no aggregation
    plain, _, _ = _graph({"n": 3, "mode": "none"}, agent=no_lp)  # without early_stop nothing reads them
    assert (await plain.ainvoke({"question": QUESTION}))["answer"] == "Paris"


# ----------------------------------------------------------------------------- the life of a run in a service


async def test_runs_nothing_can_resume_leave_no_trajectory_threads_in_the_runners_memory():
    """A service building the graph once and serving many questions without a checkpointer: every
    run's trajectory threads stayed in the runner's in-memory saver for the process's life (20 runs
    of N = 4: 80 threads, 1.5 MB). Finished, failed or cancelled, a run now takes them with it."""
    fail = {"on": False}

    def agent(index, messages):
        if fail["on"]:
            raise RuntimeError("server down")
        return STEPS[min(index, 2)]

    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, agent=agent)
    memory = rollout_runner(graph).checkpointer
    for _ in range(3):
        out = await graph.ainvoke({"question": QUESTION})
        # What the run returns is a copy: the trajectories keep their steps and fork points.
        assert out["answer"] == "Paris" and _kinds(out) == Counter({"initial": 1, "branch": 2, "fill": 1})
        assert all(t["steps"] and t["fork_points"] for t in out["trajectories"]) and not memory.storage
    assert (await asyncio.to_thread(graph.invoke, {"question": QUESTION}))["answer"] == "Paris"
    assert not memory.storage
    # A consumer that stops reading at the first finished trajectory, while the others run.
    async with contextlib.aclosing(graph.astream({"question": QUESTION}, stream_mode="custom")) as events:
        async for event in events:
            if event["event"] == "trajectory_finished":
                break
    assert not memory.storage
    fail["on"] = True
    with pytest.raises(ParallelMuseError, match="every trajectory failed") as failed:
        await graph.ainvoke({"question": QUESTION})
    assert len(failed.value.result["trajectories"]) == 4 and not memory.storage
    fail["on"] = False
    run = asyncio.create_task(graph.ainvoke({"question": QUESTION}, {"configurable": {"thread_id": "traced"}}))
    await cancel_when(run, lambda: memory.storage)
    assert not memory.storage


async def test_concurrent_runs_without_a_checkpointer_keep_each_others_trajectory_threads():
    # The fast run ends first and deletes its threads, not the slow one's: its branches fork from them.
    def agent(index, messages):
        slow = "Louvre" in str(messages[1].content)
        return Reply(STEPS[min(index, 2)].text, regions=STEPS[min(index, 2)].regions, delay=0.05 if slow else 0)

    graph, _, _ = _graph({"n": 4, "m": 1, "k": 1, "t": 2}, agent=agent)
    slow, fast = await asyncio.gather(
        graph.ainvoke({"question": "Where is the Louvre?"}), graph.ainvoke({"question": QUESTION})
    )
    for out in (slow, fast):
        assert _kinds(out) == Counter({"initial": 1, "branch": 2, "fill": 1})
        assert all(t["status"] == "answered" for t in out["trajectories"])
    assert not rollout_runner(graph).checkpointer.storage


async def test_a_trajectory_checkpointer_given_by_the_user_keeps_the_threads_of_runs_without_a_thread():
    # A guard: a run without a thread deletes its trajectory threads, but not from a saver the user gave.
    saver = InMemorySaver()
    graph, _, _ = _graph({"n": 2, "mode": "none"}, trajectory_checkpointer=saver)
    out = await graph.ainvoke({"question": QUESTION})
    assert {t["thread_id"] for t in out["trajectories"]} == set(saver.storage)


def _held_search() -> tuple[list, dict, asyncio.Event]:
    """Tools whose search waits for the event: a run holds its thread as long as the test wants."""
    release = asyncio.Event()

    async def search(query: str) -> str:
        await release.wait()
        return "Paris is the capital of France."

    tools, calls = make_tools(search=search)
    return tools, calls, release


async def test_a_second_run_on_a_thread_that_is_running_is_refused_before_it_writes_anything(monkeypatch):
    """Two runs on one thread at once interleaved its checkpoints, with no error: each returned its
    answer, and the chat thread kept only the later run's turn."""
    from langgraph_parallelmuse.nodes import BUSY_THREADS

    monkeypatch.setattr(BUSY_THREADS, "GRACE_SECONDS", 0.0)
    tools, calls, release = _held_search()
    agent = lambda i, messages: STEPS[0] if i == 0 else answer_text("Paris")  # noqa: E731
    saver, config = InMemorySaver(), {"n": 2, "mode": "none", "aggregation": "majority"}
    graph, model, _ = _graph(config, agent=agent, tools=(tools, calls), checkpointer=saver)
    chat: dict[str, Any] = {"configurable": {"thread_id": "chat"}}
    first = asyncio.create_task(graph.ainvoke({"messages": [HumanMessage(QUESTION)]}, chat))
    while not calls["search"]:
        await asyncio.sleep(0.005)
    made = len(model.calls)
    refused = r"thread 'chat' is running another ParallelMuse run .*InMemorySaver.*wait for that run to end"
    with pytest.raises(ThreadBusyError, match=refused):
        await graph.ainvoke({"messages": [HumanMessage("Where is the Louvre?")]}, chat)
    with pytest.raises(ThreadBusyError, match=refused):  # the sync API too
        await asyncio.to_thread(graph.invoke, {"question": "Where is the Louvre?"}, chat)
    inputs = [s async for s in graph.aget_state_history(chat) if s.metadata["source"] == "input"]
    assert len(model.calls) == made and len(inputs) == 1  # nothing of the refused runs
    # The same thread of another saver runs meanwhile (another question: a graph alike in every part
    # asking the same one would share the trajectory threads' names, and wait for them).
    other, _, _ = _graph(config, checkpointer=InMemorySaver())
    assert (await other.ainvoke({"question": "Where is the Louvre?"}, chat))["answer"] == "Paris"
    release.set()
    assert (await first)["answer"] == "Paris"
    out = await graph.ainvoke({"messages": [HumanMessage("Where is the Louvre?")]}, chat)  # the hold ended
    assert [m.content for m in out["messages"]] == [QUESTION, "Paris", "Where is the Louvre?", "Paris"]


async def test_a_run_started_while_the_cancelled_run_on_its_thread_unwinds_waits_for_it(monkeypatch):
    """LangGraph Server's interrupt and rollback strategies cancel the running run and start the next
    one at once: the next one waits for the first to let go of the thread, it is not refused."""
    from langgraph_parallelmuse.nodes import BUSY_THREADS

    monkeypatch.setattr(BUSY_THREADS, "GRACE_SECONDS", 0.0)  # only a holder being cancelled is waited for
    cancelled = asyncio.Event()

    async def search(query: str) -> str:
        if cancelled.is_set():
            return "Paris is the capital of France."
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # a slow unwind: a connection closed, a checkpoint written
            raise
        return "unreachable"

    tools, calls = make_tools(search=search)
    agent = lambda i, messages: STEPS[0] if i == 0 else answer_text("Paris")  # noqa: E731
    config = {"n": 2, "mode": "none", "aggregation": "majority"}
    graph, model, _ = _graph(config, agent=agent, tools=(tools, calls), checkpointer=InMemorySaver())
    chat: dict[str, Any] = {"configurable": {"thread_id": "chat"}}
    first = asyncio.create_task(graph.ainvoke({"question": QUESTION}, chat))
    while not calls["search"]:
        await asyncio.sleep(0.005)
    cancelled.set()
    first.cancel()
    second = asyncio.create_task(graph.ainvoke({"question": "Where is the Louvre?"}, chat))
    made = len(model.calls)
    await asyncio.sleep(0.1)
    assert not first.done() and len(model.calls) == made  # the second waits while the first unwinds
    assert (await second)["answer"] == "Paris" and first.cancelled()


async def test_runs_one_parent_node_awaits_together_under_its_checkpointer_both_answer(monkeypatch):
    """LangGraph runs each graph a node awaits in a namespace of its own (the task's, numbered): the
    second of two such runs was refused as a run on the parent's busy thread."""
    from langgraph_parallelmuse.nodes import BUSY_THREADS

    monkeypatch.setattr(BUSY_THREADS, "GRACE_SECONDS", 0.0)
    graph, _, _ = _graph({"n": 2, "mode": "none"})

    async def ask_both(state: MessagesState) -> dict:
        outs = await asyncio.gather(*(graph.ainvoke({"question": q}) for q in (QUESTION, "Where is the Louvre?")))
        return {"messages": [AIMessage(out["answer"]) for out in outs]}

    parent = StateGraph(MessagesState).add_node("ask", ask_both).add_edge(START, "ask")
    parent = parent.compile(checkpointer=InMemorySaver())
    out = await parent.ainvoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "parent"}})
    assert [m.content for m in out["messages"][1:]] == ["Paris", "Paris"]


async def test_a_thread_id_given_outside_configurable_is_held_too(monkeypatch):
    # LangGraph reads a config's keys it does not know as configurable ones: the run is on that thread.
    from langgraph_parallelmuse.nodes import BUSY_THREADS

    monkeypatch.setattr(BUSY_THREADS, "GRACE_SECONDS", 0.0)
    tools, calls, release = _held_search()
    graph, _, _ = _graph({"n": 2, "mode": "none"}, tools=(tools, calls), checkpointer=InMemorySaver())
    first = asyncio.create_task(graph.ainvoke({"question": QUESTION}, {"thread_id": "chat"}))
    while not calls["search"]:
        await asyncio.sleep(0.005)
    with pytest.raises(ThreadBusyError, match="thread 'chat'"):
        await graph.ainvoke({"question": "Where is the Louvre?"}, {"configurable": {"thread_id": "chat"}})
    release.set()
    assert (await first)["answer"] == "Paris"


def test_the_compiled_graph_keeps_what_compile_sets(monkeypatch):
    # A guard: the compiled graph's class is changed in place, a copy through the constructor lost the
    # strict-msgpack allowlist compile builds for the graph's own state types.
    from langgraph._internal import _serde

    monkeypatch.setattr(_serde, "STRICT_MSGPACK_ENABLED", True)
    graph, _, _ = _graph({"n": 2, "mode": "none"})
    plain = StateGraph.compile(graph.builder)
    assert graph._serde_allowlist and graph._serde_allowlist == plain._serde_allowlist
    assert vars(graph).keys() == vars(plain).keys()


async def test_a_run_read_one_chunk_a_task_is_not_taken_for_a_cancelled_one(monkeypatch):
    """langgraph-api (and asyncio.wait_for) reads each chunk in a task of its own: the task that took
    the thread finished at the first chunk, and a second run on the thread waited for the running one
    (up to UNWIND_SECONDS), as if it were cancelled, then ran."""
    from langgraph_parallelmuse.nodes import BUSY_THREADS

    monkeypatch.setattr(BUSY_THREADS, "GRACE_SECONDS", 0.0)
    tools, calls, release = _held_search()
    graph, _, _ = _graph({"n": 2, "mode": "none"}, tools=(tools, calls), checkpointer=InMemorySaver())
    chat: dict[str, Any] = {"configurable": {"thread_id": "chat"}}

    async def read_one_chunk_a_task() -> None:
        async with contextlib.aclosing(graph.astream({"question": QUESTION}, chat)) as chunks:
            with contextlib.suppress(StopAsyncIteration):
                while True:
                    await asyncio.create_task(anext(chunks))

    first = asyncio.create_task(read_one_chunk_a_task())
    while not calls["search"]:
        await asyncio.sleep(0.005)
    asyncio.get_running_loop().call_later(0.5, release.set)  # the first run ends after a while
    with pytest.raises(ThreadBusyError, match="thread 'chat'"):
        await graph.ainvoke({"question": "Where is the Louvre?"}, chat)
    assert not first.done()
    await first


@dataclass(eq=True)
class _EqualitySaver(InMemorySaver):
    """A saver class with ``__eq__`` and so no ``__hash__`` (a dataclass; a pydantic model is the same)."""

    def __post_init__(self) -> None:
        InMemorySaver.__init__(self)


async def test_a_run_on_a_saver_that_cannot_be_hashed_answers():
    # The thread's hold was keyed by the saver itself: every run on such a saver raised "TypeError:
    # unhashable type" before it started (it ran before the holds).
    graph, _, _ = _graph({"n": 2, "mode": "none"}, checkpointer=_EqualitySaver())
    out = await graph.ainvoke({"question": QUESTION}, {"configurable": {"thread_id": "t1"}})
    assert out["answer"] == "Paris"
